"""Where the parser stands: learned from the stream tail, reported to meta's cursor bucket.

The stream is the cursor: on start the parser reads the last message of BINLAKE_RAW and
resumes right after it (or, when it ends mid-transaction, at that transaction's start while
skipping the batches already there). The cursor bucket only mirrors the last fully published
transaction for `binlake status`, lag and rewind; writes to it are compare-and-set and never
move it backwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from services.parser.transactions import Outgoing, Resume, SkipMark
from shared import envelope
from shared.actor import Latest, raise_if_cancelled
from shared.errors import NatsUnavailable, StreamMismatch
from shared.jetstream import header, last_msg, nats_errors
from shared.metrics import Registry
from shared.subjects import Names


@dataclass(frozen=True)
class Tail:
    """What the stream already holds for this source."""

    resume: Resume
    skip: SkipMark | None
    last_id: str


async def read_tail(js: JetStreamContext, names: Names, source: str) -> Tail | None:
    msg = await last_msg(js, names.raw_stream, f"{names.prefix}.raw.>")
    if msg is None or msg.data is None:
        return None
    try:
        env = envelope.decode(msg.data)
    except envelope.EnvelopeError as exc:
        raise StreamMismatch(
            f"the last message of {names.raw_stream} (seq {msg.seq}, {msg.subject}) is not a binlake envelope "
            f"({exc}); only the parser may write to the raw stream: remove that message "
            f"(nats stream rmm {names.raw_stream} {msg.seq}) and restart"
        ) from None
    if env["source"] != source:
        raise StreamMismatch(
            f"{names.raw_stream} ends with a message of source {env['source']!r}, this parser reads {source!r}; "
            "give every source its own prefix (BINLAKE_PREFIX)"
        )
    mid = header(msg, "Nats-Msg-Id") or ""
    txn = env["txn"]
    resume = Resume.from_dict(env["resume"])
    skip = None if txn["last"] else SkipMark(txn["id"], txn["i"])
    return Tail(resume, skip, mid)


def cursor_key(source: str) -> str:
    return f"parser.{source}"


class PositionReporter:
    """Actor: mirrors the newest acked transaction boundary into the cursor bucket."""

    def __init__(self, kv: KeyValue, source: str, progress: Latest[Outgoing], registry: Registry,
                 interval_s: float = 1.0) -> None:
        self._kv = kv
        self._key = cursor_key(source)
        self._source = source
        self._progress = progress
        self._interval = interval_s
        self._revision: int | None = None
        self._log = structlog.get_logger().bind(actor="position")
        self._lag = registry.gauge("parser_lag_seconds", "Seconds between a change's commit and its ack by JetStream")
        self._scn = registry.gauge("parser_scn", "Order key (file number << 32 | offset) of the last published txn")
        self._reported = registry.counter("parser_position_reports_total", "Cursor writes to the meta bucket")

    async def run(self) -> None:
        last_written: Resume | None = None
        while True:
            msg = await self._progress.get()
            now_ms = int(time.time() * 1000)
            self._lag.set(max(0.0, (now_ms - msg.ts) / 1000.0))
            if msg.resume != last_written:
                try:
                    await self._write(msg, now_ms)
                    raise_if_cancelled()
                    last_written = msg.resume
                except NatsUnavailable as exc:
                    # The cursor only mirrors the stream (the parser resumes from the stream
                    # itself); keep publishing and write it again when NATS is back.
                    self._log.warning("position.report_failed", error=str(exc))
            await self._sleep()

    async def _sleep(self) -> None:
        await asyncio.sleep(self._interval)

    async def _write(self, msg: Outgoing, now_ms: int) -> None:
        r = msg.resume
        scn = envelope.scn(r.file, r.offset)
        value = json.dumps({"source": self._source, "file": r.file, "offset": r.offset, "gtid": r.gtid,
                            "scn": scn, "ts": msg.ts, "lag_ms": max(0, now_ms - msg.ts),
                            "updated_ms": now_ms}).encode()
        with nats_errors("cursor write"):
            for _ in range(3):
                try:
                    if self._revision is None:
                        self._revision = await self._kv.create(self._key, value)
                    else:
                        self._revision = await self._kv.update(self._key, value, last=self._revision)
                    self._scn.set(scn)
                    self._reported.inc()
                    return
                except nats.js.errors.KeyWrongLastSequenceError:
                    entry = await self._kv.get(self._key)
                    stored = json.loads(entry.value or b"{}")
                    if int(stored.get("scn", 0)) > scn:
                        return  # someone wrote a newer position; never move it back
                    self._revision = entry.revision
        raise NatsUnavailable(f"cursor {self._key} kept changing under concurrent writers")

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
from shared import cas, envelope, keys, kv_values
from shared.actor import Latest, raise_if_cancelled
from shared.errors import NatsUnavailable, StreamMismatch
from shared.jetstream import TRANSIENT, header, last_msg
from shared.metrics import Registry
from shared.subjects import Names


@dataclass(frozen=True)
class Tail:
    """What the stream already holds for this source."""

    resume: Resume
    skip: SkipMark | None
    last_id: str


async def read_tail(js: JetStreamContext, names: Names, source: str) -> Tail | None:
    msg = await last_msg(js, names.raw_stream, names.raw_all)
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
    try:
        resume, skip = _resume_of(envelope.as_dict(env))
    except (KeyError, TypeError, ValueError) as exc:
        raise StreamMismatch(
            f"the last message of {names.raw_stream} (seq {msg.seq}, {msg.subject}) does not say where to resume "
            f"({exc!r}), so the parser did not write it; only the parser may write to the raw stream: remove "
            f"that message (nats stream rmm {names.raw_stream} {msg.seq}) and restart"
        ) from None
    return Tail(resume, skip, mid)


async def last_order(js: JetStreamContext, names: Names, subject: str) -> tuple[int, int] | None:
    """The order key (scn, chunk) of the last message BINLAKE_RAW holds for the raw subject `subject`."""
    msg = await last_msg(js, names.raw_stream, names.raw_stored_filter(subject))
    if msg is None or msg.data is None:
        return None
    try:
        env = envelope.decode(msg.data)
        return int(env["scn"]), int(env.get("chunk") or 0)
    except (envelope.EnvelopeError, KeyError, TypeError, ValueError) as exc:
        raise StreamMismatch(
            f"the last message of {msg.subject} in {names.raw_stream} (seq {msg.seq}) has no order key ({exc!r}); "
            f"only the parser may write to the raw stream: remove that message (nats stream rmm {names.raw_stream} "
            f"{msg.seq}) and restart") from None


def _resume_of(env: dict[str, object]) -> tuple[Resume, SkipMark | None]:
    """The resume point and skip mark of a parser's envelope, each field checked."""
    resume, txn = env["resume"], env["txn"]
    if not isinstance(resume, dict) or not isinstance(txn, dict):
        raise TypeError("resume and txn must be maps")
    file, offset, gtid = resume["file"], resume["offset"], resume.get("gtid")
    if not isinstance(file, str) or not file or isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"resume {resume!r} is no binlog position")
    if gtid is not None and not isinstance(gtid, str):
        raise TypeError(f"resume gtid {gtid!r} is not text")
    server, epoch, uuid = resume.get("server"), resume.get("epoch", 0), resume.get("uuid")
    if uuid is not None and not isinstance(uuid, str):
        raise TypeError(f"resume uuid {uuid!r} is not text")
    if (server is not None and (isinstance(server, bool) or not isinstance(server, int))) or isinstance(
            epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= envelope.MAX_EPOCH:
        raise TypeError(f"resume server {server!r} or epoch {epoch!r} is not a server id and an epoch")
    envelope.binlog_number(file)  # a binlog file name ends in its number
    last, txn_id, i = txn["last"], txn.get("id"), txn.get("i")
    if not isinstance(last, bool):
        raise TypeError(f"txn.last {last!r} is not a bool")
    if last:
        return Resume(file, offset, gtid, server, epoch, uuid), None
    if not isinstance(txn_id, str) or isinstance(i, bool) or not isinstance(i, int):
        raise TypeError(f"txn {txn!r} of an unfinished transaction lacks its id or index")
    return Resume(file, offset, gtid, server, epoch, uuid), SkipMark(txn_id, i)


async def saved_position(kv: KeyValue, source: str) -> Resume | None:
    """The last transaction boundary the reporter saved (None when it never wrote one).

    What a parser resumes from when BINLAKE_RAW is empty although it published before
    (retention or a purge removed the messages, or the stream was recreated): starting at
    the source's current position instead would silently skip everything in between.
    """
    try:
        entry = await kv.get(keys.parser_cursor(source))
    except nats.js.errors.KeyNotFoundError:
        return None
    except TRANSIENT as exc:
        raise NatsUnavailable(f"parser cursor: {exc!r}") from exc
    saved = kv_values.load_json(entry.value, keys.parser_cursor(source))  # a relayed server reply halts here
    try:
        server, epoch = saved.get("server"), int(saved.get("epoch") or 0)
        if not 0 <= epoch <= envelope.MAX_EPOCH:
            raise ValueError(f"epoch {epoch} out of range")
        gtid, uuid = saved.get("gtid"), saved.get("uuid")
        return Resume(str(saved["file"]), int(saved["offset"]), None if gtid is None else str(gtid),
                      None if server is None else int(server), epoch, None if uuid is None else str(uuid))
    except (ValueError, KeyError, TypeError) as exc:
        raise StreamMismatch(
            f"the saved parser position {keys.parser_cursor(source)!r} is unreadable ({exc!r}); only the parser "
            "writes it: delete the key to start at BINLAKE_START, or restore it") from None


class PositionReporter:
    """Actor: mirrors the newest acked transaction boundary into the cursor bucket."""

    def __init__(self, kv: KeyValue, source: str, progress: Latest[Outgoing], registry: Registry,
                 interval_s: float = 1.0) -> None:
        self._kv = kv
        self._key = keys.parser_cursor(source)
        self._source = source
        self._progress = progress
        self._interval = interval_s
        self._revision: int | None = None
        self._log = structlog.get_logger().bind(actor="position")
        self._lag = registry.gauge("parser_lag_seconds", "Seconds between a change's commit and its ack by JetStream")
        self._scn = registry.gauge("parser_scn",
                                   "Order key (epoch << 56 | file number << 32 | offset) of the last published txn")
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
        scn = envelope.scn(r.file, r.offset, r.epoch)
        value = json.dumps({"source": self._source, "file": r.file, "offset": r.offset, "gtid": r.gtid,
                            "server": r.server, "uuid": r.uuid, "epoch": r.epoch, "scn": scn, "ts": msg.ts,
                            "lag_ms": max(0, now_ms - msg.ts), "updated_ms": now_ms}).encode()
        written = await cas.write_forward(
            self._kv, self._key, value, self._revision,
            lambda stored: int(kv_values.load_json(stored, self._key).get("scn", 0)) > scn)
        self._revision = written.revision
        if written.stored:
            self._scn.set(scn)
            self._reported.inc()

"""Actor for one raw partition: read in order, filter/reshape, publish fenced, advance the cursor.

The cursor (`sink.<source>.p<P>` in the cursors bucket) is the last raw sequence whose
message is handled: published, already present, or filtered. It only moves forward
(compare-and-set), and only after every publish before it was acknowledged. A message that
cannot be processed goes to the dead-letter subject with its reason and halts the
partition: nothing after it is handled until an operator fixes the cause and restarts.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from services.sink.fence import Out, SubjectFence
from services.sink.rules import Rules, TableRules
from shared import cas, envelope, jetstream, keys
from shared.errors import FatalError, NatsUnavailable
from shared.metrics import Registry
from shared.ordered_reader import OrderedReader
from shared.subjects import Names

DROPPED_HEADERS = ("Nats-Expected-Last-Msg-Id",)


class PartitionHalted(FatalError):
    """A poisoned message stopped this partition; it is in the dead-letter stream."""


@dataclass(frozen=True)
class PartitionSettings:
    source: str
    partition: int
    batch: int
    cursor_interval_s: float
    publish_timeout_s: float


class PartitionWorker:
    def __init__(self, js: JetStreamContext, names: Names, cursors: KeyValue, rules: Rules,
                 settings: PartitionSettings, registry: Registry) -> None:
        self._js = js
        self._names = names
        self._cursors = cursors
        self._rules = rules
        self._s = settings
        self._key = keys.partition_cursor(settings.source, settings.partition)
        self._table_rules: dict[tuple[str, str], tuple[bool, TableRules]] = {}
        self._cursor = 0
        self._committed = -1
        self._revision: int | None = None
        self._committed_at = 0.0
        p = str(settings.partition)
        self._p = p
        self._in = registry.counter("sink_events_in_total", "Raw events read")
        self._out = registry.counter("sink_events_out_total", "Events published to BINLAKE_CDC")
        self._filtered = registry.counter("sink_events_filtered_total", "Events dropped by filters")
        self._skipped = registry.counter("sink_events_present_total", "Replayed events already in BINLAKE_CDC")
        self._lag = registry.gauge("sink_partition_lag", "Raw messages not yet handled, per partition")
        self._dlq = registry.counter("sink_dead_letters_total", "Events sent to the dead-letter subject")
        self.log = structlog.get_logger().bind(actor=f"partition.{p}")

    async def run(self) -> None:
        await self._load_cursor()
        reader = OrderedReader(self._js, self._names.raw_stream,
                           self._names.raw_partition_filter(self._s.source, self._s.partition),
                           self._cursor + 1, self._s.batch)
        fence = SubjectFence(self._js, self._names.cdc_stream, self._s.publish_timeout_s,
                             atomic=await jetstream.allows_atomic(self._js, self._names.cdc_stream))
        self.log.info("partition.start", cursor=self._cursor, atomic_batches=fence.atomic)
        try:
            while True:
                msgs = await reader.fetch(wait_s=0.5)
                if msgs:
                    await self._handle(msgs, fence)
                self._lag.set(reader.pending, partition=self._p)
                if time.monotonic() - self._committed_at >= self._s.cursor_interval_s:
                    await self._commit()
        finally:
            await reader.close()
            if self._revision is not None:
                try:
                    await asyncio.shield(self._commit())
                except Exception as exc:  # the next owner replays from the older cursor; fenced
                    self.log.warning("partition.final_commit_failed", error=repr(exc))

    async def _handle(self, msgs: list[Msg], fence: SubjectFence) -> None:
        outs: list[Out] = []
        poison: tuple[Msg, str] | None = None
        last_ok = self._cursor
        for m in msgs:
            seq = m.metadata.sequence.stream
            try:
                out = self._transform(m, seq)
            except envelope.EnvelopeError as exc:
                poison = (m, str(exc))
                break
            if out is not None:
                outs.append(out)
            last_ok = seq
        self._in.inc(len(msgs) if poison is None else msgs.index(poison[0]) + 1, partition=self._p)
        await self._publish(outs, fence)
        self._cursor = last_ok
        if poison is not None:
            await self._commit()
            await self._dead_letter(*poison)

    def _transform(self, m: Msg, seq: int) -> Out | None:
        # Fully decoded even when only routed: what reaches BINLAKE_CDC is a valid envelope, its
        # strings valid UTF-8 (a check that skipping the rows would lose).
        env = envelope.as_dict(envelope.decode(m.data))
        db, table = env.get("db"), env.get("table")
        data = m.data
        shaped: dict[str, Any] | None = env
        if table is not None and env["op"] != "hb":
            allowed, table_rules = self._rules_for(db or "", table)
            if not allowed:
                self._filtered.inc(partition=self._p)
                return None
            shaped = self._rules.apply(env, table_rules)
            if shaped is None:
                self._filtered.inc(partition=self._p)
                return None
        headers = {k: v for k, v in (m.headers or {}).items() if k not in DROPPED_HEADERS}
        if shaped is not env and shaped is not None:
            data = envelope.encode(shaped)
            schema_id = envelope.schema_id_of(shaped)
            if schema_id:
                headers["Binlake-Schema"] = schema_id
        return Out(self._names.cdc_from_raw_stored(m.subject), data, headers, seq)

    def _rules_for(self, db: str, table: str) -> tuple[bool, TableRules]:
        cached = self._table_rules.get((db, table))
        if cached is None:
            cached = (self._rules.table_allowed(db, table), self._rules.for_table(db, table))
            self._table_rules[(db, table)] = cached
        return cached

    async def _publish(self, outs: list[Out], fence: SubjectFence) -> None:
        stored = await fence.publish_all(outs)
        self._out.inc(stored, partition=self._p)
        self._skipped.inc(len(outs) - stored, partition=self._p)

    async def _dead_letter(self, m: Msg, reason: str) -> None:
        seq = m.metadata.sequence.stream
        headers = {"Nats-Msg-Id": f"dlq:{self._s.partition}:{seq}", "Binlake-Dlq-Reason": reason,
                   "Binlake-Raw-Seq": str(seq), "Binlake-Raw-Subject": m.subject,
                   "Binlake-Partition": str(self._s.partition)}
        try:
            await self._js.publish(self._names.dlq(self._s.source), m.data or b"", headers=headers,
                                   timeout=self._s.publish_timeout_s)
        except (nats.errors.Error, TimeoutError) as exc:
            raise NatsUnavailable(f"cannot write the dead letter for raw seq {seq}: {exc!r}") from exc
        self._dlq.inc(partition=self._p)
        self.log.error("partition.halted", raw_seq=seq, subject=m.subject, reason=reason)
        raise PartitionHalted(f"partition {self._s.partition} stopped at raw seq {seq}: {reason}")

    async def _load_cursor(self) -> None:
        try:
            entry = await self._cursors.get(self._key)
        except nats.js.errors.KeyNotFoundError:
            self._cursor, self._revision = 0, None
            return
        self._cursor = self._committed = int(json.loads(entry.value or b"{}").get("seq", 0))
        self._revision = entry.revision

    async def _commit(self) -> None:
        self._committed_at = time.monotonic()
        if self._cursor == self._committed:
            return
        value = json.dumps({"seq": self._cursor, "updated_ms": int(time.time() * 1000)}).encode()
        cursor = self._cursor
        try:
            written = await cas.write_forward(self._cursors, self._key, value, self._revision,
                                              lambda stored: int(json.loads(stored or b"{}").get("seq", 0)) >= cursor)
        except nats.errors.Error as exc:
            raise NatsUnavailable(f"cursor {self._key}: {exc!r}") from exc
        self._revision = written.revision
        if written.stored:
            self._committed = cursor

"""Actor for one raw partition: read in order, filter/reshape, publish fenced, advance the cursor.

The cursor (`sink.<source>.p<P>` in the cursors bucket) is the last raw sequence whose
message is handled: published, already present, or filtered. It only moves forward
(compare-and-set), and only after every publish before it was acknowledged. A message that
cannot be processed goes to the dead-letter subject with its reason and halts the
partition: nothing after it is handled until an operator fixes the cause and restarts.

The cursor names the BINLAKE_RAW it counts in (`stream_id`, `shared.jetstream.StreamIdentity`).
A stream deleted and defined again starts its sequences at 1: a partition whose cursor names
another stream, or lies past the stream's end, halts (at start and at every cursor commit)
until an operator resumes it deliberately (`binlake rewind --sink-partition P --to-start`).

Retention never skips silently. A partition's messages are a sparse subset of BINLAKE_RAW,
so a jump in stream sequences is normal; whether the stream's limits removed messages inside
a jump shows in its first sequence. Before a cursor that passed a jump is written, the stream
must still start at or before the position the jump began at, or the partition halts with
the gap named. The cursor also records `seen`: the stream position up to which an idle
partition had nothing left, so an idle partition's old cursor is no false alarm.
"""

from __future__ import annotations

import asyncio
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
from shared import cas, envelope, jetstream, keys, objects
from shared.errors import FatalError, NatsUnavailable, StreamRedefined
from shared.health import Conditions
from shared.jetstream import store_full
from shared.metrics import Registry
from shared.ordered_reader import OrderedReader
from shared.partition_cursor import PartitionCursor
from shared.subjects import INTERNAL_TOKEN, Names

DROPPED_HEADERS = ("Nats-Expected-Last-Msg-Id",)
HEADER_ALLOWANCE = 4096  # room in max_payload for the headers the fence adds
SEEN_EVERY = 10  # cursor intervals between an idle partition's records of how far nothing of it is left


class PartitionHalted(FatalError):
    """A poisoned message or a retention gap stopped this partition."""


@dataclass(frozen=True)
class PartitionSettings:
    source: str
    partition: int
    batch: int
    cursor_interval_s: float
    publish_timeout_s: float
    fetch_bytes: int | None = None


class PartitionWorker:
    def __init__(self, js: JetStreamContext, names: Names, cursors: KeyValue, rules: Rules,
                 settings: PartitionSettings, registry: Registry, conditions: Conditions | None = None) -> None:
        self._js = js
        self._conditions = conditions
        self._names = names
        self._cursors = cursors
        self._rules = rules
        self._s = settings
        self._key = keys.partition_cursor(settings.source, settings.partition)
        self._table_rules: dict[tuple[str, str], tuple[bool, TableRules]] = {}
        self._checked_schemas: set[str] = set()
        self._decoder = envelope.Decoder()
        self._cursor = 0
        self._stream_id = ""  # the identity of the BINLAKE_RAW the cursor counts in
        self._seen = 0  # every message of this partition up to this raw sequence is handled
        self._unverified: int | None = None  # where a jump not yet checked against retention began
        self._reader: OrderedReader | None = None
        self._seen_at = 0.0
        self._committed = -1
        self._committed_seen = 0
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
        self._unknown_columns = registry.counter("sink_rule_columns_missing_total",
                                                 "Columns named by rules that a table's schema lacks")
        self._objects_in = registry.counter("sink_objects_total", "Raw messages read from an object (too large)")
        self._redefined = registry.counter("sink_stream_redefined_total",
                                           "Partitions halted: BINLAKE_RAW was defined again since their cursor")
        self._gaps = registry.counter("sink_retention_gaps_total", "Raw messages removed before the sink read them")
        self.log = structlog.get_logger().bind(actor=f"partition.{p}")

    async def run(self) -> None:
        await self._load_cursor()
        self._check_stream(await jetstream.stream_identity(self._js, self._names.raw_stream))
        if self._handled > 0:  # a partition that never handled anything starts where the stream starts
            self._unverified = self._handled
            await self._verify()
        reader = self._reader = OrderedReader(self._js, self._names.raw_stream,
                                              self._names.raw_partition_filter(self._s.source, self._s.partition),
                                              self._cursor + 1, self._s.batch, max_bytes=self._s.fetch_bytes)
        fence = SubjectFence(self._js, self._names.cdc_stream, self._s.publish_timeout_s, self._stream_id,
                             atomic=await jetstream.allows_atomic(self._js, self._names.cdc_stream),
                             conditions=self._conditions)
        self.log.debug("partition.start", cursor=self._cursor, atomic_batches=fence.atomic)  # sink.rebalance sums up
        try:
            opens = 0
            while True:
                msgs = await reader.fetch(wait_s=0.5)
                if reader.opens != opens:  # a new consumer: it may be on a stream defined again since
                    self._check_stream(await jetstream.stream_identity(self._js, self._names.raw_stream))
                    opens = reader.opens
                if msgs:
                    await self._handle(msgs, fence)
                self._lag.set(reader.pending, partition=self._p)
                if time.monotonic() - self._committed_at >= self._s.cursor_interval_s:
                    await self._commit()
        finally:
            await reader.close()
            if self._revision is not None:
                try:
                    await asyncio.shield(self._commit(final=True))
                except Exception as exc:  # the next owner replays from the older cursor; fenced
                    self.log.warning("partition.final_commit_failed", error=repr(exc))

    async def _handle(self, msgs: list[Msg], fence: SubjectFence) -> None:
        outs: list[Out] = []
        poison: tuple[Msg, str] | None = None
        last_ok = self._cursor
        first = msgs[0].metadata.sequence.stream
        # A partition that never handled anything starts wherever the stream starts.
        if self._unverified is None and self._handled > 0 and first > self._handled + 1:
            self._unverified = self._handled  # other partitions' messages, or removed ones: _verify tells
        for m in msgs:
            seq = m.metadata.sequence.stream
            try:
                if m.headers and objects.HEADER in m.headers:
                    self._objects_in.inc(partition=self._p)
                    out = self._transform(m, await objects.resolve(self._js, m.data, self._names.raw_objects_bucket),
                                          seq, resolved=True)
                else:
                    out = self._transform(m, m.data, seq)
                if out is not None and len(out.data) > self._js._nc.max_payload - HEADER_ALLOWANCE:
                    out = await self._to_object(out)
            except (envelope.EnvelopeError, objects.ObjectMissing) as exc:
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

    def _marker(self, env: dict[str, Any], seq: int) -> Out | None:
        """What stands in BINLAKE_CDC for a message the rules filtered out: a heartbeat-shaped marker
        with its transaction's `Binlake-Txn` on this partition's own internal subject, so that the
        store still sees every message of a transaction and can hand out whole transactions."""
        txn = envelope.txn_header(env)
        if txn is None:
            return None
        marker = {"v": envelope.VERSION, "source": self._s.source, "db": None, "table": None, "op": "hb",
                  "ts": env.get("ts"), "pos": {"file": "", "offset": 0, "gtid": None}, "scn": env.get("scn"),
                  "chunk": 0, "txn": {"id": None, "i": 0, "last": True}}
        subject = self._names.cdc_internal(self._s.source, f"filtered-p{self._p}")
        return Out(subject, envelope.encode(marker), {envelope.TXN_HEADER: txn,
                                                     "Nats-Msg-Id": f"{self._s.source}:filtered:{seq}"}, seq)

    async def _to_object(self, out: Out) -> Out:
        """A message too large for BINLAKE_CDC (a row, or what masks made of it): its envelope into
        the CDC objects bucket, a reference in the stream."""
        mid = out.headers.get("Nats-Msg-Id") or f"{self._s.source}:raw{out.raw_seq}"
        ref = objects.Ref.of_data(self._names.cdc_objects_bucket, mid, out.data)
        await objects.put(self._js, ref, out.data)
        ref_env = objects.referring(envelope.as_dict(envelope.decode(out.data)), ref)
        return Out(out.subject, envelope.encode(ref_env), {**out.headers, objects.HEADER: f"{ref.bucket}/{ref.name}"},
                   out.raw_seq)

    def _transform(self, m: Msg, data: bytes, seq: int, *, resolved: bool = False) -> Out | None:
        # Fully decoded even when only routed: what reaches BINLAKE_CDC is a valid envelope, its
        # strings valid UTF-8 (a check that skipping the rows would lose). Only a schema decoded
        # before is not decoded again.
        env = envelope.as_dict(envelope.decode(data) if resolved else self._decoder.decode(data, m.subject))
        if objects.REF in env:
            raise envelope.EnvelopeError("an object reference without its Binlake-Object header")
        db, table = env.get("db"), env.get("table")
        cdc_subject = self._route(m.subject, env)
        shaped: dict[str, Any] | None = env
        if table is not None and env["op"] != "hb":
            allowed, table_rules = self._rules_for(db or "", table)
            if not allowed:
                self._filtered.inc(partition=self._p)
                return self._marker(env, seq)
            if table_rules.rewrites:
                self._check_columns(db or "", table, env)
            try:
                shaped = self._rules.apply(env, table_rules)
            except (TypeError, KeyError, AttributeError, ValueError) as exc:  # rows or `alter` not shaped as DESIGN §4
                raise envelope.EnvelopeError(f"the sink rules cannot apply to its rows or DDL: {exc!r}") from exc
            if shaped is None:
                self._filtered.inc(partition=self._p)
                return self._marker(env, seq)
        headers = {k: v for k, v in (m.headers or {}).items() if k not in DROPPED_HEADERS}
        # Rebuilt from the checked envelope: the store trusts it to find whole transactions.
        headers.pop(envelope.TXN_HEADER, None)
        if (txn := envelope.txn_header(env)) is not None:
            headers[envelope.TXN_HEADER] = txn
        if resolved:
            headers.pop(objects.HEADER, None)
        if shaped is not env and shaped is not None:
            data = envelope.encode(shaped)
            schema_id = envelope.schema_id_of(shaped)
            if schema_id:
                headers[envelope.SCHEMA_HEADER] = schema_id
        return Out(cdc_subject, data, headers, seq)

    def _route(self, subject: str, env: dict[str, Any]) -> str:
        """The CDC subject of a raw message, which must be the one its envelope names."""
        try:
            source, _, db, table = self._names.parse_raw_stored(subject)
        except ValueError:
            raise envelope.EnvelopeError(f"{subject!r} is not a raw subject binlake publishes to") from None
        if source != self._s.source or source != env.get("source"):
            raise envelope.EnvelopeError(f"source {env.get('source')!r} on subject {subject!r} of source "
                                         f"{self._s.source!r}")
        if env.get("table") is not None and (db, table) != (env.get("db"), env.get("table")):
            raise envelope.EnvelopeError(f"envelope of {env.get('db')}.{env.get('table')} on subject {subject!r}")
        if env.get("table") is None and db != INTERNAL_TOKEN:
            raise envelope.EnvelopeError(f"envelope without a table on the table subject {subject!r}")
        return self._names.cdc_from_raw_stored(subject)

    def _check_columns(self, db: str, table: str, env: dict[str, Any]) -> None:
        """Say once per schema when a column rule names a column the table does not have."""
        schema = env.get("schema")
        if not isinstance(schema, dict) or not isinstance(columns := schema.get("columns"), list):
            return
        if (sid := str(schema.get("id"))) in self._checked_schemas:
            return
        self._checked_schemas.add(sid)
        names = [str(c.get("name", "")) for c in columns if isinstance(c, dict)]
        missing = self._rules_for(db, table)[1].missing(names)
        if missing:
            self._unknown_columns.inc(len(missing), partition=self._p)
            self.log.warning("sink.rule_names_missing_column", table=f"{db}.{table}", columns=missing,
                             has=names, hint="fix the column names in columns_include / columns_exclude / masks")

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
            raise (store_full(exc, self._names.dlq_stream, f"the dead letter of raw seq {seq}")
                   or NatsUnavailable(f"cannot write the dead letter for raw seq {seq}: {exc!r}")) from exc
        self._dlq.inc(partition=self._p)
        self.log.error("partition.halted", raw_seq=seq, subject=m.subject, reason=reason)
        raise PartitionHalted(f"partition {self._s.partition} stopped at raw seq {seq}: {reason}")

    @property
    def _handled(self) -> int:
        return max(self._cursor, self._seen)

    async def _verify(self) -> None:
        """Halt on a retention gap after the unverified jump; when idle, record how far all is handled."""
        drained = self._reader is not None and self._reader.drained and \
            time.monotonic() - self._seen_at >= SEEN_EVERY * self._s.cursor_interval_s
        state = await jetstream.stream_identity(self._js, self._names.raw_stream)
        self._check_stream(state)
        if self._unverified is not None:
            if state.first_seq > self._unverified + 1:
                await self._retention_gap(self._unverified, state.first_seq)
            self._unverified = None
        if drained and self._reader is not None:
            self._seen_at = time.monotonic()
            # Asked after the stream's last sequence: nothing pending and everything delivered handed
            # out (and so handled) means none of ours is left up to it.
            if await self._reader.handed_out_all():
                self._seen = max(self._seen, state.last_seq)

    def _check_stream(self, ident: jetstream.StreamIdentity) -> None:
        """Halt unless the cursor counts in this BINLAKE_RAW and lies within it; a new cursor takes it on."""
        try:
            ident.check(self._names.raw_stream, self._stream_id, self._handled, f"sink partition {self._s.partition}",
                        f"binlake rewind --sink-partition {self._s.partition} --to-start, then restart the sink")
        except StreamRedefined as exc:
            self._redefined.inc(partition=self._p)
            self.log.error("partition.stream_redefined", cursor=self._handled, recorded=self._stream_id,
                           stream=ident.id, last_seq=ident.last_seq, reason=str(exc))
            raise PartitionHalted(f"partition {self._s.partition}: {exc}") from None
        self._stream_id = ident.id

    async def _retention_gap(self, handled: int, first: int) -> None:
        self._gaps.inc(partition=self._p)
        reason = (f"BINLAKE_RAW no longer holds sequences {handled + 1}..{first - 1}, removed by its limits "
                  f"(7 days by default) or by hand before partition {self._s.partition} handled them: changes of "
                  "its tables may be lost. Keep sinks running within the limits; to go on, snapshot the "
                  f"partition's tables again (binlake snapshot) and move its cursor past the gap: nats kv put "
                  f"{self._names.cursors_bucket} {self._key} '{{\"seq\": {first - 1}}}', then restart the sink")
        self.log.error("partition.retention_gap", handled=handled, stream_first_seq=first, reason=reason)
        raise PartitionHalted(f"partition {self._s.partition}: {reason}")

    async def _load_cursor(self) -> None:
        try:
            entry = await self._cursors.get(self._key)
        except nats.js.errors.KeyNotFoundError:
            self._cursor, self._revision = 0, None
            return
        # One the server relayed here is refused.
        value = PartitionCursor.decode(entry.value, self._key, self._names.cursors_bucket)
        self._cursor = self._committed = value.seq
        self._seen = self._committed_seen = value.seen
        self._stream_id = value.stream_id
        self._revision = entry.revision

    async def _commit(self, *, final: bool = False) -> None:
        self._committed_at = time.monotonic()
        if not final:
            await self._verify()
        # A cursor never passes a jump not checked against retention (only a final commit skips the check).
        cursor = self._cursor if self._unverified is None else min(self._cursor, self._unverified)
        seen = self._seen if self._unverified is None else 0
        if cursor == self._committed and seen == self._committed_seen:
            return
        value = PartitionCursor(cursor, seen, self._stream_id)
        try:
            written = await cas.write_forward(
                self._cursors, self._key, value.encode(), self._revision,
                lambda stored: _ahead(PartitionCursor.decode(stored, self._key, self._names.cursors_bucket), value))
        except nats.errors.Error as exc:
            raise (store_full(exc, self._names.cursors_bucket, f"cursor {self._key}")
                   or NatsUnavailable(f"cursor {self._key}: {exc!r}")) from exc
        self._revision = written.revision
        if written.stored:
            self._committed, self._committed_seen = cursor, seen


def _ahead(stored: PartitionCursor, ours: PartitionCursor) -> bool:
    """Whether the stored cursor is already at or past ours (another owner wrote it), or counts in another
    stream (an operator's rewind): either way it is not overwritten."""
    return stored.stream_id != ours.stream_id or (stored.seq, stored.seen) >= (ours.seq, ours.seen)


"""Actor: record every DDL and every new table schema the parser published in meta's schema history.

It reads BINLAKE_RAW headers only (`Binlake-Op`, `Binlake-Schema`); a message body is fetched
only for a DDL or when a table's schema id changes. The records go to meta (`schema.add`), so
meta never reads BINLAKE_RAW, which holds every database unmasked. The recorder's progress is
the last RAW sequence it recorded, in the cursor bucket (`keys.schema_recorder`); a restart
continues after it, and whatever it records twice is recorded idempotently.

Only the lease holder runs it, beside the pipeline and independent of it: while meta does not
answer, recording waits (the supervisor restarts the recorder) and the binlog keeps flowing.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from shared import cas, envelope, keys, kv_values, objects
from shared.actor import raise_if_cancelled
from shared.errors import NatsUnavailable, TransientError
from shared.jetstream import nats_errors
from shared.meta_client import MetaClient
from shared.metrics import Registry
from shared.mysql import MAX_IDENTIFIER
from shared.ordered_reader import OrderedReader
from shared.rpc import RpcError
from shared.subjects import Names, unescape_token

SAVE_INTERVAL_S = 1.0


class MetaFailed(TransientError):
    """Meta answered but could not store a record (its backend failed); recording waits and tries again."""


class SchemaRecorder:
    def __init__(self, js: JetStreamContext, names: Names, source: str, cursors: KeyValue, meta: MetaClient,
                 registry: Registry) -> None:
        self._js = js
        self._names = names
        self._source = source
        self._kv = cursors
        self._meta = meta
        self._key = keys.schema_recorder(source)
        self._last_schema: dict[tuple[str, str], str] = {}
        self._recorded = registry.counter("parser_schema_records_total",
                                          "Schema and DDL records this process wrote to meta's schema history")
        self.log = structlog.get_logger().bind(actor="schema-recorder")

    async def run(self) -> None:
        try:
            await self._record()
        except Exception:
            # A stop (or a lost lease) that a NATS request swallowed comes out as its error, of
            # whatever type (CPython gh-86296): end here, or the supervisor would restart us forever.
            raise_if_cancelled()
            raise

    async def _record(self) -> None:
        last_seq = await self._wait_for_stream()
        seq, revision = await self._load()
        if seq > last_seq:
            # The stream was recreated: its sequences started again at 1.
            self.log.warning("schema.cursor_ahead", raw_seq=seq, stream_last_seq=last_seq)
            seq, revision = 0, await self._save(0, revision, force=True)
        self._last_schema.clear()  # what the reader saw since `seq` (a restart reads it again)
        reader = OrderedReader(self._js, self._names.raw_stream, self._names.raw_source_filter(self._source),
                               seq + 1, 1000, headers_only=True)
        saved, saved_at = seq, time.monotonic()
        try:
            while True:
                raise_if_cancelled()  # a cancel swallowed by a request in _load or the reader's _open
                for m in await reader.fetch(wait_s=1.0):
                    await self._consider(m.subject, m.headers or {}, m.metadata.sequence.stream)
                    seq = m.metadata.sequence.stream
                if seq != saved and time.monotonic() - saved_at > SAVE_INTERVAL_S:
                    revision = await self._save(seq, revision)
                    raise_if_cancelled()
                    saved, saved_at = seq, time.monotonic()
        finally:
            await reader.close()

    async def _wait_for_stream(self) -> int:
        """The last sequence of BINLAKE_RAW, once it exists: the pipeline creates it after its source checks."""
        while True:
            with nats_errors(f"stream {self._names.raw_stream}"):
                try:
                    info = await self._js.stream_info(self._names.raw_stream)
                    return int(info.state.last_seq or 0)
                except nats.js.errors.NotFoundError:
                    pass
            raise_if_cancelled()
            await asyncio.sleep(1.0)

    async def _load(self) -> tuple[int, int | None]:
        """Where recording continues (the last recorded RAW sequence) and the key's revision."""
        with nats_errors(f"cursor {self._key}"):
            try:
                entry = await self._kv.get(self._key)
                return _seq(entry.value, self._key, self._names.cursors_bucket), entry.revision
            except nats.js.errors.KeyNotFoundError:
                pass
            try:
                # Meta recorded schemas itself before; with its KV backend its cursor is in this
                # bucket. Without it (MySQL backend) recording starts at the stream's beginning.
                legacy = await self._kv.get(keys.legacy_schema_recorder(self._source))
            except nats.js.errors.KeyNotFoundError:
                return 0, None
        seq = _seq(legacy.value, keys.legacy_schema_recorder(self._source), self._names.cursors_bucket)
        self.log.info("schema.cursor_migrated", raw_seq=seq, key=keys.legacy_schema_recorder(self._source))
        return seq, None

    async def _save(self, seq: int, revision: int | None, *, force: bool = False) -> int | None:
        # Compare-and-set: a parser that just lost the lease may still be saving; the cursor only
        # moves forward (unless the stream started again).
        value = json.dumps({"seq": seq}).encode()
        bucket = self._names.cursors_bucket
        written = await cas.write_forward(self._kv, self._key, value, revision,
                                          lambda stored: not force and _seq(stored, self._key, bucket) >= seq)
        return written.revision

    async def _consider(self, subject: str, headers: dict[str, str], seq: int) -> None:
        op = headers.get(envelope.OP_HEADER)
        schema_id = headers.get(envelope.SCHEMA_HEADER)
        parts = subject.split(".")
        table_key = (unescape_token(parts[-2]), unescape_token(parts[-1]))
        if op != "ddl" and not (schema_id and self._last_schema.get(table_key) != schema_id):
            return
        try:
            msg = await self._js.get_msg(self._names.raw_stream, seq)
        except (nats.errors.Error, TimeoutError) as exc:
            raise NatsUnavailable(f"raw message {seq}: {exc!r}") from exc
        data = msg.data or b""
        try:
            # Too large for a message: its schema is in the object.
            data = await objects.resolve(self._js, data, self._names.raw_objects_bucket)
            record = _record_of(envelope.as_dict(envelope.decode(data)), op)
        except (envelope.EnvelopeError, objects.ObjectMissing) as exc:
            # The sink dead-letters such a message and stops its partition; the history just
            # has no entry for it.
            self.log.error("schema.undecodable", raw_seq=seq, subject=subject, reason=str(exc))
            return
        try:
            await self._meta.add_schema(self._source, **record)
        except RpcError as exc:
            if exc.retriable or exc.code == "bad_request":
                raise  # meta away: the supervisor restarts us; a refused request is a bug: stop
            raise MetaFailed(f"meta could not record raw message {seq} ({subject}): {exc}") from exc
        raise_if_cancelled()
        self._recorded.inc()
        if op == "ddl":
            # Record the next rows schema even when the DDL kept the columns (ADD INDEX).
            self._last_schema.pop(table_key, None)
        elif schema_id:
            self._last_schema[table_key] = schema_id


def _record_of(env: dict[str, Any], op: str | None) -> dict[str, Any]:
    """The `MetaClient.add_schema` fields of a DDL or rows envelope; EnvelopeError when they are not there."""
    db, table, scn, ts = env.get("db") or "", env.get("table") or "", env.get("scn"), env.get("ts")
    schema = env.get("schema") if op != "ddl" else None
    ddl = env.get("ddl")
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in (scn, ts)):
        raise envelope.EnvelopeError(f"scn {scn!r} or ts {ts!r} is not a position or time")
    if not isinstance(db, str) or not isinstance(table, str):
        raise envelope.EnvelopeError(f"db {db!r} or table {table!r} is not text")
    if len(db) > MAX_IDENTIFIER or len(table) > MAX_IDENTIFIER:  # meta refuses them (a bad request stops us)
        raise envelope.EnvelopeError(f"db or table name longer than MySQL's {MAX_IDENTIFIER} characters")
    if (schema is not None and not isinstance(schema, dict)) or (ddl is not None and not isinstance(ddl, str)):
        raise envelope.EnvelopeError("schema is not a map or ddl is not text")
    if schema is None and ddl is None:
        raise envelope.EnvelopeError(f"a {op!r} message with neither schema nor ddl")
    return {"db": db, "table": table, "scn": scn, "schema": schema, "ddl": ddl, "ts": ts}


def _seq(stored: bytes | None, key: str, bucket: str) -> int:
    """The sequence in a stored cursor value; 0 (record again from the start: idempotent) when it has none.

    A value that is no JSON object, or one the NATS server relayed into the key (a publish ack
    has a `seq` too), is ForeignValue: recording would skip schemas.
    """
    seq = kv_values.load_json(stored, key, bucket).get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else 0

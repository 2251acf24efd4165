"""Actor: record every DDL and every new table schema the parser publishes, with its position.

It reads BINLAKE_RAW headers only (`Binlake-Op`, `Binlake-Schema`); a message body is fetched
only for a DDL or when a table's schema id changes. Its own progress is a cursor in the
backend, so a restart continues where it stopped (re-recording is idempotent).
"""

from __future__ import annotations

import time

import nats.errors
import structlog
from nats.js import JetStreamContext

from services.meta.backend import Conflict, MetaBackend, SchemaRecord
from shared import envelope
from shared.errors import NatsUnavailable
from shared.ordered_reader import OrderedReader
from shared.subjects import Names, unescape_token


class SchemaRecorder:
    def __init__(self, js: JetStreamContext, names: Names, source: str, backend: MetaBackend) -> None:
        self._js = js
        self._names = names
        self._source = source
        self._backend = backend
        self._key = f"meta.schema.{source}"
        self._last_schema: dict[tuple[str, str], str] = {}
        self.recorded = 0
        self.log = structlog.get_logger().bind(actor="schema-recorder")

    async def run(self) -> None:
        entry = await self._backend.get(self._key)
        seq, revision = (int(entry.value["seq"]), entry.revision) if entry else (0, None)
        reader = OrderedReader(self._js, self._names.raw_stream, self._names.raw_source_filter(self._source),
                               seq + 1, 1000, headers_only=True)
        saved_at = time.monotonic()
        try:
            while True:
                msgs = await reader.fetch(wait_s=1.0)
                for m in msgs:
                    await self._consider(m.subject, m.headers or {}, m.metadata.sequence.stream)
                if msgs:
                    seq = msgs[-1].metadata.sequence.stream
                if time.monotonic() - saved_at > 1.0 and (entry is None or seq != int(entry.value["seq"])):
                    revision = await self._save(seq, revision)
                    saved_at = time.monotonic()
        finally:
            await reader.close()

    async def _save(self, seq: int, revision: int | None) -> int | None:
        try:
            return await self._backend.put(self._key, {"seq": seq}, revision)
        except Conflict:
            entry = await self._backend.get(self._key)  # another meta records too; follow it
            return entry.revision if entry else None

    async def _consider(self, subject: str, headers: dict[str, str], seq: int) -> None:
        op = headers.get("Binlake-Op")
        schema_id = headers.get("Binlake-Schema")
        parts = subject.split(".")
        table_key = (unescape_token(parts[-2]), unescape_token(parts[-1]))
        if op == "ddl" or (schema_id and self._last_schema.get(table_key) != schema_id):
            try:
                msg = await self._js.get_msg(self._names.raw_stream, seq)
            except (nats.errors.Error, TimeoutError) as exc:
                raise NatsUnavailable(f"raw message {seq}: {exc!r}") from exc
            try:
                env = envelope.decode(msg.data or b"")
            except envelope.EnvelopeError as exc:
                # The sink dead-letters such a message and stops its partition; the history
                # just has no entry for it.
                self.log.error("schema.undecodable", raw_seq=seq, subject=subject, reason=str(exc))
                return
            db, table = env.get("db") or "", env.get("table") or ""
            await self._backend.add_schema(SchemaRecord(
                self._source, db, table, int(env["scn"]), schema=env.get("schema") if op != "ddl" else None,
                ddl=env.get("ddl"), ts=int(env["ts"])))
            self.recorded += 1
            if op == "ddl":
                # Record the next rows schema even when the DDL kept the columns (ADD INDEX).
                self._last_schema.pop(table_key, None)
            elif schema_id:
                self._last_schema[table_key] = schema_id

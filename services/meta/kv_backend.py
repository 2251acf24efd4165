"""Meta backend on JetStream KV: cursors in one bucket, schema history in another.

Cursor compare-and-set is KV `update(last=revision)` / `create`. Schema records are keys
`<source>.<db>.<table>.<scn>` with hex-encoded names (KV keys allow few characters), so a
table's history is one prefix watch.
"""

from __future__ import annotations

import json
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from services.meta.backend import Conflict, CursorEntry, SchemaRecord
from shared import bus, jetstream, keys, kv_values
from shared.jetstream import nats_errors


class KvBackend:
    def __init__(self, js: JetStreamContext, cursors_bucket: str, schema_bucket: str, replicas: int = 1) -> None:
        self._js = js
        self._buckets = (cursors_bucket, schema_bucket)
        self._replicas = replicas
        self._cursors: KeyValue | None = None
        self._schema: KeyValue | None = None

    async def start(self) -> None:
        self._cursors = await jetstream.ensure_kv(self._js, self._buckets[0], history=bus.CURSOR_HISTORY,
                                                  replicas=self._replicas)
        self._schema = await jetstream.ensure_kv(self._js, self._buckets[1], replicas=self._replicas)

    async def close(self) -> None:
        return None

    @property
    def cursors(self) -> KeyValue:
        assert self._cursors is not None, "start() first"
        return self._cursors

    @property
    def schema_kv(self) -> KeyValue:
        assert self._schema is not None, "start() first"
        return self._schema

    async def get(self, key: str) -> CursorEntry | None:
        with nats_errors(f"cursor {key}"):
            try:
                entry = await self.cursors.get(key)
            except nats.js.errors.KeyNotFoundError:
                return None
        if entry.value is None or entry.revision is None:
            return None
        # Every cursor a caller (the store, a rewind) reads or compares goes through here: a
        # server reply relayed into the key is refused (the caller's request fails with the reason).
        return CursorEntry(key, kv_values.load_json(entry.value, key, self._buckets[0]), entry.revision)

    async def put(self, key: str, value: dict[str, Any], expected_revision: int | None) -> int:
        data = json.dumps(value).encode()
        with nats_errors(f"cursor {key}"):
            try:
                if expected_revision is None:
                    return int(await self.cursors.create(key, data))
                return int(await self.cursors.update(key, data, last=expected_revision))
            except nats.js.errors.KeyWrongLastSequenceError as exc:
                raise Conflict(f"cursor {key} changed concurrently (expected revision {expected_revision})") from exc

    async def list_cursors(self, prefix: str) -> list[CursorEntry]:
        entries = await jetstream.kv_entries(self._js, self._buckets[0])
        return sorted((CursorEntry(k, json.loads(v), rev) for k, v, rev in entries if k.startswith(prefix)),
                      key=lambda e: e.key)

    async def delete(self, key: str) -> None:
        with nats_errors(f"cursor {key}"):
            await self.cursors.delete(key)

    async def add_schema(self, record: SchemaRecord) -> None:
        key = keys.schema_record(record.source, record.db, record.table, record.scn)
        with nats_errors("schema history"):
            await self.schema_kv.put(key, json.dumps(record.to_dict()).encode())

    async def schemas(self, source: str, db: str, table: str) -> list[SchemaRecord]:
        prefix = keys.schema_table(source, db, table)
        entries = await jetstream.kv_entries(self._js, self._buckets[1], f"{prefix}.>")
        return sorted((SchemaRecord.from_dict(json.loads(v)) for _, v, _ in entries), key=lambda r: r.scn)

"""Meta's request handlers: cursors (monotonic compare-and-set), schema history, rewind.

Subjects `<prefix>.meta.<verb>`, served in queue group `meta` so several meta processes
can answer; all state is in the backend, none in memory.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from services.meta.backend import Conflict, MetaBackend, SchemaRecord
from services.meta.history import schema_at
from services.meta.rewind import Rewinder
from shared.config import SOURCE_NAME
from shared.health import Conditions
from shared.mysql import MAX_IDENTIFIER
from shared.rpc import BadRequest, RpcError, require, require_client, serve
from shared.subjects import Names


class MetaServer:
    def __init__(self, nc: NATS, prefix: str, backend: MetaBackend, rewinder: Rewinder,
                 health: Conditions | None = None) -> None:
        """`health`: where requests it cannot answer (its backend away) are reported."""
        self._nc = nc
        self._health = health
        self._prefix = prefix
        self._backend = backend
        self._rewinder = rewinder
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        handlers = {
            "cursor.get": self.cursor_get, "cursor.put": self.cursor_put, "cursor.list": self.cursor_list,
            "cursor.delete": self.cursor_delete, "schema.add": self.schema_add, "schema.at": self.schema_at,
            "schema.history": self.schema_history, "rewind": self.rewind,
        }
        for verb, handler in handlers.items():
            self._subs.append(await serve(self._nc, Names(self._prefix).meta_rpc(verb), handler, queue="meta",
                                          health=self._health))

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()

    async def cursor_get(self, req: dict[str, Any]) -> dict[str, Any]:
        entry = await self._backend.get(require(req, "key", str))
        return {"entry": None if entry is None else {"value": entry.value, "revision": entry.revision}}

    async def cursor_put(self, req: dict[str, Any]) -> dict[str, Any]:
        """Compare-and-set; with `order` (a field name) the value may only grow unless `rewind`."""
        key = require(req, "key", str)
        value = require(req, "value", dict)
        revision = req.get("revision")
        if revision is not None and not isinstance(revision, int):
            raise BadRequest("field 'revision' must be int or nil")
        order = req.get("order")
        if order is not None and not req.get("rewind"):
            current = await self._backend.get(key)
            if current is not None and _order(current.value, order) > _order(value, order):
                raise RpcError("backwards", f"cursor {key} is at {order}={current.value.get(order)}; refusing to "
                                            f"move it back to {value.get(order)} without rewind")
        try:
            return {"revision": await self._backend.put(key, value, revision)}
        except Conflict as exc:
            raise RpcError("conflict", str(exc)) from None

    async def cursor_list(self, req: dict[str, Any]) -> dict[str, Any]:
        entries = await self._backend.list_cursors(str(req.get("prefix", "")))
        return {"entries": [{"key": e.key, "value": e.value, "revision": e.revision} for e in entries]}

    async def cursor_delete(self, req: dict[str, Any]) -> dict[str, Any]:
        await self._backend.delete(require(req, "key", str))
        return {}

    async def schema_add(self, req: dict[str, Any]) -> dict[str, Any]:
        """Record a table's schema or a DDL at its position; the parser's recorder sends them
        (meta itself never reads BINLAKE_RAW). Recording the same table and scn again is fine."""
        await self._backend.add_schema(_schema_record(req))
        return {}

    async def schema_at(self, req: dict[str, Any]) -> dict[str, Any]:
        records = await self._backend.schemas(require(req, "source", str), require(req, "db", str),
                                              require(req, "table", str))
        return schema_at(records, require(req, "scn", int))

    async def schema_history(self, req: dict[str, Any]) -> dict[str, Any]:
        records = await self._backend.schemas(require(req, "source", str), require(req, "db", str),
                                              require(req, "table", str))
        return {"records": [r.to_dict() for r in records]}

    async def rewind(self, req: dict[str, Any]) -> dict[str, Any]:
        source, client = require(req, "source", str), require_client(req)
        if sum(k in req for k in ("timestamp", "position", "gtid", "start")) != 1:
            raise BadRequest("give exactly one of 'timestamp' (ms), 'position' ('file:offset'), 'gtid' (a GTID set) "
                             "or 'start' (true)")
        if req.get("start") is True:
            return await self._rewinder.to_start(source, client)
        if "timestamp" in req:
            return await self._rewinder.to_timestamp(source, client, require(req, "timestamp", int))
        if "gtid" in req:
            return await self._rewinder.to_gtid(source, client, require(req, "gtid", str))
        return await self._rewinder.to_position(source, client, require(req, "position", str))


def _schema_record(req: dict[str, Any]) -> SchemaRecord:
    """The record a `schema.add` request describes, every field checked."""
    source, db, table = require(req, "source", str), require(req, "db", str), require(req, "table", str)
    if not SOURCE_NAME.fullmatch(source) or len(source) > MAX_IDENTIFIER:
        raise BadRequest(f"field 'source' must be 1..{MAX_IDENTIFIER} letters, digits, '_' or '-', got {source[:80]!r}")
    for name, value in (("db", db), ("table", table)):
        if len(value) > MAX_IDENTIFIER:  # MySQL's own limit; a longer one would not fit a KV key or the MySQL backend
            raise BadRequest(f"field {name!r} has {len(value)} characters; MySQL names have at most {MAX_IDENTIFIER}")
    scn, ts = require(req, "scn", int), require(req, "ts", int)
    if scn < 0 or ts < 0:
        raise BadRequest(f"fields 'scn' and 'ts' must not be negative, got scn={scn} ts={ts}")
    schema, ddl = req.get("schema"), req.get("ddl")
    if schema is not None and not isinstance(schema, dict):
        raise BadRequest(f"field 'schema' must be dict or nil, got {type(schema).__name__}")
    if ddl is not None and not isinstance(ddl, str):
        raise BadRequest(f"field 'ddl' must be str or nil, got {type(ddl).__name__}")
    if schema is None and ddl is None:
        raise BadRequest("give 'schema' (a table's columns) or 'ddl' (a statement), or both")
    return SchemaRecord(source, db, table, scn, schema=schema, ddl=ddl, ts=ts)


def _order(value: dict[str, Any], field: str) -> int:
    raw = value.get(field, 0)
    return int(raw) if isinstance(raw, (int, float, str)) and str(raw).lstrip("-").isdigit() else 0

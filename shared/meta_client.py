"""Client of the meta service (cursors, schema history, rewind) over NATS request-reply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS

from shared.rpc import RpcError, call
from shared.subjects import Names


@dataclass(frozen=True)
class Entry:
    value: dict[str, Any]
    revision: int


class Conflict(RpcError):
    """A compare-and-set lost against a concurrent writer."""


class MetaClient:
    def __init__(self, nc: NATS, prefix: str = "binlake", timeout_s: float = 5.0) -> None:
        self._nc = nc
        self._prefix = prefix
        self._timeout = timeout_s

    async def _call(self, verb: str, req: dict[str, Any]) -> dict[str, Any]:
        try:
            return await call(self._nc, Names(self._prefix).meta_rpc(verb), req, self._timeout)
        except RpcError as exc:
            if exc.code == "conflict":
                raise Conflict(exc.code, str(exc)) from None
            raise

    async def get(self, key: str) -> Entry | None:
        entry = (await self._call("cursor.get", {"key": key}))["entry"]
        return None if entry is None else Entry(entry["value"], int(entry["revision"]))

    async def put(self, key: str, value: dict[str, Any], revision: int | None, *, order: str | None = None,
                  rewind: bool = False) -> int:
        reply = await self._call("cursor.put", {"key": key, "value": value, "revision": revision, "order": order,
                                                "rewind": rewind})
        return int(reply["revision"])

    async def list_cursors(self, prefix: str = "") -> list[tuple[str, Entry]]:
        reply = await self._call("cursor.list", {"prefix": prefix})
        return [(e["key"], Entry(e["value"], int(e["revision"]))) for e in reply["entries"]]

    async def delete(self, key: str) -> None:
        await self._call("cursor.delete", {"key": key})

    async def schema_at(self, source: str, db: str, table: str, scn: int) -> dict[str, Any]:
        return await self._call("schema.at", {"source": source, "db": db, "table": table, "scn": scn})

    async def schema_history(self, source: str, db: str, table: str) -> list[dict[str, Any]]:
        return list((await self._call("schema.history", {"source": source, "db": db, "table": table}))["records"])

    async def add_schema(self, source: str, db: str, table: str, scn: int, *, schema: dict[str, Any] | None,
                         ddl: str | None, ts: int) -> None:
        """Record a table's schema or a DDL at position `scn` in the history (idempotent per table and scn)."""
        await self._call("schema.add", {"source": source, "db": db, "table": table, "scn": scn, "schema": schema,
                                        "ddl": ddl, "ts": ts})

    async def rewind(self, source: str, client: str, *, timestamp_ms: int | None = None,
                     position: str | None = None, gtid: str | None = None, start: bool = False) -> dict[str, Any]:
        """Move a client back (or on) to one point; `start`: to the first message BINLAKE_CDC holds."""
        req: dict[str, Any] = {"source": source, "client": client}
        if start:
            req["start"] = True
        if timestamp_ms is not None:
            req["timestamp"] = timestamp_ms
        if position is not None:
            req["position"] = position
        if gtid is not None:
            req["gtid"] = gtid
        return await self._call("rewind", req)

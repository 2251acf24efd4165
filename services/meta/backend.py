"""What meta stores, independent of where: cursors (compare-and-set) and schema history.

Two backends implement `MetaBackend`: JetStream KV (default) and a MySQL table through
asyncmy. Both must pass the same tests (tests/integration/test_meta_backends.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from shared.errors import FatalError


class Conflict(FatalError):
    """A compare-and-set lost: the stored revision is not the expected one."""


@dataclass(frozen=True)
class CursorEntry:
    key: str
    value: dict[str, Any]
    revision: int


@dataclass(frozen=True)
class SchemaRecord:
    """A table's schema (`schema`) or a DDL statement (`ddl`) seen at binlog position `scn`."""

    source: str
    db: str
    table: str
    scn: int
    schema: dict[str, Any] | None = None
    ddl: str | None = None
    ts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "db": self.db, "table": self.table, "scn": self.scn,
                "schema": self.schema, "ddl": self.ddl, "ts": self.ts}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SchemaRecord:
        return cls(d["source"], d["db"], d["table"], int(d["scn"]), d.get("schema"), d.get("ddl"), int(d.get("ts", 0)))


class MetaBackend(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def get(self, key: str) -> CursorEntry | None: ...

    async def put(self, key: str, value: dict[str, Any], expected_revision: int | None) -> int:
        """Store `value` if the key's revision is `expected_revision` (None: the key must not exist).

        Returns the new revision; raises Conflict otherwise.
        """
        ...

    async def list_cursors(self, prefix: str) -> list[CursorEntry]: ...

    async def delete(self, key: str) -> None: ...

    async def add_schema(self, record: SchemaRecord) -> None:
        """Record a schema or DDL at its position (idempotent for the same table and scn)."""
        ...

    async def schemas(self, source: str, db: str, table: str) -> list[SchemaRecord]:
        """Every record of one table, ordered by scn."""
        ...

"""Feed: envelopes for the lake in-process, with increasing CDC sequences and source order keys."""

from __future__ import annotations

from typing import Any


class Feed:
    """Envelopes with increasing CDC sequences and source order keys."""

    def __init__(self, db: str = "d", table: str = "t") -> None:
        self.db, self.table = db, table
        self.seq = 0
        self.scn = 1 << 32

    def env(self, op: str, rows: list[dict[str, Any]], columns: list[dict[str, Any]], pk: list[str],
            table: str | None = None) -> tuple[int, dict[str, Any]]:
        self.seq += 1
        self.scn += 100
        sid = "/".join(c["name"] + c["type"] for c in columns)
        return self.seq, {"v": 1, "source": "main", "db": self.db, "table": table or self.table, "op": op,
                          "ts": 1_700_000_000_000, "pos": {"file": "mysql-bin.000001", "offset": self.scn & 0xFFFF},
                          "scn": self.scn, "txn": {"id": "x", "i": 0, "last": True}, "pk": pk, "rows": rows,
                          "schema": {"id": sid, "columns": columns}}

    def ddl(self, sql: str, alter: dict[str, Any], table: str | None = None) -> tuple[int, dict[str, Any]]:
        self.seq += 1
        self.scn += 100
        return self.seq, {"v": 1, "source": "main", "db": self.db, "table": table or self.table, "op": "ddl",
                          "ts": 1, "pos": {"file": "mysql-bin.000001", "offset": 4}, "scn": self.scn,
                          "txn": {"id": "y", "i": 0, "last": True}, "ddl": sql, "alter": alter}

    def replace(self, table: str | None = None, op: str = "replace",
                columns: list[dict[str, Any]] | None = None) -> tuple[int, dict[str, Any]]:
        """A keyless table's snapshot begins (the parser's `replace`, no rows; with the table's columns)."""
        self.seq += 1
        self.scn += 100
        env = {"v": 1, "source": "main", "db": self.db, "table": table or self.table, "op": op,
               "ts": 1, "pos": {"file": "mysql-bin.000001", "offset": self.scn & 0xFFFF},
               "scn": self.scn, "txn": {"id": "z", "i": 0, "last": False}}
        if columns is not None:
            env["schema"] = {"id": "/".join(c["name"] + c["type"] for c in columns), "columns": columns}
            env["pk"] = []
        return self.seq, env

    def replaced(self, table: str | None = None, op: str = "replaced") -> tuple[int, dict[str, Any]]:
        """... and is complete (`replaced`, after its last `r` row), or will not be (`abandoned`)."""
        return self.replace(table, op)

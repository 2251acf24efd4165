"""Tables set aside: a source table the lake cannot apply stops alone, its changes kept in the lake.

```
<catalog>._binlake.held   db, table, seq, env (the envelope, msgpack), reason, at
```
A table whose change fails in Spark (a DDL Iceberg refuses, a broken lake table) is *held*:
a row with the reason (`env` null) records it, and from then on every change of that table
is appended to this table in CDC order, in the same unit of work as the other tables'
commits and before the ack, while every other table goes on loading. Nothing is lost: the
store may drop its messages once acked, the held rows are the copy. Appends skip what the
table holds already (a redelivery after a kill), so each change is kept once.

A held table is tried again when the loader starts and every `BINLAKE_RETRY_HELD_S`: its
kept changes are applied through the ordinary path, where the tables' markers skip what the
lake already has (a kill in the middle of a replay), and only then are its rows deleted. One
that fails again stays held with the new reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from services.loader.naming import BOOK_NAMESPACE, HELD_TABLE, quote, sql_string
from services.loader.tables import arrow_to_spark
from shared import envelope

_COLUMNS = {"db": "string", "table": "string", "seq": "bigint", "env": "binary", "reason": "string",
            "at": "timestamp"}
_SCHEMA = pa.schema([("db", pa.string()), ("table", pa.string()), ("seq", pa.int64()), ("env", pa.binary()),
                     ("reason", pa.string())])


@dataclass
class Hold:
    """Why a table is set aside, since which batch, and the last CDC sequence kept for it."""

    reason: str
    since: int
    kept: int = 0


class Holds:
    """The held tables of one lake (`_binlake.held`), loaded at start and kept in step with it."""

    def __init__(self, spark: SparkSession, catalog: str) -> None:
        self.spark = spark
        self.ident = f"{quote(catalog)}.{quote(BOOK_NAMESPACE)}.{quote(HELD_TABLE)}"
        self.tables: dict[tuple[str, str], Hold] = {}

    @property
    def columns(self) -> dict[str, str]:
        return dict(_COLUMNS)

    def load(self) -> None:
        self.tables = {}
        # Reason rows carry the batch that set the table aside; change rows their CDC sequence.
        rows = self.spark.sql(
            f"SELECT db, `table`, coalesce(max(seq) FILTER (WHERE env IS NOT NULL), 0) AS kept, "
            f"min(seq) FILTER (WHERE env IS NULL) AS since, max_by(reason, seq) FILTER (WHERE env IS NULL) AS reason "
            f"FROM {self.ident} GROUP BY db, `table`").collect()
        for r in rows:
            self.tables[(str(r["db"]), str(r["table"]))] = Hold(str(r["reason"]), int(r["since"]), int(r["kept"]))

    def __contains__(self, key: object) -> bool:
        return key in self.tables

    def hold(self, key: tuple[str, str], reason: str, batch: int) -> Hold:
        """Record durably that the table is set aside (the reason row carries the unit's batch)."""
        hold = self.tables.get(key)
        self._append([{"db": key[0], "table": key[1], "seq": batch, "env": None, "reason": reason}])
        if hold is None:
            hold = self.tables[key] = Hold(reason, batch)
        hold.reason = reason
        return hold

    def keep(self, key: tuple[str, str], events: Sequence[tuple[int, dict[str, Any]]]) -> int:
        """Append the table's changes the held table lacks; returns how many."""
        hold = self.tables[key]
        fresh = [(seq, env) for seq, env in events if seq > hold.kept]
        if fresh:
            self._append([{"db": key[0], "table": key[1], "seq": seq, "env": envelope.encode(env), "reason": None}
                          for seq, env in fresh])
            hold.kept = fresh[-1][0]
        return len(fresh)

    def events(self, key: tuple[str, str]) -> list[tuple[int, dict[str, Any]]]:
        """The kept changes of a held table, in CDC order."""
        rows = self.spark.sql(
            f"SELECT seq, env FROM {self.ident} WHERE db = {sql_string(key[0])} AND `table` = {sql_string(key[1])} "
            f"AND env IS NOT NULL ORDER BY seq").collect()
        return [(int(r["seq"]), envelope.as_dict(envelope.decode(bytes(r["env"])))) for r in rows]

    def release(self, key: tuple[str, str]) -> None:
        """The table loads again: forget its kept changes (the lake holds them now)."""
        self.spark.sql(f"DELETE FROM {self.ident} WHERE db = {sql_string(key[0])} AND `table` = {sql_string(key[1])}")
        self.tables.pop(key, None)

    def _append(self, rows: list[dict[str, Any]]) -> None:
        table = pa.Table.from_pylist(rows, schema=_SCHEMA)
        df = arrow_to_spark(self.spark, table, {c: t for c, t in _COLUMNS.items() if c != "at"})
        df.selectExpr("*", "current_timestamp() AS at").writeTo(self.ident).append()

"""Reading the lake at its newest committed batch, or as of any batch.

The current-state table is only merged now and then; `live_frame` folds the changelog tail
into it (the `__live` view's query), so a reader sees every committed batch. `as_of` finds,
per table, the snapshots that held batch `seq`: all tables as of one batch (a consistent
cut), through Iceberg time travel.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from services.loader.iceberg import Iceberg, Marker
from services.loader.merges import Fold, live_sql
from services.loader.naming import BOOK_NAMESPACE, COMMITS_TABLE, TableNames, quote
from services.loader.tables import KEY_PROP, lake_source


@dataclass(frozen=True)
class TableAsOf:
    """One table at one batch: the snapshots to read (None: the table had no commit yet)."""

    names: TableNames
    current_snapshot: int | None
    changelog_snapshot: int | None
    merged: Marker
    appended: Marker
    seq: int | None = None  # the batch asked for (None: the tables as they are)


def last_batch(spark: SparkSession, catalog: str) -> int:
    """The newest batch every table it touched has committed (0 before the first)."""
    ident = f"{quote(catalog)}.{quote(BOOK_NAMESPACE)}.{quote(COMMITS_TABLE)}"
    if not spark.catalog.tableExists(ident):
        return 0
    return int(spark.sql(f"SELECT coalesce(max(seq), 0) FROM {ident}").collect()[0][0])


def tables(spark: SparkSession, catalog: str) -> list[TableNames]:
    """Every source table the lake holds."""
    ice = Iceberg(spark, catalog)
    out = []
    for ns in ice.namespaces():
        for name in ice.tables(ns):
            found = lake_source(ice, ns, name)
            if found is not None and found[2] == "current":
                out.append(TableNames(catalog, found[0], found[1]))
    return sorted(out, key=lambda n: (n.db, n.table))


def as_of(spark: SparkSession, names: TableNames, seq: int | None = None) -> TableAsOf | None:
    """The snapshots of a table that reflect batch `seq` (default: the newest)."""
    ice = Iceberg(spark, names.catalog)
    if not ice.exists(names.current) or not ice.exists(names.changelog):
        return None

    def pick(ident: str) -> tuple[int | None, Marker]:
        best: tuple[int | None, Marker] = (None, Marker())
        for _, snapshot_id, marker in ice.history(ident):
            if marker is not None and (seq is None or marker.batch <= seq) and marker >= best[1]:
                best = (snapshot_id, marker)
        return best

    current, merged = pick(names.current)
    changelog, appended = pick(names.changelog)
    if seq is None:  # the tables as they are (their newest schema, too)
        current = changelog = None
    return TableAsOf(names, current, changelog, merged, appended, seq)


def live_frame(spark: SparkSession, catalog: str, db: str, table: str, seq: int | None = None) -> DataFrame | None:
    """The table's rows with every committed change folded in (as of batch `seq`, default newest)."""
    names = TableNames(catalog, db, table)
    at = as_of(spark, names, seq)
    if at is None:
        return None
    return spark.sql(live_query(spark, at))


def live_query(spark: SparkSession, at: TableAsOf) -> str:
    ice = Iceberg(spark, at.names.catalog)
    names = at.names
    if at.current_snapshot is not None:
        current = f"{names.current} VERSION AS OF {at.current_snapshot}"
    elif at.seq is not None:  # nothing merged by batch seq: the current table was still empty
        current = f"(SELECT * FROM {names.current} WHERE false)"
    else:
        current = names.current
    changelog = names.changelog if at.changelog_snapshot is None else \
        f"{names.changelog} VERSION AS OF {at.changelog_snapshot}"
    df = spark.sql(f"SELECT * FROM {current} LIMIT 0")
    columns = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    key = list(json.loads(ice.props(names.current).get(KEY_PROP, "[]")))
    return live_sql(Fold(current, changelog, columns, [k for k in key if k in columns], at.merged.order,
                         at.appended.order))

"""Consistent cuts: every current table as of one batch, for readers that know only Iceberg.

Current tables are merged now and then, and a DDL merges its own table on the spot, so
their newest snapshots reflect different batches: a plain join of two of them can show
half of a source transaction. When merges are due the lake merges every table's tail at
one batch B (`Lake.merge_all`), then publishes cut B here:

```
<catalog>._binlake.cuts   cut, source_db, source_table, lake_namespace, lake_table, snapshot_id, published_at
```
one row per current table, all rows of one cut in one INSERT (one Iceberg commit), so a
reader sees a cut whole or not at all. The reader's rule: take `max(cut)`, read each table
of that cut `VERSION AS OF snapshot_id` (NULL: empty as of the cut); a table that has no row
in that cut was created after it and is empty as of B.

After the commit each current table's tag `binlake_cut` is moved to its snapshot in the
newest cut: tags keep those snapshots from expiry, and engines that can name a tag read one
table as of the newest cut. Tags cannot move atomically across tables, so they are not the
rule for reading several tables. A kill between the merges of one cut publishes nothing;
the restarted loader merges what is left and publishes a cut then (`Lake.open`), and moves
tags a kill left behind. A RENAME TABLE publishes a cut at the end of its unit: the hadoop
catalog renames by copying, and the old name's snapshots go with its folder.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import SparkSession

from services.loader.iceberg import Iceberg
from services.loader.naming import BOOK_NAMESPACE, CUT_TAG, CUTS_TABLE, TableNames, quote, sql_string

COLUMNS = {"cut": "bigint", "source_db": "string", "source_table": "string", "lake_namespace": "string",
           "lake_table": "string", "snapshot_id": "bigint", "published_at": "timestamp"}


class Cuts:
    """The cuts table of one catalog, and the `binlake_cut` tags."""

    def __init__(self, spark: SparkSession, ice: Iceberg, catalog: str) -> None:
        self.spark = spark
        self.ice = ice
        self.ident = f"{quote(catalog)}.{quote(BOOK_NAMESPACE)}.{quote(CUTS_TABLE)}"
        self.newest = 0  # the newest published cut (0: none yet)

    def open(self) -> int:
        self.ice.create(self.ident, COLUMNS, {})
        row = self.spark.sql(f"SELECT max(cut) FROM {self.ident}").collect()[0][0]
        self.newest = int(row or 0)
        return self.newest

    def publish(self, cut: int, tables: Sequence[TableNames]) -> dict[TableNames, int | None]:
        """Record cut `cut`: every table's current snapshot, in one commit. Returns the snapshots."""
        snapshots = {names: self.ice.snapshot_id(names.current) for names in tables}
        values = ", ".join(
            f"({cut}, {', '.join(sql_string(v) for v in (n.db, n.table, n.namespace, n.current_name))}, "
            f"{'NULL' if sid is None else sid}, current_timestamp())" for n, sid in snapshots.items())
        if values:
            self.spark.sql(f"INSERT INTO {self.ident} VALUES {values}")
        self.newest = cut
        self.tag(snapshots)
        return snapshots

    def newest_snapshots(self, tables: Sequence[TableNames]) -> dict[TableNames, int | None]:
        """The snapshots the newest cut names, of those of `tables` it holds."""
        if not self.newest:
            return {}
        rows = self.spark.sql(f"SELECT lake_namespace, lake_table, snapshot_id FROM {self.ident} "
                              f"WHERE cut = {self.newest}").collect()
        found = {(str(r[0]), str(r[1])): (None if r[2] is None else int(r[2])) for r in rows}
        return {n: found[(n.namespace, n.current_name)] for n in tables if (n.namespace, n.current_name) in found}

    def tag(self, snapshots: dict[TableNames, int | None]) -> None:
        """Point each table's `binlake_cut` tag at its snapshot (no commit where it is there already)."""
        for names, sid in snapshots.items():
            if sid is not None and self.ice.tag(names.current, CUT_TAG) != sid and self.ice.has_snapshot(
                    names.current, sid):  # gone when a RENAME copied the table (hadoop catalog)
                self.ice.set_tag(names.current, CUT_TAG, sid)

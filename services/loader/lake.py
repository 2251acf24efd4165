"""The lake on Spark: per source table a changelog and a snapshot, switched atomically.

Layout under `root` (any Hadoop file system):

```
<root>/<name>/changelog/_batch=<seq>/      every change, append-only, one folder per batch
<root>/<name>/snapshot/_version=<seq>/     the whole current table, one folder per version
<root>/_binlake_commit.json                {"seq": <last committed CDC sequence>}
```

A batch writes its new folders first (invisible: they are above the committed sequence),
registers them as partitions, and then commits by switching ONE pointer: the view
`<db>._binlake_commit` in the catalog and the commit file beside the data (write +
rename). The catalog views `<name>` (snapshot) and `<name>__changelog` read only what is at
or below that pointer, so every table of a batch becomes visible at once or not at all.
After a crash, folders above the pointer are dropped and the batch is done again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from services.loader.frames import BOOKKEEPING, PREV_KEY, TableChanges
from services.loader.types import spark_type

COMMIT_FILE = "_binlake_commit.json"
KEEP_VERSIONS = 2


def lake_name(db: str, table: str) -> str:
    """The lake table name of a source table: `<db>__<table>`, lower case, [a-z0-9_] only."""
    return re.sub(r"[^a-z0-9_]", "_", f"{db}__{table}".lower())


@dataclass
class _Table:
    name: str
    versions: list[int]  # committed snapshot versions, ascending
    columns: dict[str, str]  # data column -> Spark type, in order


class Lake:
    def __init__(self, spark: SparkSession, database: str, root: str) -> None:
        self.spark = spark
        self.db = database
        self.root = root.rstrip("/")
        self.committed = 0
        self._tables: dict[str, _Table] = {}
        self.log = structlog.get_logger().bind(actor="lake")
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm
        self._fs = jvm.org.apache.hadoop.fs.Path(self.root).getFileSystem(
            spark.sparkContext._jsc.hadoopConfiguration())

    # -- files ------------------------------------------------------------------------

    def _path(self, *parts: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path("/".join([self.root, *parts]))

    def _read_text(self, rel: str) -> str | None:
        path = self._path(rel)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            reader = self._jvm.java.io.BufferedReader(self._jvm.java.io.InputStreamReader(stream, "UTF-8"))
            return str(reader.readLine())
        finally:
            stream.close()

    def _write_atomic(self, rel: str, text: str) -> None:
        tmp, final = self._path(rel + ".tmp"), self._path(rel)
        out = self._fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        self._fs.delete(final, False)
        if not self._fs.rename(tmp, final):
            raise OSError(f"could not rename {tmp} to {final}")

    def _delete(self, rel: str) -> None:
        self._fs.delete(self._path(rel), True)

    # -- start-up ----------------------------------------------------------------------

    def open(self) -> int:
        """Create the database, read the commit pointer, drop whatever a crash left above it."""
        self.spark.sql(f"CREATE DATABASE IF NOT EXISTS `{self.db}`")
        self.committed = self._read_commit()
        self._set_commit_view(self.committed)
        for row in self.spark.sql(f"SHOW TABLES IN `{self.db}`").collect():
            name = str(row.tableName)
            if name.endswith("__snapshot_all"):
                self._recover(name[: -len("__snapshot_all")])
        return self.committed

    def _read_commit(self) -> int:
        text = self._read_text(COMMIT_FILE)
        if text is not None:
            return int(json.loads(text)["seq"])
        # A kill between `_write_atomic` deleting the old pointer and renaming the new one
        # leaves the new one, complete, in the .tmp file (a .tmp cut short while being written
        # still has its old pointer beside it, unless it was the very first commit).
        text = self._read_text(COMMIT_FILE + ".tmp")
        try:
            return int(json.loads(text)["seq"]) if text else 0
        except (ValueError, KeyError, TypeError):
            return 0

    def _recover(self, name: str) -> None:
        versions = self._partitions(f"{name}__snapshot_all", "_version")
        for kind, column in (("snapshot", "_version"), ("changelog", "_batch")):
            for value in self._partitions(f"{name}__{kind}_all", column):
                if value > self.committed:
                    self._drop_partition(name, kind, column, value)
            # Folders written but not registered yet when the crash came (file readers see them).
            folder = self._path(name, kind)
            if self._fs.exists(folder):
                for status in self._fs.listStatus(folder):
                    part = str(status.getPath().getName())
                    value_text = part[len(column) + 1:]
                    if part.startswith(column + "=") and value_text.isdigit() and int(value_text) > self.committed:
                        self._fs.delete(status.getPath(), True)
        columns = {f.name: f.dataType.simpleString() for f in self.spark.table(f"`{self.db}`.`{name}__snapshot_all`")
                   .schema.fields if f.name != "_version"}
        self._tables[name] = _Table(name, sorted(v for v in versions if v <= self.committed), columns)

    def _partitions(self, table: str, column: str) -> list[int]:
        rows = self.spark.sql(f"SHOW PARTITIONS `{self.db}`.`{table}`").collect()
        return sorted(int(str(r[0]).split("=", 1)[1]) for r in rows if str(r[0]).startswith(column + "="))

    def _drop_partition(self, name: str, kind: str, column: str, value: int) -> None:
        self.spark.sql(f"ALTER TABLE `{self.db}`.`{name}__{kind}_all` DROP IF EXISTS PARTITION ({column}={value})")
        self._delete(f"{name}/{kind}/{column}={value}")

    # -- one batch --------------------------------------------------------------------

    def apply(self, seq: int, tables: Iterable[TableChanges]) -> None:
        """Write a batch ending at CDC sequence `seq` and commit it."""
        for changes in tables:
            self._write_table(seq, changes)
        self.commit(seq)

    def commit(self, seq: int) -> None:
        self._set_commit_view(seq)
        self._write_atomic(COMMIT_FILE, json.dumps({"seq": seq}))
        self.committed = seq
        for table in self._tables.values():
            for old in table.versions[:-KEEP_VERSIONS]:
                self._drop_partition(table.name, "snapshot", "_version", old)
            table.versions = table.versions[-KEEP_VERSIONS:]

    def _set_commit_view(self, seq: int) -> None:
        self.spark.sql(f"CREATE OR REPLACE VIEW `{self.db}`.`_binlake_commit` AS SELECT CAST({seq} AS BIGINT) AS seq")

    def _write_table(self, seq: int, changes: TableChanges) -> None:
        name = lake_name(changes.db, changes.table)
        table = self._tables.get(name)
        if not changes.segments and (not changes.reset_seq or table is None) and not changes.renames:
            return  # DDL only: the data changes with the next rows (new columns come with them)
        types = {c["name"]: spark_type(c) for c in changes.columns}
        changelog = self._changelog_frame(changes, types)
        if table is None:
            table = self._create(name, types)
        renamed = {new: table.columns[old] for old, new in changes.renames
                   if old in table.columns and new not in table.columns and new not in types}
        if any(c not in table.columns for c in types) or renamed:
            self._add_columns(table, {**types, **renamed})
        if changelog is not None:
            book = [F.col(f.name) for f in BOOKKEEPING]
            data = [F.col(f"`{c}`") for c in types]
            self._write_partition(changelog.select(*book, *data), name, "changelog", "_batch", seq)
        snapshot = self._next_snapshot(table, changes, changelog)
        self._write_partition(snapshot, name, "snapshot", "_version", seq)
        table.versions.append(seq)

    def _changelog_frame(self, changes: TableChanges, types: dict[str, str]) -> DataFrame | None:
        frames = []
        for arrow in changes.arrow_segments():
            df = self.spark.createDataFrame(arrow)
            casts = [F.col(f"`{c}`").cast(types.get(c, "string")).alias(c) if c in types else F.col(f"`{c}`")
                     for c in df.columns]
            frames.append(df.select(*casts))
        if not frames:
            return None
        out = frames[0]
        for df in frames[1:]:
            out = out.unionByName(df, allowMissingColumns=True)
        return out

    def _next_snapshot(self, table: _Table, changes: TableChanges, changelog: DataFrame | None) -> DataFrame:
        """Previous version + this batch's changes: per key the last change wins, deletes remove."""
        data_cols = list(table.columns)
        key = changes.pk or data_cols
        empty = self.spark.createDataFrame([], self._schema(table.columns))
        prev = empty
        if table.versions and not changes.reset_seq:
            prev = self.spark.read.schema(self._schema(table.columns)).parquet(
                self._path(table.name, "snapshot", f"_version={table.versions[-1]}").toString())
        for old, new in changes.renames:
            # Rows written before a RENAME COLUMN keep their value under the new name too.
            if old in prev.columns and new in prev.columns:
                prev = prev.withColumn(new, F.coalesce(F.col(f"`{new}`"), F.col(f"`{old}`")))
        prev = prev.withColumn("_ord", F.lit(-1).cast("bigint")).withColumn("_del", F.lit(False))
        if changelog is None:
            return prev.filter(F.lit(False)).select(*[F.col(f"`{c}`") for c in data_cols]) \
                if changes.reset_seq else prev.select(*[F.col(f"`{c}`") for c in data_cols])
        ch = changelog
        if changes.reset_seq:
            ch = ch.filter(F.col("_seq") > changes.reset_seq)
        order = (F.col("_seq") * F.lit(1_000_000) + F.col("_row")) * F.lit(2) + F.lit(1)
        rows = ch.select(*[F.col(f"`{c}`") for c in data_cols if c in ch.columns],
                         order.alias("_ord"), (F.col("_op") == "d").alias("_del"))
        moved = [ch.filter(F.col(f"`{PREV_KEY}{k}`").isNotNull()) for k in changes.pk[:1]]
        parts = [prev, rows]
        for m in moved:  # an update that changed the key removes the old key just before it
            parts.append(m.select(*[F.col(f"`{PREV_KEY}{k}`").alias(k) for k in changes.pk],
                                  ((F.col("_seq") * F.lit(1_000_000) + F.col("_row")) * F.lit(2)).alias("_ord"),
                                  F.lit(True).alias("_del")))
        merged = parts[0]
        for p in parts[1:]:
            merged = merged.unionByName(p, allowMissingColumns=True)
        w = Window.partitionBy(*[F.col(f"`{k}`") for k in key]).orderBy(F.col("_ord").desc())
        latest = merged.withColumn("_rank", F.row_number().over(w)).filter("_rank = 1 AND NOT _del")
        return latest.select(*[F.col(f"`{c}`").cast(t).alias(c) for c, t in table.columns.items()])

    def _write_partition(self, df: DataFrame, name: str, kind: str, column: str, value: int) -> None:
        path = self._path(name, kind, f"{column}={value}").toString()
        df.write.mode("overwrite").parquet(path)
        self.spark.sql(f"ALTER TABLE `{self.db}`.`{name}__{kind}_all` ADD IF NOT EXISTS "
                       f"PARTITION ({column}={value}) LOCATION '{path}'")

    # -- catalog ----------------------------------------------------------------------

    @staticmethod
    def _schema(columns: dict[str, str]) -> StructType:
        schema = StructType.fromDDL(", ".join(f"`{c}` {t}" for c, t in columns.items()))
        assert isinstance(schema, StructType)
        return schema

    def _create(self, name: str, types: dict[str, str]) -> _Table:
        cols = ", ".join(f"`{c}` {t}" for c, t in types.items())
        book = ", ".join(f"`{f.name}` {_book_type(f.name)}" for f in BOOKKEEPING)
        base = self._path(name).toString()
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS `{self.db}`.`{name}__changelog_all` ({book}, {cols}, "
                       f"_batch BIGINT) USING parquet PARTITIONED BY (_batch) LOCATION '{base}/changelog'")
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS `{self.db}`.`{name}__snapshot_all` ({cols}, _version BIGINT) "
                       f"USING parquet PARTITIONED BY (_version) LOCATION '{base}/snapshot'")
        table = _Table(name, [], dict(types))
        self._tables[name] = table
        self._create_views(table)
        return table

    def _add_columns(self, table: _Table, types: dict[str, str]) -> None:
        new = {c: t for c, t in types.items() if c not in table.columns}
        cols = ", ".join(f"`{c}` {t}" for c, t in new.items())
        for kind in ("changelog", "snapshot"):
            self.spark.sql(f"ALTER TABLE `{self.db}`.`{table.name}__{kind}_all` ADD COLUMNS ({cols})")
        table.columns.update(new)
        self.log.info("lake.columns_added", table=table.name, columns=sorted(new))
        self._create_views(table)

    def _create_views(self, table: _Table) -> None:
        cols = ", ".join(f"`{c}`" for c in table.columns)
        commit = f"(SELECT seq FROM `{self.db}`.`_binlake_commit`)"
        snap = f"`{self.db}`.`{table.name}__snapshot_all`"
        self.spark.sql(f"CREATE OR REPLACE VIEW `{self.db}`.`{table.name}` AS SELECT {cols} FROM {snap} "
                       f"WHERE _version = (SELECT max(_version) FROM {snap} WHERE _version <= {commit})")
        book = ", ".join(f"`{f.name}`" for f in BOOKKEEPING)
        self.spark.sql(f"CREATE OR REPLACE VIEW `{self.db}`.`{table.name}__changelog` AS SELECT {book}, {cols} "
                       f"FROM `{self.db}`.`{table.name}__changelog_all` WHERE _batch <= {commit}")


def _book_type(name: str) -> str:
    return {"_op": "string", "_seq": "bigint", "_row": "int", "_scn": "bigint", "_ts": "timestamp",
            "_pos": "string", "_gtid": "string"}[name]

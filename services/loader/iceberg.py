"""Iceberg tables through Spark: create, evolve, append and commit with the lake's markers.

Every commit binlake makes carries `binlake.seq` (the highest BINLAKE_CDC sequence the table
reflects) and `binlake.scn`/`binlake.pos` (the source order key `<scn>:<seq>` of the last
change applied) in its snapshot summary. The markers are how a redelivered batch is skipped
(exactly once) and how readers find a table as of a batch. Appends take them as write
options; MERGE, UPDATE and DELETE through `CommitMetadata.withCommitProperties`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from services.loader.naming import quote

SEQ, ORDER = "binlake.seq", "binlake.order"
TABLE_PROPS = {
    "format-version": "2",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    "write.parquet.compression-codec": "zstd",
}


@dataclass(frozen=True, order=True)
class Marker:
    """Where a lake table stands: the source order key of its last change, and the batch seq."""

    scn: int = 0
    seq: int = 0  # CDC sequence of that last change (orders chunks of one event)
    batch: int = 0  # the highest CDC sequence reflected (monotone; the cut across tables)

    @property
    def order(self) -> tuple[int, int]:
        return self.scn, self.seq

    def props(self) -> dict[str, str]:
        return {SEQ: str(self.batch), ORDER: f"{self.scn}:{self.seq}"}

    @classmethod
    def from_summary(cls, summary: Mapping[str, str]) -> Marker | None:
        if SEQ not in summary:
            return None
        scn, _, seq = str(summary.get(ORDER, "0:0")).partition(":")
        return cls(int(scn), int(seq or 0), int(summary[SEQ]))


class _Callable:
    """A py4j java.util.concurrent.Callable around a Python function."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self._fn = fn
        self.error: BaseException | None = None

    def call(self) -> None:
        try:
            self._fn()
        except BaseException as exc:  # re-raised in Python after the Java frame returns
            self.error = exc
            raise
        return None

    class Java:
        implements = ["java.util.concurrent.Callable"]


class Iceberg:
    """The Iceberg operations of one Spark session on catalog `catalog`."""

    def __init__(self, spark: SparkSession, catalog: str) -> None:
        self.spark = spark
        self.catalog = catalog
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm
        self._callbacks = False
        self._callbacks_lock = threading.Lock()  # the lake's writer threads may each be the first

    def sql(self, text: str) -> DataFrame:
        return self.spark.sql(text)

    # -- catalog ----------------------------------------------------------------------

    def create_namespace(self, namespace: str) -> None:
        self.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(self.catalog)}.{quote(namespace)}")

    def namespaces(self) -> list[str]:
        return [str(r[0]) for r in self.sql(f"SHOW NAMESPACES IN {quote(self.catalog)}").collect()]

    def tables(self, namespace: str) -> list[str]:
        rows = self.sql(f"SHOW TABLES IN {quote(self.catalog)}.{quote(namespace)}").collect()
        return [str(r["tableName"]) for r in rows]

    def exists(self, ident: str) -> bool:
        return bool(self.spark.catalog.tableExists(ident))

    def create(self, ident: str, columns: Mapping[str, str], props: Mapping[str, str]) -> None:
        cols = ", ".join(f"{quote(c)} {t}" for c, t in columns.items())
        all_props = {**TABLE_PROPS, **props}
        text = ", ".join(f"'{k}'='{_sql_text(v)}'" for k, v in all_props.items())
        self.sql(f"CREATE TABLE IF NOT EXISTS {ident} ({cols}) USING iceberg TBLPROPERTIES ({text})")

    def drop(self, ident: str) -> None:
        self.sql(f"DROP TABLE IF EXISTS {ident} PURGE")

    def rename(self, ident: str, to: str) -> None:
        self.sql(f"ALTER TABLE {ident} RENAME TO {to}")

    def set_props(self, ident: str, props: Mapping[str, str]) -> None:
        text = ", ".join(f"'{k}'='{_sql_text(v)}'" for k, v in props.items())
        self.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({text})")

    def props(self, ident: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in dict(self._table(ident).properties()).items()}

    # -- schema -----------------------------------------------------------------------

    def columns(self, ident: str) -> dict[str, str]:
        """Column -> Spark SQL type, in table order."""
        return {f.name: f.dataType.simpleString() for f in self.spark.table(ident).schema.fields}

    def add_columns(self, ident: str, columns: Mapping[str, str]) -> None:
        if columns:
            cols = ", ".join(f"{quote(c)} {t}" for c, t in columns.items())
            self.sql(f"ALTER TABLE {ident} ADD COLUMNS ({cols})")

    def drop_column(self, ident: str, column: str) -> None:
        self.sql(f"ALTER TABLE {ident} DROP COLUMN {quote(column)}")

    def rename_column(self, ident: str, old: str, new: str) -> None:
        self.sql(f"ALTER TABLE {ident} RENAME COLUMN {quote(old)} TO {quote(new)}")

    def promote(self, ident: str, column: str, spark_type: str) -> None:
        self.sql(f"ALTER TABLE {ident} ALTER COLUMN {quote(column)} TYPE {spark_type}")

    def move_after(self, ident: str, column: str, after: str | None) -> None:
        where = "FIRST" if after is None else f"AFTER {quote(after)}"
        self.sql(f"ALTER TABLE {ident} ALTER COLUMN {quote(column)} {where}")

    # -- commits ----------------------------------------------------------------------

    def append(self, df: DataFrame, ident: str, marker: Marker) -> None:
        writer = df.writeTo(ident)
        for key, value in marker.props().items():
            writer = writer.option(f"snapshot-property.{key}", value)
        writer.append()

    def run_marked(self, marker: Marker, statement: str) -> None:
        """Run a MERGE / UPDATE / DELETE / INSERT whose commit carries the marker."""
        self.commit_with(marker, lambda: self.sql(statement).collect())

    def commit_with(self, marker: Marker, fn: Callable[[], object]) -> None:
        """Run `fn` (MERGE / UPDATE / DELETE statements) with the marker on every commit it makes."""
        with self._callbacks_lock:
            if not self._callbacks:
                gateway = self.spark.sparkContext._gateway
                assert gateway is not None
                gateway.start_callback_server()  # idempotent; py4j calls the Callable back through it
                self._callbacks = True
        props = self._jvm.java.util.HashMap()
        for key, value in marker.props().items():
            props.put(key, value)
        call = _Callable(fn)
        try:
            self._jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
                props, call, self._jvm.java.lang.RuntimeException().getClass())
        except Exception:
            if call.error is not None:
                raise call.error from None
            raise

    def marker(self, ident: str) -> Marker | None:
        """The marker of the table's current snapshot (walking back over unmarked commits)."""
        snapshot = self._table(ident).currentSnapshot()
        table = self._table(ident)
        while snapshot is not None:
            found = Marker.from_summary(dict(snapshot.summary()))
            if found is not None:
                return found
            parent = snapshot.parentId()
            snapshot = table.snapshot(parent) if parent is not None else None
        return None

    def snapshot_id(self, ident: str) -> int | None:
        snapshot = self._table(ident).currentSnapshot()
        return None if snapshot is None else int(snapshot.snapshotId())

    def tag(self, ident: str, name: str) -> int | None:
        """The snapshot id tag `name` points at (None: no such tag)."""
        ref = self._table(ident).refs().get(name)
        return None if ref is None or not ref.isTag() else int(ref.snapshotId())

    def has_snapshot(self, ident: str, snapshot_id: int) -> bool:
        return self._table(ident).snapshot(snapshot_id) is not None

    def set_tag(self, ident: str, name: str, snapshot_id: int) -> None:
        self.sql(f"ALTER TABLE {ident} CREATE OR REPLACE TAG {quote(name)} AS OF VERSION {snapshot_id}")

    def history(self, ident: str) -> list[tuple[int, int, Marker | None]]:
        """(committed at ms, snapshot id, marker) of every retained snapshot, oldest first."""
        out = []
        for s in self._table(ident).snapshots():
            out.append((int(s.timestampMillis()), int(s.snapshotId()), Marker.from_summary(dict(s.summary()))))
        return sorted(out)

    def refresh(self, ident: str) -> None:
        self.spark.catalog.refreshTable(ident)

    def _table(self, ident: str) -> Any:
        return self._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(self.spark._jsparkSession, ident)

    def java_table(self, ident: str) -> Any:
        return self._table(ident)

    def actions(self) -> Any:
        return self._jvm.org.apache.iceberg.spark.actions.SparkActions.get(self.spark._jsparkSession)


def _sql_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def json_prop(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)

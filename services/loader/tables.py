"""One source table in the lake: its changelog and current-state tables, and what the loader knows of them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyspark
import structlog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType, _parse_datatype_string

from services.loader import frames
from services.loader.frames import BOOKKEEPING, PREV, Ddl, Replace
from services.loader.iceberg import Iceberg, Marker, json_prop
from services.loader.merges import Fold, open_replace_sql, tail_count_sql
from services.loader.naming import BOOK_NAMESPACE, CHANGELOG_SUFFIX, TableNames, hashed, quote, source_of
from services.loader.types import arrow_of_spark, spark_type
from shared.envelope import REPLACE
from shared.errors import FatalError

if TYPE_CHECKING:
    from services.loader.lake import Lake

KEY_PROP, SOURCE_PROP = "binlake.key", "binlake.source"
DROPPED_PROP = "binlake.dropped"  # "true" from a DROP TABLE until the table is created again
# The source's column descriptions (the envelope's schema) as the last rows carried them: a MODIFY
# that keeps the lake type is compared with them (precision, length, members, charset).
SOURCE_COLUMNS_PROP = "binlake.source-columns"
_BOOK_TYPES = {"_binlake_op": "string", "_binlake_seq": "bigint", "_binlake_row": "int", "_binlake_scn": "bigint",
               "_binlake_ts": "timestamp", "_binlake_pos": "string", "_binlake_gtid": "string",
               "_binlake_ddl": "string"}
log = structlog.get_logger()


def source_prop(names: TableNames) -> str:
    """The `binlake.source` property: the source table's real name, `["db", "table"]` (JSON)."""
    return json_prop([names.db, names.table])


def lake_source(ice: Iceberg, namespace: str, name: str) -> tuple[str, str, str] | None:
    """`naming.source_of`, and for a `hashed` identifier the name its `binlake.source` property holds."""
    found = source_of(namespace, name)
    if found is not None or namespace == BOOK_NAMESPACE or not (hashed(namespace) or hashed(name.removesuffix(
            CHANGELOG_SUFFIX))):
        return found
    prop = ice.props(f"{quote(ice.catalog)}.{quote(namespace)}.{quote(name)}").get(SOURCE_PROP)
    if prop is None:
        return None
    db, table = (str(v) for v in json.loads(prop))
    names = TableNames(ice.catalog, db, table)
    if names.namespace != namespace or name not in (names.current_name, names.changelog_name):
        return None  # a copied property: not this table's name
    return db, table, "changelog" if name == names.changelog_name else "current"


def book_columns(data: Mapping[str, str], prev: Sequence[str]) -> dict[str, str]:
    """The changelog's columns: bookkeeping, data, before images."""
    out = {f.name: _BOOK_TYPES[f.name] for f in BOOKKEEPING}
    out.update(data)
    out.update({PREV + c: data[c] for c in prev})
    return out


class ReservedColumn(FatalError):
    """A column named like the lake's bookkeeping that did not go through `naming.lake_column`."""


def data_types(columns: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    names = [str(c["name"]) for c in columns]
    reserved = [n for n in names if n.lower().startswith(frames.BOOK_PREFIX)]
    if reserved:
        raise ReservedColumn(
            f"column(s) {reserved} start with {frames.BOOK_PREFIX!r}, which the lake keeps for its bookkeeping "
            "columns; source columns reach the lake through frames.lake_columns, which renames them (a bug)")
    return {str(c["name"]): spark_type(dict(c)) for c in columns}


@dataclass
class LakeTable:
    names: TableNames
    columns: dict[str, str]  # the current table's columns -> Spark type, in order
    key: list[str]
    changelog_columns: dict[str, str]
    appended: Marker = field(default_factory=Marker)  # the changelog's marker
    merged: Marker = field(default_factory=Marker)  # the current table's marker
    tail_rows: int = 0
    tail_since: float | None = None
    dropped: bool = False  # the source dropped the table; a CREATE ... IF NOT EXISTS creates it again
    source_columns: dict[str, dict[str, Any]] = field(default_factory=dict)  # SOURCE_COLUMNS_PROP
    replacing: bool = False  # the tail may hold a keyless snapshot's `replace` (merges.Fold.replacing)
    replace_open: bool = False  # its last `replace` has no `replaced` yet: the snapshot is not whole

    # -- lifecycle ----------------------------------------------------------------------------

    def mark_dropped(self, ice: Iceberg, dropped: bool) -> None:
        """Record (durably, a table property) whether the source's table is dropped."""
        if self.dropped != dropped:
            ice.set_props(self.names.current, {DROPPED_PROP: "true" if dropped else "false"})
            self.dropped = dropped

    @classmethod
    def load(cls, ice: Iceberg, names: TableNames) -> LakeTable | None:
        if not ice.exists(names.changelog):
            return None
        changelog_columns = ice.columns(names.changelog)
        if not ice.exists(names.current):  # killed between the two CREATEs
            data = {c: t for c, t in changelog_columns.items() if not c.startswith(frames.BOOK_PREFIX)}
            ice.create(names.current, data, {SOURCE_PROP: source_prop(names), KEY_PROP: "[]"})
        props = ice.props(names.current)
        table = cls(names, ice.columns(names.current), list(json.loads(props.get(KEY_PROP, "[]"))),
                    changelog_columns, ice.marker(names.changelog) or Marker(), ice.marker(names.current) or Marker(),
                    dropped=props.get(DROPPED_PROP) == "true",
                    source_columns=dict(json.loads(props.get(SOURCE_COLUMNS_PROP, "{}"))))
        lower = {c.lower() for c in changelog_columns}
        for name, kind in table.columns.items():  # a kill between two schema changes of one DDL
            # Another case of the name there: a case-only rename (or an ADD after a DROP) killed
            # between the tables; its redelivered DDL finishes it with the history kept.
            if name.lower() not in lower and not name.startswith(frames.BOOK_PREFIX):
                table._changelog_column(ice, name, kind)
        table.ensure_prev(ice)
        fold = Fold(names.current, names.changelog, table.columns, table.key, table.merged.order)
        table.tail_rows = int(ice.sql(tail_count_sql(fold)).collect()[0][0])
        table.tail_since = 0.0 if table.tail_rows else None  # merge soon after a restart
        table.replacing = not table.key and table.tail_rows > 0  # not known without a look: assume it
        if table.replacing:
            last = ice.sql(open_replace_sql(fold)).collect()
            table.replace_open = bool(last) and last[0][0] == REPLACE
        return table

    @classmethod
    def create(cls, ice: Iceberg, names: TableNames, columns: Sequence[Mapping[str, Any]],
               key: Sequence[str]) -> LakeTable:
        data = data_types(columns)
        prev = list(key) or list(data)
        props = {SOURCE_PROP: source_prop(names)}
        changelog_columns = book_columns(data, prev)
        ice.create(names.changelog, changelog_columns, props)
        described = {str(c["name"]): dict(c) for c in columns}
        ice.create(names.current, data, {**props, KEY_PROP: json_prop(list(key)),
                                         SOURCE_COLUMNS_PROP: json_prop(described)})
        log.info("lake.table_created", table=f"{names.db}.{names.table}", key=list(key))
        return cls(names, dict(data), list(key), changelog_columns, source_columns=described)

    def rename(self, ice: Iceberg, to: TableNames) -> None:
        """Follow a RENAME TABLE: an Iceberg rename, or a copy where the catalog has none (hadoop)."""
        try:
            ice.rename(self.names.changelog, to.changelog)
        except Exception as exc:
            if "Cannot rename" not in str(exc):
                raise
            self._copy_to(ice, to)
        else:
            ice.rename(self.names.current, to.current)
        self.names = to
        for ident in (to.current, to.changelog):
            ice.set_props(ident, {SOURCE_PROP: source_prop(to)})

    def _copy_to(self, ice: Iceberg, to: TableNames) -> None:
        """Copy both tables under the new names (keeping their markers), then drop the old ones.

        The hadoop catalog cannot rename (a table is its folder). The copy costs a table scan
        and the time-travel history of the old name; a kill midway leaves the old tables whole,
        and the redelivered RENAME copies again.
        """
        for src, dst, marker in ((self.names.changelog, to.changelog, self.appended),
                                 (self.names.current, to.current, self.merged)):
            ice.drop(dst)
            ice.create(dst, ice.columns(src), {k: v for k, v in ice.props(src).items() if k.startswith("binlake.")})
            ice.run_marked(marker, f"INSERT INTO {dst} SELECT * FROM {src}")
        ice.drop(self.names.changelog)
        ice.drop(self.names.current)

    def drop(self, ice: Iceberg) -> None:
        ice.drop(self.names.current)
        ice.drop(self.names.changelog)

    # -- columns ------------------------------------------------------------------------------

    def conform(self, lake: Lake, columns: Sequence[Mapping[str, Any]], key: Sequence[str]) -> None:
        """Make both tables hold the columns of rows written with `columns` (a schema seen in rows)."""
        ice = lake.ice
        wanted = data_types(columns)
        if list(key) != self.key:
            lake.flush(self, self.appended.batch)
            self.set_key(ice, list(key))
        for name, kind in wanted.items():
            have = self.columns.get(name)
            if have is None:
                self.add_column(ice, name, kind)
            elif have != kind:
                from services.loader.schema_change import retype

                lake.flush(self, self.appended.batch)
                retype(lake, self, name, kind, self.appended)
        self.ensure_prev(ice)
        described = {str(c["name"]): dict(c) for c in columns}
        if described != self.source_columns:
            ice.set_props(self.names.current, {SOURCE_COLUMNS_PROP: json_prop(described)})
            self.source_columns = described

    def add_column(self, ice: Iceberg, name: str, kind: str) -> None:
        if name not in self.columns:
            ice.add_columns(self.names.current, {name: kind})
            self.columns[name] = kind
        self._changelog_column(ice, name, kind)

    def _changelog_column(self, ice: Iceberg, name: str, kind: str) -> None:
        if self.changelog_columns.get(name) == kind:
            return
        self.make_room(ice, name)
        ice.add_columns(self.names.changelog, {name: kind})
        self.changelog_columns[name] = kind

    def make_room(self, ice: Iceberg, name: str, keep: str | None = None) -> None:
        """Set aside every changelog column but `keep` that Spark would take for `name`: an older
        column of that name (another type, a dropped column), or of that name in another case
        (Spark compares names without case; a kill inside a case-only rename leaves one)."""
        for other in [c for c in self.changelog_columns if c.lower() == name.lower() and c != keep]:
            self.set_aside(ice, other)

    def set_aside(self, ice: Iceberg, name: str) -> None:
        """Rename a changelog column out of the way (its history stays readable under the new name)."""
        aside = f"_binlake_was_{self.appended.seq}_{name}"
        n = 1
        while aside in self.changelog_columns:
            n += 1
            aside = f"_binlake_was_{self.appended.seq}_{n}_{name}"
        ice.rename_column(self.names.changelog, name, aside)
        self.changelog_columns[aside] = self.changelog_columns.pop(name)

    def ensure_prev(self, ice: Iceberg) -> None:
        for name in self.key or list(self.columns):
            kind = self.columns[name]
            prev = PREV + name
            if self.changelog_columns.get(prev) == kind:
                continue
            self.make_room(ice, prev)
            ice.add_columns(self.names.changelog, {prev: kind})
            self.changelog_columns[prev] = kind

    def set_key(self, ice: Iceberg, key: list[str]) -> None:
        ice.set_props(self.names.current, {KEY_PROP: json_prop(key)})
        self.key = key
        self.ensure_prev(ice)

    # -- commits ------------------------------------------------------------------------------

    def append(self, ice: Iceberg, df: DataFrame, marker: Marker, rows: int, now: float) -> None:
        ice.append(df, self.names.changelog, marker)
        self.appended = marker
        if rows:
            self.tail_rows += rows
            if self.tail_since is None:
                self.tail_since = now

    def record_ddl(self, ice: Iceberg, step: Ddl, batch: int) -> None:
        """Append the DDL statement to the changelog (its place among the rows, and the marker)."""
        self._record(ice, "ddl", step.seq, step.env, batch, step.sql, 0, 0.0)

    def record_replace(self, ice: Iceberg, step: Replace, batch: int, now: float) -> None:
        """Append a keyless snapshot's start (a tail row the fold starts over at) or its end to the changelog."""
        self._record(ice, step.op, step.seq, step.env, batch, None, 1, now)
        self.replacing = True
        self.replace_open = step.op == REPLACE

    def _record(self, ice: Iceberg, op: str, seq: int, env: Mapping[str, Any], batch: int, text: str | None,
                rows: int, now: float) -> None:
        if (int(env["scn"]), seq) <= self.appended.order:
            return  # recorded before (a redelivery): the marker never goes back
        pos = env.get("pos") or {}
        row = {"_binlake_op": op, "_binlake_seq": seq, "_binlake_row": 0, "_binlake_scn": int(env["scn"]),
               "_binlake_ts": int(env.get("ts") or 0), "_binlake_pos": f"{pos.get('file')}:{pos.get('offset')}",
               "_binlake_gtid": pos.get("gtid"), "_binlake_ddl": text}
        arrow = pa.Table.from_pylist([row], schema=BOOKKEEPING)
        marker = Marker(int(env["scn"]), seq, max(batch, self.appended.batch))
        self.append(ice, arrow_to_spark(ice.spark, arrow, self.changelog_columns), marker, rows, now)


# -- Arrow -> Spark ---------------------------------------------------------------------------------

def arrow_to_spark(spark: SparkSession, table: pa.Table, columns: Mapping[str, str]) -> DataFrame:
    """An Arrow table as a DataFrame with exactly `columns` (missing ones null), types cast exactly."""
    present = [c for c in columns if c in table.column_names]
    cast = pa.table([table[c].cast(arrow_of_spark(columns[c])) for c in present],
                    names=present)
    ddl = ", ".join(f"{quote(c)} {columns[c]}" for c in present)
    schema = _parse_datatype_string(ddl)
    assert isinstance(schema, StructType)
    df = _from_arrow(spark, cast, schema)
    return df.select(*[F.col(quote(c)) if c in present else F.lit(None).cast(t).alias(c) for c, t in columns.items()])


def _from_arrow(spark: SparkSession, table: pa.Table, schema: StructType) -> DataFrame:
    if int(pyspark.__version__.split(".")[0]) >= 4:
        return spark.createDataFrame(table, schema)  # type: ignore[call-overload,unused-ignore]
    # pyspark 3.5 takes pandas only; this is the Arrow half of its own pandas path, without pandas.
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer

    jvm = spark._jvm
    assert jvm is not None
    sc = spark.sparkContext
    jiter = sc._serialize_to_jvm(  # type: ignore[attr-defined,unused-ignore]
        table.combine_chunks().to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)],
        ArrowStreamSerializer(), lambda path: jvm.PythonSQLUtils.readArrowStreamFromFile(path),
        lambda: jvm.ArrowIteratorServer())
    jdf = jvm.PythonSQLUtils.toDataFrame(jiter, schema.json(), spark._jsparkSession)
    return DataFrame(jdf, spark)

"""`binlake verify`: does each lake snapshot equal its source table?

Both sides are rendered to the same canonical text per column (the DESIGN §4 mapping:
exact decimals, microsecond ISO timestamps in UTC, TIME as MySQL prints it, float32 values
by their shortest form, zero dates as null, binary as hex), then compared by row count and
an order-independent checksum (the sum of per-row hashes). When they differ, the primary
keys of the differing rows are listed. The lake is read from its files and commit pointer,
so verify works while the loader runs (an embedded Derby catalog admits one process only).
Lake-only columns (dropped in the source) are not compared.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from services.loader.lake import COMMIT_FILE, lake_name

_F32 = struct.Struct("<f")
_SOURCE_EXPR = {
    "bit": "CAST(`{c}` AS UNSIGNED)",
    "datetime": "DATE_FORMAT(`{c}`, '%Y-%m-%dT%H:%i:%s.%f')",
    "timestamp": "DATE_FORMAT(`{c}`, '%Y-%m-%dT%H:%i:%s.%f')",
}
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "json"}
_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry", "point", "linestring",
           "polygon", "multipoint", "multilinestring", "multipolygon", "geometrycollection"}


@dataclass
class Result:
    table: str
    source_rows: int
    lake_rows: int
    equal: bool
    differing_keys: list[tuple[Any, ...]] = field(default_factory=list)

    def line(self) -> str:
        if self.equal:
            return f"OK    {self.table}: {self.source_rows} rows"
        keys = ", ".join(map(str, self.differing_keys[:20]))
        more = f" (+{len(self.differing_keys) - 20} more)" if len(self.differing_keys) > 20 else ""
        return (f"DIFF  {self.table}: source {self.source_rows} rows, lake {self.lake_rows} rows; "
                f"differing keys: {keys}{more}")


def _normalize(kind: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    text = str(value)
    if kind == "float":
        f = _F32.unpack(_F32.pack(float(text)))[0]
        for digits in range(1, 10):
            if _F32.pack(float(f"{f:.{digits}g}")) == _F32.pack(f):
                return repr(float(f"{f:.{digits}g}"))
        return repr(f)
    if kind == "double":
        return repr(float(text))
    if kind in ("date", "datetime", "timestamp"):
        try:
            dt.date.fromisoformat(text[:10])
        except ValueError:
            return None  # zero or invalid dates are null in the lake
        return text
    if kind == "year":
        return str(int(text))
    if kind == "binary_hex":
        return text.lower()
    return text


def _row_hash(values: Sequence[str | None]) -> int:
    raw = "\x1f".join("\x00" if v is None else v for v in values).encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")


def source_rows(conn: Any, db: str, table: str, columns: Sequence[str]) -> tuple[list[str], dict[Any, int], int]:
    """(primary key columns, {key: row hash}, checksum) of a source table."""
    with conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_KEY FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (db, table))
        meta = [(str(r[0]), str(r[1]).lower(), str(r[2])) for r in cur.fetchall()]
        wanted = [m for m in meta if m[0] in columns]
        pk = [m[0] for m in meta if m[2] == "PRI"] or [m[0] for m in wanted]
        exprs = [_SOURCE_EXPR.get(t, "`{c}`" if t in _TEXT | _BINARY else "CAST(`{c}` AS CHAR)").format(c=n)
                 for n, t, _ in wanted]
        cur.execute(f"SELECT {', '.join(exprs)} FROM `{db}`.`{table}`")
        kinds = [_kind(t) for _, t, _ in wanted]
        names = [n for n, _, _ in wanted]
        hashes: dict[Any, int] = {}
        for row in cur.fetchall():
            values = [_normalize(k, v) for k, v in zip(kinds, row, strict=True)]
            key = tuple(values[names.index(k)] for k in pk)
            hashes[key] = _row_hash(values)
    return pk, hashes, sum(hashes.values()) % 2**64


def _kind(mysql_type: str) -> str:
    if mysql_type in ("float", "double", "date", "datetime", "timestamp", "year"):
        return mysql_type
    return "text"


def lake_snapshot(spark: SparkSession, root: str, db: str, table: str) -> DataFrame | None:
    """The committed snapshot of a table, read from its files (None if the lake has no such table)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path
    fs = path(root).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    commit_path = path(f"{root}/{COMMIT_FILE}")
    if not fs.exists(commit_path):
        return None
    stream = fs.open(commit_path)
    try:
        committed = int(json.loads(str(jvm.java.io.BufferedReader(
            jvm.java.io.InputStreamReader(stream, "UTF-8")).readLine()))["seq"])
    finally:
        stream.close()
    snap = path(f"{root}/{lake_name(db, table)}/snapshot")
    if not fs.exists(snap):
        return None
    versions = [int(str(s.getPath().getName()).split("=", 1)[1]) for s in fs.listStatus(snap)
                if str(s.getPath().getName()).startswith("_version=")]
    versions = [v for v in versions if v <= committed]
    if not versions:
        return None
    return spark.read.parquet(f"{root}/{lake_name(db, table)}/snapshot/_version={max(versions)}")


def lake_rows(df: DataFrame, columns: Sequence[str], pk: Sequence[str], kinds: dict[str, str],
              ) -> tuple[dict[Any, int], int]:
    exprs = []
    for c in columns:
        t = kinds[c]
        col = F.col(f"`{c}`")
        if t in ("timestamp", "timestamp_ntz"):
            exprs.append(F.date_format(col, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"))
        elif t.startswith("array"):
            exprs.append(F.when(col.isNull(), F.lit(None)).otherwise(F.concat_ws(",", col)))
        elif t == "binary":
            exprs.append(F.lower(F.hex(col)))
        else:
            exprs.append(col.cast("string"))
    lake_kinds = {c: ("binary_hex" if kinds[c] == "binary" else
                      "float" if kinds[c] == "float" else "double" if kinds[c] == "double" else
                      "date" if kinds[c] in ("date", "timestamp", "timestamp_ntz") else "text") for c in columns}
    hashes: dict[Any, int] = {}
    for row in df.select(*exprs).toLocalIterator():
        values = [_normalize(lake_kinds[c], v) for c, v in zip(columns, row, strict=True)]
        hashes[tuple(values[list(columns).index(k)] for k in pk)] = _row_hash(values)
    return hashes, sum(hashes.values()) % 2**64


def verify_table(spark: SparkSession, conn: Any, root: str, db: str, table: str) -> Result:
    name = f"{db}.{table}"
    df = lake_snapshot(spark, root, db, table)
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
                    "ORDER BY ORDINAL_POSITION", (db, table))
        source_columns = [str(r[0]) for r in cur.fetchall()]
    if not source_columns:  # no such source table (dropped): equal when the lake holds no rows either
        lake_count = 0 if df is None else df.count()
        return Result(name, 0, lake_count, lake_count == 0)
    if df is None:
        pk, src, _ = source_rows(conn, db, table, source_columns)
        return Result(name, len(src), 0, not src, sorted(src)[:100])
    kinds = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    columns = [c for c in source_columns if c in kinds]
    pk, src, src_sum = source_rows(conn, db, table, columns)
    lake, lake_sum = lake_rows(df, columns, pk, kinds)
    equal = len(src) == len(lake) and src_sum == lake_sum and set(source_columns) <= set(kinds)
    diff = [] if equal else sorted({k for k in src.keys() | lake.keys() if src.get(k) != lake.get(k)}, key=str)
    return Result(name, len(src), len(lake), equal, diff)


def connect_source(url: str) -> Any:
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    return pymysql.connect(host=parts.hostname, port=parts.port or 3306, user=unquote(parts.username or "root"),
                           password=unquote(parts.password or ""), charset="utf8mb4", autocommit=True)


SYSTEM_DBS = ("mysql", "information_schema", "performance_schema", "sys")


def source_tables(conn: Any) -> list[tuple[str, str]]:
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
                    f"AND TABLE_SCHEMA NOT IN ({', '.join(repr(d) for d in SYSTEM_DBS)}) ORDER BY 1, 2")
        return [(str(r[0]), str(r[1])) for r in cur.fetchall()]


def verify(spark: SparkSession, source_url: str, root: str, tables: Sequence[str] = ()) -> list[Result]:
    """Compare the named `db.table`s (default: every source table the lake holds)."""
    conn = connect_source(source_url)
    try:
        if tables:
            pairs = [tuple(t.split(".", 1)) for t in tables]
            if any(len(p) != 2 for p in pairs):
                raise ValueError("tables are given as db.table")
        else:
            pairs = [p for p in source_tables(conn) if lake_snapshot(spark, root, *p) is not None]
        return [verify_table(spark, conn, root, db, table) for db, table in pairs]
    finally:
        conn.close()


def main() -> None:
    """`binlake verify [db.table ...]`: exit 0 when every table equals its lake snapshot, else 1."""
    import argparse
    import sys

    from services.loader.config import LoaderConfig
    from services.loader.spark import session
    from shared.config import load
    from shared.errors import ConfigError

    parser = argparse.ArgumentParser(prog="binlake verify", description="Compare source tables with the lake.")
    parser.add_argument("tables", nargs="*", help="db.table (default: every table the lake holds)")
    args = parser.parse_args(sys.argv[1:])
    try:
        cfg = LoaderConfig.from_env()
        source_url = load(_SourceOnly, "verify").source_url
    except ConfigError as exc:
        print(f"binlake verify: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    spark = session("binlake-verify", "local[2]", cfg.data_dir, cfg.root, cfg.spark_conf, hive=False)
    try:
        results = verify(spark, source_url, cfg.root, args.tables)
    finally:
        spark.stop()
    for r in results:
        print(r.line())
    if not results:
        print("no tables to compare (is the loader running, and BINLAKE_DATA_DIR / BINLAKE_WAREHOUSE right?)")
    raise SystemExit(0 if results and all(r.equal for r in results) else 1)


@dataclass(frozen=True)
class _SourceOnly:
    source_url: str


if __name__ == "__main__":
    main()

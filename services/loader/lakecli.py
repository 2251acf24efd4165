"""`binlake lake`: what the lake holds, a table's newest rows, and every table as of one batch.

```
binlake lake tables                       one line per source table: lake identifiers, rows, markers, tail
binlake lake show db.table [-n 20] [--as-of SEQ]
binlake lake as-of [SEQ]                  per table: the snapshots that reflect batch SEQ, and the SQL
```

The catalog is the loader's (`BINLAKE_DATA_DIR`, `BINLAKE_WAREHOUSE`, `BINLAKE_CATALOG*`), read
by a local Spark session of its own, so this works while the loader runs: readers only ever
see committed snapshots. `as-of` prints, for every table, the Spark SQL (the live fold over the
two snapshots) that reads it as of one committed batch; pasted into any Spark session with the
same catalog, the statements give every table as of that one batch (a consistent cut).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from services.loader.iceberg import Iceberg, Marker
from services.loader.live import as_of, last_batch, live_frame, live_query, tables
from services.loader.merges import Fold, tail_count_sql
from services.loader.naming import TableNames, quote
from services.loader.tables import KEY_PROP
from shared.errors import BinlakeError, ConfigError
from shared.mysql import display, parse_name


@dataclass(frozen=True)
class TableStatus:
    """One source table in the lake, as `binlake lake tables` prints it."""

    names: TableNames
    rows: int  # in the current table (merged changes only)
    appended: Marker  # the changelog's marker
    merged: Marker  # the current table's marker
    tail: int  # changelog rows after the current table's marker (not merged yet)


def status(spark: SparkSession, names: TableNames) -> TableStatus:
    ice = Iceberg(spark, names.catalog)
    merged = ice.marker(names.current) or Marker()
    columns = ice.columns(names.current)
    key = [k for k in json.loads(ice.props(names.current).get(KEY_PROP, "[]")) if k in columns]
    appended, tail = Marker(), 0
    if ice.exists(names.changelog):  # created first, so it is there unless a RENAME is half done
        appended = ice.marker(names.changelog) or Marker()
        fold = Fold(names.current, names.changelog, columns, key, merged.order)
        tail = int(spark.sql(tail_count_sql(fold)).collect()[0][0])
    rows = int(spark.sql(f"SELECT count(*) FROM {names.current}").collect()[0][0])
    return TableStatus(names, rows, appended, merged, tail)


def render(header: Sequence[str], rows: Sequence[Sequence[str | None]]) -> str:
    """A small text table (None prints as NULL)."""
    cells = [list(header), *[["NULL" if v is None else _one_line(v) for v in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _one_line(value: str, width: int = 60) -> str:
    text = value.replace("\n", "\\n").replace("\t", "\\t")
    return text if len(text) <= width else text[: width - 1] + "…"


def _ident(names: TableNames, name: str) -> str:
    return f"{names.catalog}.{names.namespace}.{name}"


# -- subcommands ------------------------------------------------------------------------------


def cmd_tables(spark: SparkSession, catalog: str, where: str) -> str:
    found = tables(spark, catalog)
    head = f"catalog {catalog} at {where}: {len(found)} tables, last committed batch {last_batch(spark, catalog)}"
    if not found:
        return head
    rows = []
    for names in found:
        s = status(spark, names)
        rows.append([display(names.db, names.table), _ident(names, names.current_name),
                     _ident(names, names.changelog_name), str(s.rows), str(s.appended.batch), str(s.merged.batch),
                     str(s.tail)])
    return head + "\n" + render(["table", "current", "changelog", "rows", "seq", "merged", "tail"], rows)


def _as_text(df: DataFrame) -> DataFrame:
    """Every column rendered by Spark (session time zone UTC; binary as 0x hex)."""
    out = []
    for f in df.schema.fields:
        col = F.col(quote(f.name))
        kind = f.dataType.simpleString()
        if kind == "binary":
            out.append(F.when(col.isNull(), None).otherwise(F.concat(F.lit("0x"), F.hex(col))).alias(f.name))
        elif kind.startswith(("array", "map", "struct")):
            out.append(F.to_json(col).alias(f.name))
        else:
            out.append(col.cast("string").alias(f.name))
    return df.select(*out)


def cmd_show(spark: SparkSession, catalog: str, table: str, limit: int, seq: int | None) -> str:
    db, name = parse_name(table, {(n.db, n.table) for n in tables(spark, catalog)})
    names = TableNames(catalog, db, name)
    at = as_of(spark, names, seq)
    if at is None:
        raise ConfigError(f"the lake has no table {table} (tables: binlake lake tables)")
    if seq is not None and at.changelog_snapshot is None:
        return f"{table} as of batch {seq}: no commit at or before it (not loaded yet, or its snapshots expired)"
    when = f"at batch {at.appended.batch} (newest)" if seq is None else f"as of batch {seq}"
    df = live_frame(spark, catalog, db, name, seq)
    assert df is not None
    ice = Iceberg(spark, catalog)
    key = [k for k in json.loads(ice.props(names.current).get(KEY_PROP, "[]")) if k in df.columns]
    total = df.count()
    picked = df.orderBy(*[F.col(quote(k)).desc() for k in key]) if key else df
    rows = [list(r) for r in _as_text(picked.limit(limit)).collect()]
    if key:  # fetched highest first, printed in key order
        rows.reverse()
    order = f"the {len(rows)} with the highest {', '.join(key)}" if key else f"{len(rows)} of them"
    head = f"{table} {when}: {total} rows; {order}"
    return head + "\n" + render(df.columns, rows)


def cmd_as_of(spark: SparkSession, catalog: str, seq: int | None) -> str:
    batch = last_batch(spark, catalog) if seq is None else seq
    out = [f"catalog {catalog} as of batch {batch}" + (" (the last committed batch)" if seq is None else "")]
    for names in tables(spark, catalog):
        at = as_of(spark, names, batch)
        label = display(names.db, names.table)
        if at is None or at.changelog_snapshot is None:
            out.append(f"\n-- {label}: no commit at or before batch {batch}")
            continue
        current = "none (nothing merged yet)" if at.current_snapshot is None else str(at.current_snapshot)
        out.append(f"\n-- {label}: current {_ident(names, names.current_name)} snapshot {current} "
                   f"(merged batch {at.merged.batch}), changelog {_ident(names, names.changelog_name)} "
                   f"snapshot {at.changelog_snapshot} (batch {at.appended.batch})")
        out.append(live_query(spark, at) + ";")
    return "\n".join(out)


# -- entry point ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="binlake lake", description="Inspect the lake: tables, show, as-of.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("tables", help="every source table: lake identifiers, rows, markers, un-merged tail")
    show = sub.add_parser("show", help="a table's newest committed rows (or as of a batch)")
    show.add_argument("table", help="db.table (`db`.`table` when a name holds a dot or a backtick)")
    show.add_argument("-n", "--limit", type=int, default=20, help="rows to print (default 20)")
    show.add_argument("--as-of", dest="seq", type=int, default=None, help="the table as of batch SEQ")
    at = sub.add_parser("as-of", help="every table as of one committed batch: snapshot ids and Spark SQL")
    at.add_argument("seq", type=int, nargs="?", default=None, help="batch (default: the last committed one)")
    return ap


def run(args: argparse.Namespace) -> str:
    from services.loader.config import LoaderConfig
    from services.loader.spark import session

    cfg = LoaderConfig.from_env()
    spark = session("binlake-lake", "local[2]", cfg.lake_catalog, cfg.spark_conf)
    try:
        if args.command == "tables":
            return cmd_tables(spark, cfg.catalog, cfg.root)
        if args.command == "show":
            return cmd_show(spark, cfg.catalog, args.table, args.limit, args.seq)
        return cmd_as_of(spark, cfg.catalog, args.seq)
    finally:
        spark.stop()


def main() -> None:
    from shared.logging import configure

    args = parser().parse_args(sys.argv[1:])
    configure("cli", level="warning", json=False)
    try:
        text = run(args)
    except BinlakeError as exc:
        print(f"binlake lake: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(text)

"""Other engines read the lake, also while it is written (DESIGN §7): Spark, pyiceberg, DuckDB, `binlake lake`.

The lake is written in-process (`Lake` on the session's Spark, no NATS) into a warehouse of
its own. pyiceberg and DuckDB read the Iceberg folders directly; the reader during writes is
another Spark process on the same hadoop warehouse, and `binlake lake` runs as a process too.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import re
import site
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyspark.sql import DataFrame, SparkSession

from services.launcher.demo import lake_view, read_live, static_table
from services.launcher.processes import ROOT, clean_env
from services.loader.lake import Lake, MergePolicy
from services.loader.live import live_frame
from services.loader.naming import TableNames
from services.loader.spark import CatalogConfig, register
from tests.integration.lake_feed import Feed
from tests.integration.support import wait_until

CATALOG = "readers"
COLUMNS = [
    {"name": "id", "type": "int", "nullable": False},
    {"name": "name", "type": "varchar", "nullable": True, "charset": "utf8mb4"},
    {"name": "amount", "type": "decimal", "precision": 10, "scale": 2, "nullable": True},
    {"name": "ratio", "type": "double", "nullable": True},
    {"name": "day", "type": "date", "nullable": True},
    {"name": "at", "type": "datetime", "fsp": 3, "nullable": True},
    {"name": "stamp", "type": "timestamp", "fsp": 6, "nullable": True},
    {"name": "raw", "type": "varbinary", "nullable": True},
    {"name": "big", "type": "bigint", "unsigned": True, "nullable": True},
    {"name": "tags", "type": "set", "nullable": True},
]
NULLS = {c["name"]: None for c in COLUMNS}


def row(i: int, name: str = "n") -> dict[str, Any]:
    return {"id": i, "name": f"{name}{i}", "amount": f"{i}.25", "ratio": i / 3, "day": f"2024-01-{i % 28 + 1:02d}",
            "at": f"2024-01-02T03:04:{i % 60:02d}.123", "stamp": f"2024-01-02T03:04:05.{i:06d}Z",
            "raw": bytes([i % 256, 0]), "big": 2**64 - i, "tags": ["a", "b"] if i % 2 else []}


@dataclass
class Shop:
    """`shop.orders` in catalog `readers`: four batches, two merges (delete files), a tail of two changes."""

    warehouse: str
    names: TableNames
    batches: list[int] = field(default_factory=list)
    states: dict[int, dict[int, str | None]] = field(default_factory=dict)  # batch -> {id: name}


@pytest.fixture(scope="module")
def shop(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Shop:
    warehouse = str(tmp_path_factory.mktemp("readers") / "wh")
    register(spark, CatalogConfig(name=CATALOG, warehouse=warehouse))
    lake = Lake(spark, CATALOG, MergePolicy(rows=10**9, age_s=10**9))
    lake.open()
    out = Shop(warehouse, TableNames(CATALOG, "shop", "orders"))
    f, pk = Feed(db="shop", table="orders"), ["id"]
    state: dict[int, str | None] = {}

    def apply(events: list[tuple[int, dict[str, Any]]], *, merge: bool) -> None:
        lake.apply(events[-1][0], events)
        if merge:
            lake.merge_all()
        out.batches.append(events[-1][0])
        out.states[events[-1][0]] = dict(state)

    state.update({i: f"n{i}" for i in range(1, 11)})
    apply([f.env("i", [{"after": row(i)} for i in range(1, 11)], COLUMNS, pk)], merge=False)
    state.update({2: "x2", 30: "n3"})
    del state[3], state[4]
    apply([f.env("u", [{"before": row(2), "after": row(2, "x")}], COLUMNS, pk),
           f.env("u", [{"before": row(3), "after": {**row(3), "id": 30}}], COLUMNS, pk),
           f.env("d", [{"before": row(4)}], COLUMNS, pk)], merge=True)
    state.update({5: "y5", 11: None})
    del state[6]
    apply([f.env("u", [{"before": row(5), "after": row(5, "y")}], COLUMNS, pk),
           f.env("d", [{"before": row(6)}], COLUMNS, pk),
           f.env("i", [{"after": {**NULLS, "id": 11}}], COLUMNS, pk)], merge=True)
    state[8] = "z8"
    del state[7]
    apply([f.env("d", [{"before": row(7)}], COLUMNS, pk),
           f.env("u", [{"before": row(8), "after": row(8, "z")}], COLUMNS, pk)], merge=False)
    return out


# -- reading helpers --------------------------------------------------------------------------------


def _value(v: Any) -> Any:
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, list):
        return tuple(v)
    return v


def rows_of(records: list[Any]) -> Counter[tuple[Any, ...]]:
    """Rows from any engine as comparable tuples (instants in UTC, binary as bytes, lists as tuples)."""
    return Counter(tuple(_value(v) for v in (r.values() if isinstance(r, dict) else r)) for r in records)


def spark_rows(df: DataFrame) -> Counter[tuple[Any, ...]]:
    # Spark hands TIMESTAMP values over as naive local time: make them instants first.
    stamps = {f.name for f in df.schema.fields if f.dataType.simpleString() == "timestamp"}
    out = []
    for r in df.collect():
        d = r.asDict()
        out.append({k: (v.astimezone(dt.UTC) if k in stamps and v is not None else v) for k, v in d.items()})
    return rows_of(out)


def names_of(records: Counter[tuple[Any, ...]]) -> dict[int, str | None]:
    return {r[0]: r[1] for r in records}


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """DuckDB with the avro and iceberg extensions from their PyPI wheels (no download)."""
    con = duckdb.connect()
    for ext in ("avro", "iceberg"):  # iceberg reads manifests through avro
        pattern = os.path.join(f"duckdb_extension_{ext}", "extensions", f"v{duckdb.__version__}",
                               f"{ext}.duckdb_extension")
        found = [p for root in site.getsitepackages() for p in glob.glob(os.path.join(root, pattern))]
        if not found:
            pytest.skip(f"duckdb-extension-{ext}=={duckdb.__version__} is not installed")
        con.execute(f"LOAD '{found[0]}'")
    return con


def newest_metadata(folder: str) -> str:
    """The newest vN.metadata.json: version-hint.text is deleted and rewritten on every commit."""
    files = glob.glob(os.path.join(folder, "metadata", "v*.metadata.json"))
    return max(files, key=lambda p: int(os.path.basename(p)[1:].split(".")[0]))


# -- pyiceberg, DuckDB, the demo's reader ------------------------------------------------------------


@pytest.mark.timeout(900)
def test_pyiceberg_and_duckdb_read_current_tables_with_deletes_applied(spark: SparkSession, shop: Shop) -> None:
    names = shop.names
    want = spark_rows(spark.table(names.current))
    assert names_of(want) == shop.states[shop.batches[2]]  # merged through the third batch
    folder = names.path(shop.warehouse, names.current_name)
    table = static_table(folder)
    assert table is not None
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    summary = snapshot.summary.additional_properties
    assert int(summary["total-position-deletes"]) > 0, summary  # merge-on-read: readers must apply delete files
    assert rows_of(table.scan().to_arrow().to_pylist()) == want

    con = duckdb_connection()
    got = con.execute(f"SELECT * FROM iceberg_scan('{folder}')").fetchall()
    assert rows_of(got) == want
    assert [d[0] for d in con.description] == [c["name"] for c in COLUMNS]
    changelog = names.path(shop.warehouse, names.changelog_name)
    n = spark.table(names.changelog).count()
    assert con.execute(f"SELECT count(*) FROM iceberg_scan('{newest_metadata(changelog)}')").fetchone() == (n,)


@pytest.mark.timeout(900)
def test_demo_folds_the_unmerged_tail_like_spark(spark: SparkSession, shop: Shop) -> None:
    live = read_live(shop.warehouse, "shop", "orders")
    assert live is not None
    assert (live.batch, live.unmerged, live.key) == (shop.batches[-1], 2, ["id"])
    df = live_frame(spark, CATALOG, "shop", "orders")
    assert df is not None
    assert rows_of(live.rows) == spark_rows(df)
    assert names_of(rows_of(live.rows)) == shop.states[shop.batches[-1]]
    view = lake_view(shop.warehouse, "shop", "orders").splitlines()
    assert view[0] == (f"lake shop.orders @ CDC seq {shop.batches[-1]}: {len(live.rows)} rows "
                       "(2 changes not merged yet); newest:")
    assert [int(line.split()[0]) for line in view[1:]] == sorted(shop.states[shop.batches[-1]])[-5:]
    assert lake_view(shop.warehouse, "shop", "nothing") == "lake shop.nothing: not loaded yet"


@pytest.mark.timeout(900)
def test_every_batch_can_be_read_as_of(spark: SparkSession, shop: Shop) -> None:
    for batch in shop.batches:
        df = live_frame(spark, CATALOG, "shop", "orders", batch)
        assert df is not None
        assert names_of(spark_rows(df)) == shop.states[batch], f"as of batch {batch}"


# -- binlake lake ------------------------------------------------------------------------------------

CLI_DRIVER = """
import sys
from services.cli import main
for args in [a.split('|') for a in sys.argv[1:]]:
    print('=== ' + ' '.join(args), flush=True)
    main(args)
"""


def run_cli(shop: Shop, *commands: list[str]) -> tuple[dict[str, str], str]:
    """Run `binlake lake ...` commands in one process (one Spark start); output per command, stderr."""
    env = clean_env()
    env.update(BINLAKE_WAREHOUSE=shop.warehouse, BINLAKE_CATALOG=CATALOG, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", CLI_DRIVER, *["|".join(c) for c in commands]], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, str] = {}
    for part in proc.stdout.split("=== ")[1:]:
        head, _, body = part.partition("\n")
        out[head] = body.rstrip("\n")
    return out, proc.stderr


def sql_blocks(text: str) -> dict[str, str]:
    """`-- db.table: ...` headers followed by one statement ending in `;`."""
    out, current = {}, None
    for line in text.splitlines():
        if line.startswith("-- "):
            current = line[3:].split(":")[0]
        elif current and line.endswith(";"):
            out[current] = line[:-1]
    return out


@pytest.mark.timeout(900)
def test_lake_cli_tables_show_and_as_of(spark: SparkSession, shop: Shop) -> None:
    _, b2, b3, b4 = shop.batches
    out, err = run_cli(shop, ["lake", "tables"], ["lake", "show", "shop.orders", "-n", "3"],
                       ["lake", "show", "shop.orders", "--as-of", str(b2)], ["lake", "as-of"],
                       ["lake", "as-of", str(b3)], ["lake", "show", "shop.orders", "--as-of", "0"])
    assert not re.search(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN) ", err, re.M), err

    tables = out["lake tables"].splitlines()
    assert tables[0] == f"catalog {CATALOG} at {shop.warehouse}: 1 tables, last committed batch {b4}"
    assert tables[1].split() == ["table", "current", "changelog", "rows", "seq", "merged", "tail"]
    assert tables[3].split() == ["shop.orders", "readers.shop.orders", "readers.shop.orders__changelog",
                                 str(len(shop.states[b3])), str(b4), str(b3), "2"]

    newest = shop.states[b4]
    show = out["lake show shop.orders -n 3"].splitlines()
    assert show[0] == f"shop.orders at batch {b4} (newest): {len(newest)} rows; the 3 with the highest id"
    assert show[1].split() == [c["name"] for c in COLUMNS]
    assert [int(line.split()[0]) for line in show[3:]] == sorted(newest)[-3:] == [10, 11, 30]
    assert show[3].split() == ["10", "n10", "10.25", "3.3333333333333335", "2024-01-11", "2024-01-02", "03:04:10.123",
                               "2024-01-02", "03:04:05.00001", "0x0A00", "18446744073709551606", "[]"]
    assert show[4].split() == ["11"] + ["NULL"] * 9
    assert show[5].split()[:3] == ["30", "n3", "3.25"] and show[5].split()[-1] == '["a","b"]'

    old = out[f"lake show shop.orders --as-of {b2}"].splitlines()
    assert old[0] == f"shop.orders as of batch {b2}: {len(shop.states[b2])} rows; the {len(shop.states[b2])} " \
                     "with the highest id"
    assert {int(line.split()[0]): line.split()[1] for line in old[3:]} == shop.states[b2]
    assert out["lake show shop.orders --as-of 0"].startswith("shop.orders as of batch 0: no commit at or before it")

    for command, batch in (("lake as-of", b4), (f"lake as-of {b3}", b3)):
        text = out[command]
        assert text.splitlines()[0].startswith(f"catalog {CATALOG} as of batch {batch}")
        blocks = sql_blocks(text)
        assert list(blocks) == ["shop.orders"]
        # the printed SQL, pasted into another session with the same catalog, reads the table as of that batch
        assert names_of(spark_rows(spark.sql(blocks["shop.orders"]))) == shop.states[batch]


# -- readers while the lake is written ---------------------------------------------------------------

READER = """
import json, os, sys
from services.loader.live import live_frame
from services.loader.spark import CatalogConfig, session
warehouse, stop = sys.argv[1], sys.argv[2]
spark = session("reader", "local[1]", CatalogConfig(warehouse=warehouse, options={"cache-enabled": "false"}))
print(json.dumps({"ready": True}), flush=True)
try:
    while not os.path.exists(stop):
        current = spark.sql("SELECT count(*) FROM lake.shop.events").collect()[0][0]
        changelog = spark.sql("SELECT count(*) FROM lake.shop.events__changelog").collect()[0][0]
        live = live_frame(spark, "lake", "shop", "events").count()
        print(json.dumps({"current": current, "changelog": changelog, "live": live}), flush=True)
finally:
    spark.stop()
"""
PER_BATCH, UPDATES = 100, 10  # inserts per batch, and updates of existing rows (changelog rows = 110)


def _engine_reads(warehouse: str, stop: threading.Event, reads: list[dict[str, int]],
                  errors: list[BaseException]) -> None:
    names = TableNames("lake", "shop", "events")
    con = duckdb_connection()
    try:
        while not stop.is_set():
            current = static_table(names.path(warehouse, names.current_name))
            changelog = static_table(names.path(warehouse, names.changelog_name))
            assert current is not None and changelog is not None
            duck = con.execute("SELECT count(*) FROM iceberg_scan("
                               f"'{newest_metadata(names.path(warehouse, names.current_name))}')").fetchone()
            reads.append({"pyiceberg_current": current.scan().to_arrow().num_rows,
                          "pyiceberg_changelog": changelog.scan().to_arrow().num_rows,
                          "duckdb_current": int(duck[0]) if duck else -1})
    except BaseException as exc:  # raised in the test below
        errors.append(exc)


@pytest.mark.timeout(900)
def test_spark_pyiceberg_and_duckdb_read_while_batches_commit(spark: SparkSession, tmp_path: Path) -> None:
    warehouse = str(tmp_path / "wh")
    register(spark, CatalogConfig(name="during", warehouse=warehouse))
    lake = Lake(spark, "during", MergePolicy(rows=3 * (PER_BATCH + UPDATES), age_s=10**9))
    lake.open()
    f, cols = Feed(db="shop", table="events"), COLUMNS[:3]
    batches = 0

    def write() -> None:
        nonlocal batches
        base = batches * PER_BATCH
        events = [f.env("i", [{"after": {"id": base + i, "name": "new", "amount": "1.00"}} for i in range(PER_BATCH)],
                      cols, ["id"])]
        if batches:
            events.append(f.env("u", [{"before": {"id": i, "name": "new", "amount": "1.00"},
                                       "after": {"id": i, "name": f"b{batches}", "amount": "2.00"}}
                                      for i in range(base - UPDATES, base)], cols, ["id"]))
        lake.apply(events[-1][0], events)
        batches += 1

    write()  # the tables exist before anyone reads
    stop_file = tmp_path / "stop"
    log = open(tmp_path / "reader.log", "w+")  # noqa: SIM115 (closed in the finally below)
    reader = subprocess.Popen([sys.executable, "-c", READER, warehouse, str(stop_file)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=log,
                              text=True)

    def reader_log() -> str:
        log.seek(0)
        return log.read()

    spark_reads: list[dict[str, Any]] = []
    other: list[str] = []  # anything else the reader prints (shown when an assertion fails)

    def pump_lines() -> None:
        for line in reader.stdout or []:
            if line.startswith("{"):
                spark_reads.append(json.loads(line))
            else:
                other.append(line)

    pump = threading.Thread(target=pump_lines, daemon=True)
    pump.start()
    stop = threading.Event()
    engine_reads: list[dict[str, int]] = []
    errors: list[BaseException] = []
    engines = threading.Thread(target=_engine_reads, args=(warehouse, stop, engine_reads, errors), daemon=True)
    try:
        wait_until(lambda: spark_reads or reader.poll() is not None, 300, "the reader's Spark session")
        assert reader.poll() is None, reader_log()
        engines.start()
        seen_spark, seen_engines = len(spark_reads), len(engine_reads)
        # keep committing until every reader has read several times while batches were being written
        while batches < 40 and (batches < 8 or len(spark_reads) < seen_spark + 4
                                or len(engine_reads) < seen_engines + 4):
            write()
            assert reader.poll() is None, reader_log()
    finally:
        stop.set()
        stop_file.touch()
        if engines.is_alive():
            engines.join(120)
        try:
            reader.wait(120)
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait()
        pump.join(10)
        if reader.stdout:
            reader.stdout.close()
        output = reader_log()
        log.close()
    assert not errors, errors
    assert reader.returncode == 0, output
    lake.merge_all()
    final = spark.table(TableNames("during", "shop", "events").current).count()
    assert final == batches * PER_BATCH

    reads = [r for r in spark_reads if "live" in r]
    assert len(reads) >= 4 and len(engine_reads) >= 4, (reads, engine_reads, other)
    for r in reads:  # every read is the state of some committed batch, never a partial one
        assert r["live"] % PER_BATCH == 0 and r["current"] % PER_BATCH == 0, r
        assert (r["changelog"] - PER_BATCH) % (PER_BATCH + UPDATES) == 0, r
        assert r["current"] <= r["live"] <= batches * PER_BATCH, r
    for r in engine_reads:
        assert r["pyiceberg_current"] % PER_BATCH == 0 and r["duckdb_current"] % PER_BATCH == 0, r
        assert (r["pyiceberg_changelog"] - PER_BATCH) % (PER_BATCH + UPDATES) == 0, r
    for series in (reads, engine_reads):  # and the states only move forward
        for key in series[0]:
            values = [r[key] for r in series]
            assert values == sorted(values), (key, values)
    assert Decimal("2.00") in {r[2] for r in spark.table(TableNames("during", "shop", "events").current).collect()}

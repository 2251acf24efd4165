"""The loader end to end: MariaDB -> parser -> sink -> BINLAKE_CDC -> store/meta -> loader -> lake (DESIGN §7, §8.3).

Every service is a real process; the loader runs its own Spark (local, Hive catalog on
embedded Derby under its data directory). This module has ONE Spark session of its own
(`spark`, in-memory catalog) to read the lake from its files: `verify` (the checksum
comparison of §8.3), an independent per-key comparison of a few simple columns, and the
changelog folders at or below the commit pointer, which must hold every row change
exactly once. Two tests run the lake (`services.loader.lake.Lake`) in-process on that
session to put it into the exact state a kill -9 can leave behind.

Spark is slow on a small box: the timeouts are generous on purpose.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from services.loader import frames
from services.loader.lake import COMMIT_FILE, Lake, lake_name
from services.loader.verify import lake_snapshot, verify
from tests.integration.lake_stack import Stack, assert_verify_equal, commits, services_answer
from tests.integration.support import ROOT, ServiceProcess, StoredMsg, read_stream_sync, wait_until
from tests.integration.test_parser_types import MATRIX
from tests.servers import MariaDB

ServiceFactory = Callable[..., ServiceProcess]
ROW_OPS = ("i", "u", "d")
LAKE_DB = "binlake_main"  # the loader's Spark database for source "main"


# -- the workload -----------------------------------------------------------------------------

TABLES = {
    "accounts": "CREATE TABLE `{db}`.accounts (id INT PRIMARY KEY, owner VARCHAR(40), balance DECIMAL(12,2), "
                "updated DATETIME(6))",
    "events": "CREATE TABLE `{db}`.events (id BIGINT UNSIGNED PRIMARY KEY, kind ENUM('a','b','c'), body TEXT, "
              "at TIMESTAMP(3) NULL)",
    "tags": "CREATE TABLE `{db}`.tags (id VARCHAR(20) PRIMARY KEY, n INT, flag BIT(1))",
    "types": "CREATE TABLE `{db}`.types (id INT PRIMARY KEY, touched INT NOT NULL DEFAULT 0, "
             + ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(MATRIX)) + ")",
}
MATRIX_ROWS = max(len(values) for _, values in MATRIX)
MATRIX_COLS = ", ".join(f"c{i}" for i in range(len(MATRIX)))
COPY_BASE = 1000  # copies of the matrix rows get ids from here on; the originals (0..2) stay
ALTER = "ALTER TABLE `{db}`.accounts ADD COLUMN x INT"


@dataclass
class LakeWorkload:
    """Random transactions over TABLES that count every row change per table.

    Inserts, updates of non-key columns, updates of the primary key (accounts, events, tags,
    types) and deletes; `ALTER TABLE accounts ADD COLUMN x INT` once `alter_at` of the
    target is reached, after which x is written too.
    """

    mariadb: MariaDB
    db: str
    target: int
    seed: int = 11
    rate: float = 2000.0  # row changes per second
    alter_at: float = 0.5
    counts: Counter[str] = field(default_factory=Counter)
    altered: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    @property
    def changes(self) -> int:
        return sum(self.counts.values())

    def _session(self, cur: Any) -> None:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates are legal input here
        cur.execute("SET SESSION time_zone = '+00:00'")

    def create_tables(self) -> None:
        """The tables, and the type matrix rows (ids 0..MATRIX_ROWS-1) as in test_parser_types."""
        self.mariadb.execute(*(ddl.format(db=self.db) for ddl in TABLES.values()))
        conn = self.mariadb.connect()
        try:
            with conn.cursor() as cur:
                self._session(cur)
                for r in range(MATRIX_ROWS):
                    cols = ", ".join(f"c{i}" for i, (_, vals) in enumerate(MATRIX) if r < len(vals))
                    vals = ", ".join(vals[r][0] for _, vals in MATRIX if r < len(vals))
                    cur.execute(f"INSERT INTO `{self.db}`.types (id, {cols}) VALUES ({r}, {vals})")
                    self.counts["types"] += cur.rowcount
        finally:
            conn.close()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        rnd = random.Random(self.seed)
        conn = self.mariadb.connect(autocommit=False)
        next_id = {"accounts": 1, "events": 1, "tags": 1, "types": COPY_BASE}
        started = time.monotonic()
        try:
            with conn.cursor() as cur:
                self._session(cur)
                while self.changes < self.target:
                    ahead = self.changes / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                    for _ in range(rnd.choice([1, 1, 2, 3, 20])):  # statements per transaction
                        table = rnd.choices(list(TABLES), weights=[3, 3, 3, 1])[0]
                        self.counts[table] += self._statement(cur, rnd, table, next_id)
                    conn.commit()
                    if not self.altered and self.changes >= self.target * self.alter_at:
                        cur.execute(ALTER.format(db=self.db))
                        self.altered = True
        except BaseException as exc:
            self.error = exc
        finally:
            conn.close()
            self.done.set()

    def _statement(self, cur: Any, rnd: random.Random, table: str, next_id: dict[str, int]) -> int:
        kind = rnd.choices(["insert", "update", "key", "delete"], weights=[5, 3, 1, 1])[0]
        t = f"`{self.db}`.{table}"
        lo = max(COPY_BASE if table == "types" else 1, next_id[table] - 200)
        hi = lo + rnd.randint(0, 30)
        if kind == "insert":
            n = rnd.choice([1, 1, 3]) if table == "types" else rnd.choice([1, 1, 1, 5, 20, 50])
            ids = range(next_id[table], next_id[table] + n)
            next_id[table] += n
            if table == "accounts":
                x = ", x" if self.altered else ""
                values = ", ".join(
                    f"({i}, 'owner {i}', {rnd.randint(-10**6, 10**6)}.{i % 100:02d}, "
                    f"'2024-01-01 00:00:00.{i % 999999:06d}'"
                    + (f", {rnd.choice(['NULL', str(i)])}" if self.altered else "") + ")" for i in ids)
                cur.execute(f"INSERT INTO {t} (id, owner, balance, updated{x}) VALUES {values}")
            elif table == "events":
                values = ", ".join(f"({i}, '{rnd.choice('abc')}', REPEAT('x', {i % 300}), "
                                   + (f"'2024-02-02 02:02:02.{i % 1000:03d}'" if i % 7 else "NULL") + ")"
                                   for i in ids)
                cur.execute(f"INSERT INTO {t} (id, kind, body, at) VALUES {values}")
            elif table == "tags":
                values = ", ".join(f"('tag-{i}', {i}, b'{i % 2}')" for i in ids)
                cur.execute(f"INSERT INTO {t} (id, n, flag) VALUES {values}")
            else:
                rows = 0
                for i in ids:  # a copy of one of the type matrix rows
                    cur.execute(f"INSERT INTO {t} (id, touched, {MATRIX_COLS}) SELECT {i}, 0, {MATRIX_COLS} "
                                f"FROM {t} WHERE id = {i % MATRIX_ROWS}")
                    rows += cur.rowcount
                return rows
        elif kind == "update":
            if table == "accounts":
                col = "x = COALESCE(x, 0) + 1" if self.altered and rnd.random() < 0.5 else "balance = balance + 1"
                cur.execute(f"UPDATE {t} SET {col} WHERE id BETWEEN %s AND %s", (lo, hi))
            elif table == "events":
                col = rnd.choice(["body = CONCAT(body, 'y')", "kind = 'b'", "at = NULL"])
                cur.execute(f"UPDATE {t} SET {col} WHERE id BETWEEN %s AND %s", (lo, hi))
            elif table == "tags":
                col = rnd.choice(["n = n + 1", "flag = IF(flag = b'1', b'0', b'1')"])
                cur.execute(f"UPDATE {t} SET {col} WHERE n BETWEEN %s AND %s", (lo, hi))
            else:
                if rnd.random() < 0.3:  # the original matrix rows change too
                    lo, hi = 0, MATRIX_ROWS - 1
                cur.execute(f"UPDATE {t} SET touched = touched + 1 WHERE id BETWEEN %s AND %s", (lo, hi))
        elif kind == "key":  # primary key updates move rows; the snapshot must follow them
            if table == "accounts":
                cur.execute(f"UPDATE {t} SET id = id + 1000000 WHERE id BETWEEN %s AND %s AND id < 1000000",
                            (lo, hi))
            elif table == "events":
                cur.execute(f"UPDATE {t} SET id = id + 5000000000 WHERE id BETWEEN %s AND %s AND id < 5000000000",
                            (lo, hi))
            elif table == "tags":
                cur.execute(f"UPDATE {t} SET id = CONCAT(id, 'm') WHERE n BETWEEN %s AND %s AND id NOT LIKE '%%m'",
                            (lo, hi))
            else:
                cur.execute(f"UPDATE {t} SET id = id + 1000000 WHERE id BETWEEN %s AND %s AND id < 1000000",
                            (lo, hi))
        else:
            key = "n" if table == "tags" else "id"
            cur.execute(f"DELETE FROM {t} WHERE {key} BETWEEN %s AND %s", (lo, lo + rnd.randint(0, 5)))
        return int(cur.rowcount)


@pytest.fixture
def stack(mariadb: MariaDB, database: str, nats_url: str, parser: ServiceProcess, sink_factory: ServiceFactory,
          service_factory: ServiceFactory, tmp_path: Path) -> Stack:
    """parser + one sink + meta + store running (no loader yet)."""
    sink_factory("sink")
    meta = service_factory("services.meta", "meta")
    store = service_factory("services.store", "store")
    wait_until(lambda: services_answer(nats_url), 60, "meta and store to answer", interval=0.5)
    assert meta.running and store.running
    return Stack(mariadb, database, nats_url, tmp_path / "lake", service_factory)


# -- checks -----------------------------------------------------------------------------------


def changelog_pairs(spark: SparkSession, warehouse: str, committed: int, db: str, table: str) -> Counter[tuple]:
    """(_seq, _row, _op) of every change in the committed changelog folders of a table, counted."""
    base = Path(warehouse) / lake_name(db, table) / "changelog"
    if not base.exists():
        return Counter()
    dirs = sorted(str(p) for p in base.iterdir()
                  if p.name.startswith("_batch=") and int(p.name.split("=", 1)[1]) <= committed)
    if not dirs:
        return Counter()
    df = spark.read.option("basePath", str(base)).parquet(*dirs)
    return Counter((r["_seq"], r["_row"], r["_op"]) for r in df.select("_seq", "_row", "_op").collect())


def assert_changelog_exactly_once(spark: SparkSession, stack: Stack, cdc: list[StoredMsg],
                                  counts: Counter[str]) -> None:
    committed = stack.committed()
    for table in counts:
        got = changelog_pairs(spark, stack.warehouse, committed, stack.db, table)
        dups = {k: n for k, n in got.items() if n > 1}
        assert not dups, f"{table}: changes in the changelog more than once: {list(dups.items())[:10]}"
        assert sum(got.values()) == counts[table], f"{table}: {sum(got.values())} changes, made {counts[table]}"
        expected = Counter((m.seq, i, m.env["op"]) for m in cdc if m.env["table"] == table
                           for i in range(len(m.env["rows"])))
        assert got == expected, f"{table}: the changelog is not BINLAKE_CDC's changes"


def source_rows(mariadb: MariaDB, sql: str) -> dict[Any, tuple]:
    return {r[0]: tuple(r[1:]) for r in mariadb.query(sql)}


def lake_rows(spark: SparkSession, stack: Stack, table: str, cols: list[str]) -> dict[Any, tuple]:
    df = lake_snapshot(spark, stack.warehouse, stack.db, table)
    assert df is not None, f"no committed lake snapshot of {table}"
    return {r[0]: tuple(r[1:]) for r in df.select(*cols).collect()}


def assert_snapshot_per_key(spark: SparkSession, stack: Stack) -> None:
    """Independent of verify: the lake snapshot's simple columns equal SELECT of the source, per key."""
    db = stack.db
    src = source_rows(stack.mariadb, f"SELECT id, owner, balance, x FROM `{db}`.accounts")
    lake = lake_rows(spark, stack, "accounts", ["id", "owner", "balance", "x"])
    assert lake.keys() == src.keys()
    assert lake == src
    assert any(k >= 1000000 for k in src) and any(v[2] is not None for v in src.values())  # moved keys, new column

    src = source_rows(stack.mariadb, f"SELECT id, kind, body FROM `{db}`.events")
    lake = {int(k): v for k, v in lake_rows(spark, stack, "events", ["id", "kind", "body"]).items()}
    assert lake == src
    assert any(k >= 5000000000 for k in src)

    src = {k: (n, int.from_bytes(f, "big")) for k, (n, f) in
           source_rows(stack.mariadb, f"SELECT id, n, flag FROM `{db}`.tags").items()}
    assert lake_rows(spark, stack, "tags", ["id", "n", "flag"]) == src
    assert any(k.endswith("m") for k in src)

    src = source_rows(stack.mariadb, f"SELECT id, touched, c9 FROM `{db}`.types")  # c9: BIGINT UNSIGNED
    lake = {k: (t, None if u is None else int(u))
            for k, (t, u) in lake_rows(spark, stack, "types", ["id", "touched", "c9"]).items()}
    assert lake == src
    assert set(range(MATRIX_ROWS)) <= src.keys()


def run_load(spark: SparkSession, stack: Stack, *, kills: int, rate: float, target: int = 10_000) -> None:
    workload = LakeWorkload(stack.mariadb, stack.db, target=target, rate=rate)
    stack.start_loader()  # Spark starts while the workload runs
    workload.create_tables()
    thread = workload.start()
    rnd = random.Random(5)
    for _ in range(kills):
        proc = stack.loader
        wait_until(lambda p=proc: commits(p) or not p.running, 600, "a loader.committed", interval=1)
        assert proc.running, proc.output[-5000:]
        time.sleep(rnd.uniform(0, 4))  # somewhere in the next batch (or between commit and ack)
        proc.kill()
        stack.start_loader()
    thread.join(600)
    assert workload.done.is_set() and workload.error is None, workload.error
    assert workload.altered and workload.changes >= target
    cdc = stack.wait_cdc(workload.changes)
    assert Counter({t: sum(len(m.env["rows"]) for m in cdc if m.env["table"] == t) for t in TABLES}) \
        == workload.counts, "BINLAKE_CDC does not hold the workload's changes"
    stack.wait_loaded(max(m.seq for m in cdc))
    assert len(stack.loaders) == kills + 1
    for proc in stack.loaders[:-1]:
        assert not proc.running
    for proc in stack.loaders[1:]:  # every kill came before the lake had caught up
        starts = [json.loads(line) for line in proc.output.splitlines() if '"loader.start"' in line]
        assert starts and int(starts[0]["committed"]) < max(m.seq for m in cdc), proc.output[-3000:]
    assert_verify_equal(spark, stack, list(TABLES))
    assert_snapshot_per_key(spark, stack)
    assert_changelog_exactly_once(spark, stack, cdc, workload.counts)
    assert "x" in lake_snapshot(spark, stack.warehouse, stack.db, "accounts").columns  # type: ignore[union-attr]


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_random_workload_lands_in_the_lake_exactly(spark, stack):
    run_load(spark, stack, kills=0, rate=2000)
    assert commits(stack.loader), "the loader never logged loader.committed"


@pytest.mark.timeout(900)
def test_loader_killed_twice_during_the_load_gives_the_same_lake(spark, stack):
    run_load(spark, stack, kills=2, rate=150)
    assert all(commits(p) for p in stack.loaders), "every loader committed at least one batch"


def run_verify_cli(stack: Stack, *tables: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BINLAKE_")}
    env.update(BINLAKE_SOURCE_URL=stack.mariadb.dsn(), BINLAKE_DATA_DIR=str(stack.data_dir))
    return subprocess.run([sys.executable, "-m", "services.loader.verify", *tables], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=400)


CATALOG_QUERY = """
import sys
from services.loader.spark import session
spark = session("catalog-check", "local[2]", sys.argv[1], sys.argv[2])
for name in sys.argv[3:]:
    print(name, spark.sql(f"SELECT count(*) FROM binlake_main.`{name}`").collect()[0][0])
spark.stop()
"""


@pytest.mark.timeout(900)
def test_verify_cli_and_catalog_views(stack):
    db = stack.db
    stack.mariadb.execute(
        f"CREATE TABLE `{db}`.items (id INT PRIMARY KEY, name VARCHAR(20), price DECIMAL(8,2), at DATETIME(3))",
        f"INSERT INTO `{db}`.items VALUES " + ", ".join(
            f"({i}, 'item {i}', {i}.{i % 100:02d}, '2024-03-04 05:06:07.{i % 1000:03d}')" for i in range(1, 101)),
        f"UPDATE `{db}`.items SET price = price * 2 WHERE id <= 30",
        f"UPDATE `{db}`.items SET id = id + 1000 WHERE id BETWEEN 91 AND 95",
        f"DELETE FROM `{db}`.items WHERE id BETWEEN 41 AND 50")
    changes = 100 + 30 + 5 + 10
    loader = stack.start_loader()
    cdc = stack.wait_cdc(changes)
    stack.wait_loaded(max(m.seq for m in cdc))

    ok = run_verify_cli(stack, f"{db}.items")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"OK    {db}.items: 90 rows" in ok.stdout.splitlines(), ok.stdout

    assert loader.stop(60) is not None and not loader.running
    stack.mariadb.execute(f"DELETE FROM `{db}`.items WHERE id = 7")  # the lake does not see this one
    bad = run_verify_cli(stack, f"{db}.items")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "DIFF" in bad.stdout and "source 89 rows, lake 90 rows" in bad.stdout, bad.stdout
    assert "differing keys: ('7',)" in bad.stdout, bad.stdout

    # The catalog views (the lake's tables for users) answer too, with the loader's catalog.
    name = lake_name(db, "items")
    out = subprocess.run([sys.executable, "-c", CATALOG_QUERY, str(stack.data_dir), stack.warehouse, name,
                          f"{name}__changelog"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout + out.stderr[-5000:]
    assert f"{name} 90\n" in out.stdout and f"{name}__changelog {changes}\n" in out.stdout, out.stdout


@pytest.mark.timeout(900)
def test_truncate_and_drop_table(spark, stack):
    db = stack.db
    create = "CREATE TABLE `{db}`.`{t}` (id INT PRIMARY KEY, v VARCHAR(20))"
    ins = "INSERT INTO `{db}`.`{t}` VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(1, 21))
    stack.mariadb.execute(*(create.format(db=db, t=t) for t in ("kept", "emptied", "dropped")),
                          *(ins.format(db=db, t=t) for t in ("kept", "emptied", "dropped")))
    loader = stack.start_loader()
    cdc = stack.wait_cdc(60)
    stack.wait_loaded(max(m.seq for m in cdc))
    assert_verify_equal(spark, stack, ["kept", "emptied", "dropped"])

    stack.mariadb.execute(
        f"TRUNCATE TABLE `{db}`.kept",
        f"INSERT INTO `{db}`.kept VALUES (100, 'after'), (7, 'again')",  # rows after the truncate stay
        f"UPDATE `{db}`.emptied SET v = 'changed' WHERE id <= 5",
        f"TRUNCATE TABLE `{db}`.emptied",
        f"DROP TABLE `{db}`.dropped")
    cdc = stack.wait_cdc(60 + 2 + 5)
    resets = wait_until(lambda: (d := [m for m in read_stream_sync(stack.nats_url, "BINLAKE_CDC")
                                       if m.env.get("db") == db and m.env["op"] == "ddl"
                                       and m.env.get("ddl", "").upper().startswith(("TRUNCATE", "DROP"))])
                        and len(d) == 3 and d, 120, "the TRUNCATEs and the DROP in BINLAKE_CDC", interval=1)
    stack.wait_loaded(max(m.seq for m in cdc + resets))
    assert loader.running

    assert_verify_equal(spark, stack, ["kept", "emptied"])
    assert lake_rows(spark, stack, "kept", ["id", "v"]) == {100: ("after",), 7: ("again",)}
    assert lake_rows(spark, stack, "emptied", ["id", "v"]) == {}
    assert lake_rows(spark, stack, "dropped", ["id", "v"]) == {}  # a dropped table's snapshot is empty
    (gone,) = verify(spark, stack.mariadb.dsn(), stack.warehouse, [f"{db}.dropped"])
    assert (gone.equal, gone.source_rows, gone.lake_rows) == (True, 0, 0), gone.line()
    # the changelog keeps every change of the truncated and dropped tables
    committed = stack.committed()
    for table, n in (("kept", 22), ("emptied", 25), ("dropped", 20)):
        assert sum(changelog_pairs(spark, stack.warehouse, committed, db, table).values()) == n, table

    stack.mariadb.execute(create.format(db=db, t="dropped"), f"INSERT INTO `{db}`.dropped VALUES (1, 'reborn')")
    cdc = stack.wait_cdc(60 + 2 + 5 + 1)
    stack.wait_loaded(max(m.seq for m in cdc))
    assert_verify_equal(spark, stack, ["kept", "emptied", "dropped"])
    assert lake_rows(spark, stack, "dropped", ["id", "v"]) == {1: ("reborn",)}


# -- the lake in-process: the states a kill -9 leaves behind ----------------------------------

ID = {"name": "id", "type": "int", "nullable": False}
V = {"name": "v", "type": "varchar", "nullable": True}


def _inserts(first_seq: int, n: int) -> list[tuple[int, dict[str, Any]]]:
    return [(first_seq + i, {"op": "i", "db": "d", "table": "t", "pk": ["id"], "scn": first_seq + i, "ts": 0,
                             "pos": {"file": "f", "offset": i}, "schema": {"id": "s1", "columns": [ID, V]},
                             "rows": [{"after": {"id": first_seq + i, "v": f"v{first_seq + i}"}}]})
            for i in range(n)]


def _apply(lake: Lake, events: list[tuple[int, dict[str, Any]]]) -> None:
    lake.apply(events[-1][0], list(frames.group(events).values()))


def _files_rows(spark: SparkSession, root: Path) -> tuple[dict[int, str], int]:
    """(snapshot {id: v}, changelog rows) as a file reader sees them at the commit pointer."""
    committed = int(json.loads((root / COMMIT_FILE).read_text())["seq"])
    snap = lake_snapshot(spark, str(root), "d", "t")
    rows = {} if snap is None else {r.id: r.v for r in snap.collect()}
    return rows, sum(changelog_pairs(spark, str(root), committed, "d", "t").values())


@pytest.mark.timeout(600)
def test_restart_drops_folders_a_crash_left_above_the_commit_pointer(spark, tmp_path):
    """A kill between writing a batch's parquet folders and registering them as partitions."""
    root = tmp_path / "lake"
    lake = Lake(spark, "crash_folders", str(root))
    assert lake.open() == 0
    _apply(lake, _inserts(1, 3))
    # The next batch (4..6) was written, not registered, not committed, when the loader died.
    for kind, column in (("changelog", "_batch"), ("snapshot", "_version")):
        shutil.copytree(root / "d__t" / kind / f"{column}=3", root / "d__t" / kind / f"{column}=6")

    restarted = Lake(spark, "crash_folders", str(root))
    assert restarted.open() == 3
    # The store redelivers from the last ack; this time the batch happens to end later.
    _apply(restarted, _inserts(4, 4))
    rows, changes = _files_rows(spark, root)
    assert rows == {i: f"v{i}" for i in range(1, 8)}
    assert changes == 7, "a changelog folder the crash left behind counts twice"


@pytest.mark.timeout(600)
def test_restart_between_deleting_and_renaming_the_commit_pointer_keeps_the_lake(spark, tmp_path):
    """`_write_atomic` deletes the old pointer, then renames the new one into place: a kill in between."""
    root = tmp_path / "lake"
    lake = Lake(spark, "crash_pointer", str(root))
    lake.open()
    _apply(lake, _inserts(1, 2))
    _apply(lake, _inserts(3, 2))
    (root / COMMIT_FILE).rename(root / (COMMIT_FILE + ".tmp"))

    restarted = Lake(spark, "crash_pointer", str(root))
    assert restarted.open() == 4, "the committed batches were dropped"
    _apply(restarted, _inserts(5, 1))
    rows, changes = _files_rows(spark, root)
    assert rows == {i: f"v{i}" for i in range(1, 6)} and changes == 5

"""The loader end to end: source -> parser -> sink -> BINLAKE_CDC -> store/meta -> loader -> Iceberg (DESIGN §7, §8.3).

Every service is a real process; the loader runs its own Spark with the lake's hadoop
catalog. The checks read the lake without Spark (pyiceberg): the current tables cell by
cell against the source, the changelog for every change exactly once; and `binlake verify`
(the loader's own comparison, in its own process) must say OK.

Spark is slow on a small box: the timeouts are generous on purpose.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pyarrow as pa
import pytest

from services.launcher.processes import ServiceProcess
from services.launcher.servers import free_port
from shared import keys
from shared.subjects import Names
from tests.integration.lake_stack import (
    Stack,
    assert_cells_equal,
    assert_verify_equal,
    commits,
    events,
    services_answer,
)
from tests.integration.support import http_get, read_stream_sync, wait_until
from tests.servers import BOTH_SOURCES, MariaDB

ServiceFactory = Callable[..., ServiceProcess]


# -- the workload -----------------------------------------------------------------------------

TABLES = {
    "accounts": "CREATE TABLE `{db}`.accounts (id INT PRIMARY KEY, owner VARCHAR(40), balance DECIMAL(12,2), "
                "updated DATETIME(6))",
    "events": "CREATE TABLE `{db}`.events (id BIGINT UNSIGNED PRIMARY KEY, kind ENUM('a','b','c'), body TEXT, "
              "at TIMESTAMP(3) NULL, score INT)",
    "tags": "CREATE TABLE `{db}`.tags (id VARCHAR(20) PRIMARY KEY, n INT, flag BIT(1))",
    "dups": "CREATE TABLE `{db}`.dups (a INT, b VARCHAR(10))",  # no key, duplicate rows
    "Users": "CREATE TABLE `{db}`.`Users` (id INT PRIMARY KEY, name VARCHAR(20))",
    "users": "CREATE TABLE `{db}`.`users` (id INT PRIMARY KEY, name VARCHAR(20))",
    "order-items": "CREATE TABLE `{db}`.`order-items` (id INT PRIMARY KEY, qty INT)",
    "order_items": "CREATE TABLE `{db}`.`order_items` (id INT PRIMARY KEY, qty INT)",
    "logs": "CREATE TABLE `{db}`.logs (id INT, day INT, v VARCHAR(20), PRIMARY KEY (id, day)) "
            "PARTITION BY RANGE (day) (PARTITION p0 VALUES LESS THAN (10), PARTITION p1 VALUES LESS THAN (20), "
            "PARTITION p2 VALUES LESS THAN MAXVALUE)",
}
# (fraction of the workload, statement, what changes for the statements after it)
DDL = [
    (0.25, "ALTER TABLE `{db}`.accounts ADD COLUMN x INT NOT NULL DEFAULT 7", "x"),
    (0.30, "ALTER TABLE `{db}`.logs TRUNCATE PARTITION p1", None),  # rows gone without row events
    (0.40, "ALTER TABLE `{db}`.tags MODIFY n BIGINT", None),
    (0.45, "ALTER TABLE `{db}`.accounts MODIFY updated DATETIME(0)", None),  # the source rounds every value
    (0.50, "ALTER TABLE `{db}`.events MODIFY score VARCHAR(20)", None),
    (0.55, "ALTER TABLE `{db}`.logs DROP PARTITION p0", None),
    (0.60, "ALTER TABLE `{db}`.accounts RENAME COLUMN owner TO holder", "holder"),
    (0.65, "ALTER TABLE `{db}`.`Users` RENAME COLUMN name TO Name", None),  # case only
    (0.75, "RENAME TABLE `{db}`.tags TO `{db}`.labels", "labels"),
]
TRICKLE_S = 0.5
FINAL = ["accounts", "events", "labels", "dups", "Users", "users", "order-items", "order_items", "logs"]


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


@dataclass
class LakeWorkload:
    """Random transactions over TABLES, with the DDL schedule; counts every row change."""

    mariadb: MariaDB
    db: str
    target: int
    seed: int = 11
    rate: float = 2000.0  # row changes per second
    changes: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    state: set[str] = field(default_factory=set)  # names of the DDL effects so far
    # Past the target, a transaction every TRICKLE_S goes on until this is set, so a loader restarted
    # late still has batches to work on.
    release: threading.Event = field(default_factory=lambda: _set(threading.Event()))

    def create_tables(self) -> None:
        self.mariadb.execute(*(ddl.format(db=self.db) for ddl in TABLES.values()))

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        rnd = random.Random(self.seed)
        conn = self.mariadb.connect(autocommit=False)
        next_id: Counter[str] = Counter()
        started = time.monotonic()
        schedule = list(DDL)
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION time_zone = '+00:00'")
                while self.changes < self.target or not self.release.is_set():
                    if self.changes >= self.target:  # a trickle: the test's cost must not grow with its slowness
                        time.sleep(TRICKLE_S)
                    elif (ahead := self.changes / self.rate - (time.monotonic() - started)) > 0:
                        time.sleep(ahead)
                    for _ in range(rnd.choice([1, 1, 2, 3, 10])):
                        self.changes += self._statement(cur, rnd, next_id)
                    conn.commit()
                    while schedule and self.changes >= self.target * schedule[0][0]:
                        _, sql, effect = schedule.pop(0)
                        cur.execute(sql.format(db=self.db))
                        if effect:
                            self.state.add(effect)
        except BaseException as exc:
            self.error = exc
        finally:
            conn.close()
            self.done.set()

    def _statement(self, cur: Any, rnd: random.Random, next_id: Counter[str]) -> int:
        table = rnd.choices(list(TABLES), weights=[3, 3, 2, 2, 1, 1, 1, 1, 2])[0]
        logical = table
        if table == "tags" and "labels" in self.state:
            table = "labels"
        t = f"`{self.db}`.`{table}`"
        kind = rnd.choices(["insert", "update", "delete"], weights=[5, 3, 1])[0]
        base = next_id[logical]
        lo = max(0, base - 100)
        if kind == "insert":
            n = rnd.choice([1, 1, 2, 5, 20])
            ids = range(base, base + n)
            next_id[logical] += n
            cur.execute(f"INSERT INTO {t} VALUES " + ", ".join(self._row(table, i, rnd) for i in ids))
        elif kind == "update":
            hi = lo + rnd.randint(0, 30)
            if table == "dups":
                cur.execute(f"UPDATE {t} SET b = IF(LENGTH(b) < 9, CONCAT(b, 'u'), 'v0') "
                            "WHERE a BETWEEN %s AND %s LIMIT 3", (lo % 50, hi % 50))
            elif table == "accounts":
                col = "x = x + 1" if "x" in self.state and rnd.random() < 0.5 else "balance = balance + 1"
                cur.execute(f"UPDATE {t} SET {col} WHERE id BETWEEN %s AND %s", (lo, hi))
            elif table == "events":
                col = rnd.choice(["body = CONCAT(body, 'y')", "kind = 'b'", "at = NULL", "score = 42",
                                  "id = id + 5000000000"])
                cur.execute(f"UPDATE {t} SET {col} WHERE id BETWEEN %s AND %s AND id < 5000000000", (lo, hi))
            elif table in ("tags", "labels"):
                col = rnd.choice(["n = n + 1", "flag = IF(flag = b'1', b'0', b'1')", "id = CONCAT(id, 'm')"])
                cur.execute(f"UPDATE {t} SET {col} WHERE n BETWEEN %s AND %s AND id NOT LIKE '%%m'", (lo, hi))
            elif table == "logs":
                cur.execute(f"UPDATE {t} SET v = CONCAT(LEFT(v, 18), 'u') WHERE id BETWEEN %s AND %s", (lo, hi))
            else:
                col = "name = CONCAT(name, '!')" if "sers" in table else "qty = qty + 1"
                cur.execute(f"UPDATE {t} SET {col} WHERE id BETWEEN %s AND %s", (lo, hi))
        else:
            if table == "dups":
                cur.execute(f"DELETE FROM {t} WHERE a = %s LIMIT 1", (rnd.randint(0, 49),))
            else:
                key = "n" if table in ("tags", "labels") else "id"
                cur.execute(f"DELETE FROM {t} WHERE {key} BETWEEN %s AND %s", (lo, lo + rnd.randint(0, 3)))
        return int(cur.rowcount)

    def _row(self, table: str, i: int, rnd: random.Random) -> str:
        if table == "accounts":
            x = f", {rnd.choice([0, i])}" if "x" in self.state else ""
            return (f"({i}, 'owner {i}', {rnd.randint(-10**6, 10**6)}.{i % 100:02d}, "
                    f"'2024-01-01 00:00:00.{i % 999999:06d}'{x})")
        if table == "events":
            at = f"'2024-02-02 02:02:02.{i % 1000:03d}'" if i % 7 else "NULL"
            return f"({i}, '{rnd.choice('abc')}', REPEAT('x', {i % 300}), {at}, {i % 1000})"
        if table in ("tags", "labels"):
            return f"('tag-{i}', {i}, b'{i % 2}')"
        if table == "dups":
            return f"({i % 50}, 'v{i % 3}')"  # many duplicates
        if "sers" in table:
            return f"({i}, '{table[0]}{i}')"
        if table == "logs":
            return f"({i}, {i % 30}, 'v{i}')"
        return f"({i}, {i % 10})"


@pytest.fixture
def stack(source: MariaDB, database: str, nats_url: str, parser: ServiceProcess, sink_factory: ServiceFactory,
          service_factory: ServiceFactory, tmp_path: Path) -> Stack:
    """parser + one sink + meta + store running (no loader yet), on the test's source server."""
    return start_stack(source, database, nats_url, sink_factory, service_factory, tmp_path)


def start_stack(mariadb: MariaDB, database: str, nats_url: str, sink_factory: ServiceFactory,
                service_factory: ServiceFactory, tmp_path: Path, **sink_env: str) -> Stack:
    """One sink (its settings in `sink_env`) + meta + store, for a running parser."""
    sink_factory("sink", **sink_env)
    meta = service_factory("services.meta", "meta")
    store = service_factory("services.store", "store")
    wait_until(lambda: services_answer(nats_url), 60, "meta and store to answer", interval=0.5)
    assert meta.running and store.running
    return Stack(mariadb, database, nats_url, tmp_path / "data", service_factory)


# -- checks -----------------------------------------------------------------------------------


def assert_changelog_exactly_once(stack: Stack) -> None:
    """Every change of BINLAKE_CDC (re-snapshot rows too) is in exactly one changelog row."""
    cdc = [m for m in read_stream_sync(stack.nats_url, "BINLAKE_CDC")
           if m.env.get("db") == stack.db and m.env["op"] in ("i", "u", "d", "r")]
    by_table: dict[str, Counter[tuple[int, int]]] = {}
    for m in cdc:
        by_table.setdefault(m.env["table"], Counter()).update((m.seq, i) for i in range(len(m.env["rows"])))
    lake: Counter[tuple[int, int]] = Counter()
    for table in FINAL:
        log = stack.changelog(table)
        assert log is not None, table
        rows = log.select(["_binlake_op", "_binlake_seq", "_binlake_row"]).to_pylist()
        lake.update((r["_binlake_seq"], r["_binlake_row"]) for r in rows if r["_binlake_op"] != "ddl")
    dups = {k: n for k, n in lake.items() if n > 1}
    assert not dups, f"changes in the changelog more than once: {list(dups.items())[:10]}"
    want = sum(by_table.values(), Counter())
    assert lake == want, f"{sum((want - lake).values())} changes missing, {sum((lake - want).values())} extra"


def run_load(stack: Stack, *, kills: int, merge_kill: bool, rate: float, target: int) -> LakeWorkload:
    """The workload with `kills` loader kills mid-batch (and one mid-merge): changes flow until the last."""
    workload = LakeWorkload(stack.mariadb, stack.db, target=target, rate=rate)
    if kills or merge_kill:
        workload.release.clear()
    stack.start_loader()  # Spark starts while the workload runs
    workload.create_tables()
    thread = workload.start()
    rnd = random.Random(5)
    for _ in range(kills):
        proc = stack.loader
        def committed(p: ServiceProcess = proc) -> bool:
            return bool(commits(p)) or not p.running or workload.error is not None

        wait_until(committed, 600, "a loader.committed", interval=1)
        assert workload.error is None, workload.error
        assert proc.running, proc.output[-5000:]
        time.sleep(rnd.uniform(0, 3))  # somewhere in the next batch (or between commit and ack)
        proc.kill()
        stack.start_loader()
    if merge_kill:
        proc = stack.loader
        def merging(p: ServiceProcess = proc) -> bool:
            return bool(events(p, "lake.merge_started")) or not p.running

        wait_until(merging, 600, "a merge", interval=0.2)
        assert proc.running, proc.output[-5000:]
        time.sleep(rnd.uniform(0.2, 1.0))
        proc.kill()
        stack.start_loader()
    workload.release.set()
    thread.join(900)
    assert workload.done.is_set() and workload.error is None, workload.error
    return workload


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.timeout(1500)
@BOTH_SOURCES
def test_random_workload_with_ddl_and_kills_lands_in_the_lake_exactly(stack, source, spark):
    """DDL of every kind (partition statements, a DATETIME precision change and a case-only column rename
    among them), a keyless table with duplicates, case-colliding names; kills mid-batch and mid-merge.

    The loader's kills do not depend on the source: one kill mid-batch on both, and on MariaDB one more
    mid-merge (each restart is a new Spark JVM)."""
    stack.env_extra["BINLAKE_MERGE_ROWS"] = "1500"
    mysql = source.kind == "mysql"
    workload = run_load(stack, kills=1, merge_kill=not mysql, rate=400, target=8000)
    assert workload.state == {"x", "holder", "labels"}
    cdc = stack.wait_cdc(workload.changes)
    stack.wait_loaded(max(m.seq for m in cdc))
    stack.wait_resnapshots()
    stack.wait_merged(FINAL)
    for proc in stack.loaders[:-1]:
        assert not proc.running
    for table in FINAL:
        assert_cells_equal(stack, table)
    assert_changelog_exactly_once(stack)
    assert stack.current("tags") is None, "the renamed table's lake table stayed behind"
    assert_verify_equal(spark, stack)


@pytest.mark.timeout(900)
def test_truncate_drop_and_recreate(stack):
    db = stack.db
    create = "CREATE TABLE `{db}`.`{t}` (id INT PRIMARY KEY, v VARCHAR(20))"
    ins = "INSERT INTO `{db}`.`{t}` VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(1, 21))
    stack.mariadb.execute(*(create.format(db=db, t=t) for t in ("kept", "emptied", "dropped")),
                          *(ins.format(db=db, t=t) for t in ("kept", "emptied", "dropped")))
    stack.start_loader()
    cdc = stack.wait_cdc(60)
    stack.wait_loaded(max(m.seq for m in cdc))
    stack.mariadb.execute(
        f"TRUNCATE TABLE `{db}`.kept",
        f"INSERT INTO `{db}`.kept VALUES (100, 'after'), (7, 'again')",
        f"UPDATE `{db}`.emptied SET v = 'changed' WHERE id <= 5",
        f"TRUNCATE TABLE `{db}`.emptied",
        f"DROP TABLE `{db}`.dropped",
        f"CREATE TABLE `{db}`.dropped (id INT PRIMARY KEY, w INT, v VARCHAR(20))",
        f"INSERT INTO `{db}`.dropped VALUES (1, 2, 'reborn')")
    cdc = stack.wait_cdc(60 + 2 + 5 + 1)
    stack.wait_loaded(max(m.seq for m in cdc))
    stack.wait_merged(["kept", "emptied", "dropped"])
    for table in ("kept", "emptied", "dropped"):
        assert_cells_equal(stack, table)
    log = stack.changelog("dropped")
    assert log is not None
    ops = Counter(log.column("_binlake_op").to_pylist())
    assert ops["i"] == 21 and ops["ddl"] >= 2, ops  # the history of both incarnations is kept


async def _hold_loader_lease(nats_url: str, owner: str, taken: threading.Event, stop: threading.Event) -> None:
    """Take the loader's lease as a second instance would, keep it until `stop`, then free it."""
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(Names("binlake").leases_bucket)
        key = keys.loader_lease("main", "loader")
        rev = await kv.put(key, owner.encode())
        taken.set()
        while not stop.is_set():
            await asyncio.sleep(0.3)  # well within the tests' 2 s lease TTL
            rev = await kv.update(key, owner.encode(), last=rev)
        await kv.delete(key, last=rev)
    finally:
        await nc.close()


@pytest.mark.timeout(600)
def test_a_loader_that_loses_its_lease_waits_as_standby_and_takes_over_again(stack):
    """A lost lease (taken, or NATS away longer than its TTL) must not end the loader: it goes back
    to standby without writing, and loads again once the lease is free."""
    db = stack.db
    stack.mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v INT)",
                          f"INSERT INTO `{db}`.t VALUES " + ", ".join(f"({i}, {i})" for i in range(100)))
    loader = stack.start_loader()
    stack.wait_loaded(max(m.seq for m in stack.wait_cdc(100)))
    taken, stop = threading.Event(), threading.Event()
    thief = threading.Thread(target=lambda: asyncio.run(
        _hold_loader_lease(stack.nats_url, "another-loader", taken, stop)), daemon=True)
    thief.start()
    try:
        assert taken.wait(30)
        wait_until(lambda: '"lease.standby"' in loader.output, 60, "the loader to step down")
        assert "another-loader" in loader.output
        held = stack.committed()
        stack.mariadb.execute(f"UPDATE `{db}`.t SET v = v + 1 WHERE id < 50")
        cdc = stack.wait_cdc(150)
        time.sleep(5)
        assert stack.committed() == held, "a loader without the lease wrote to the lake"
    finally:
        stop.set()
        thief.join(30)
    stack.wait_loaded(max(m.seq for m in cdc))
    stack.wait_merged(["t"])
    assert_cells_equal(stack, "t")
    assert loader.running and len(stack.loaders) == 1
    assert loader.output.count('"lease.acquired"') == 2, loader.output[-4000:]


@pytest.mark.timeout(300)
def test_a_loader_whose_batches_cannot_be_fetched_says_why_on_healthz(nats_url, service_factory, tmp_path):
    """No store answers: each try of the loader fails and is restarted; meanwhile /healthz says 503 and why."""
    port = free_port()
    loader = service_factory("services.loader", "loader", BINLAKE_DATA_DIR=str(tmp_path / "data"),
                             BINLAKE_MASTER="local[1]", BINLAKE_METRICS_PORT=str(port))

    def unhealthy() -> str | None:
        assert loader.running or "loader:" in loader.output, loader.output[-3000:]
        try:
            code, body = http_get(f"http://127.0.0.1:{port}/healthz")
        except OSError:  # not listening yet
            return None
        return body if code == 503 else None

    body = wait_until(unhealthy, 180, "/healthz to report the failing loader")
    assert body.startswith("loader: ") and "store" in body.lower(), body


@pytest.mark.timeout(900)
def test_columns_a_sink_rule_drops_never_reach_the_lake(mariadb, database, nats_url, parser, sink_factory,
                                                        service_factory, tmp_path):
    """Issue 14: the sink's column rules reach the DDL the loader builds lake tables from, so an excluded
    column is no lake column (not even an empty one, after CREATE TABLE or ADD COLUMN), a `_binlake_*`
    column the lake refuses loads once excluded, and a masked INT is a string column from the start."""
    db = database
    q = f"`{db}`"
    stack = start_stack(mariadb, db, nats_url, sink_factory, service_factory, tmp_path,
                        BINLAKE_COLUMNS_EXCLUDE=json.dumps({f"{db}.t": ["secret", "secret2"],
                                                            f"{db}.book": ["_binlake_x"]}),
                        BINLAKE_MASKS=json.dumps({f"{db}.t": {"n": "replace:x", "m": "replace:y"}}),
                        BINLAKE_MASK_SALT="salt")
    stack.start_loader()
    mariadb.execute(f"CREATE TABLE {q}.t (id INT PRIMARY KEY, v VARCHAR(20), secret VARCHAR(40), n INT)",
                    f"CREATE TABLE {q}.book (id INT PRIMARY KEY, _binlake_x INT, v INT)",
                    f"INSERT INTO {q}.t VALUES (1, 'a', 'clear-1', 10), (2, 'b', 'clear-2', 20)",
                    f"INSERT INTO {q}.book VALUES (1, 7, 70), (2, 8, 80)")
    stack.wait_loaded(max(m.seq for m in stack.wait_cdc(4)))
    stack.wait_merged(["t", "book"])
    lake = stack.current("t")
    assert lake is not None and lake.column_names == ["id", "v", "n"]
    assert lake.schema.field("n").type == pa.string()  # the CREATE gave the masked column the rows' type
    assert sorted(lake.to_pylist(), key=lambda r: r["id"]) == [{"id": 1, "v": "a", "n": "x"},
                                                               {"id": 2, "v": "b", "n": "x"}]
    book = stack.current("book")
    assert book is not None and book.column_names == ["id", "v"]
    assert sorted(book.to_pylist(), key=lambda r: r["id"]) == [{"id": 1, "v": 70}, {"id": 2, "v": 80}]

    mariadb.execute(f"ALTER TABLE {q}.t ADD COLUMN secret2 VARCHAR(40) NOT NULL DEFAULT 'clear-default' AFTER v",
                    f"ALTER TABLE {q}.t ADD COLUMN m INT NOT NULL DEFAULT 5 AFTER secret",
                    f"INSERT INTO {q}.t VALUES (3, 'c', 'clear-s2', 'clear-3', 6, 30)",  # id v secret2 secret m n
                    f"UPDATE {q}.t SET secret2 = 'clear-changed', v = 'a!' WHERE id = 1",
                    f"ALTER TABLE {q}.t DROP COLUMN secret")
    stack.wait_loaded(max(m.seq for m in stack.wait_cdc(6)))

    def ddls() -> list[str]:
        log = stack.changelog("t")
        rows = [] if log is None else sorted(log.to_pylist(), key=lambda r: r["_binlake_seq"])
        return [r["_binlake_ddl"] for r in rows if r["_binlake_op"] == "ddl"]

    wait_until(lambda: len(ddls()) == 4, 300, "the DROP COLUMN after the last row in the lake", interval=2)
    stack.wait_merged(["t"])
    lake = stack.current("t")
    assert lake is not None and lake.column_names == ["id", "v", "n", "m"]
    # Existing rows got the ADD's DEFAULT masked, as their values are when they change.
    assert sorted(lake.to_pylist(), key=lambda r: r["id"]) == [{"id": 1, "v": "a!", "n": "x", "m": "y"},
                                                               {"id": 2, "v": "b", "n": "x", "m": "y"},
                                                               {"id": 3, "v": "c", "n": "x", "m": "y"}]
    log = stack.changelog("t")
    assert log is not None
    assert not [c for c in log.column_names if "secret" in c or c.startswith("_binlake_was_")], log.column_names
    flat = json.dumps(log.drop_columns(["_binlake_ddl", "_binlake_ts"]).to_pylist())
    assert "clear" not in flat
    # The DDL itself is in the changelog as the source ran it (services/sink/rules.py says why).
    ddl = ddls()
    assert len(ddl) == 4 and "secret" in ddl[0] and "clear-default" in ddl[1], ddl
    assert stack.loader.running


@pytest.mark.timeout(900)
def test_rows_larger_than_a_message_land_in_the_lake_byte_exact_while_other_tables_flow(stack):
    """2 MiB and 64 MiB LONGBLOBs go through the object buckets; the small tables never wait for them,
    and a transaction of two 2 MiB rows (each an object) is committed whole."""
    db = stack.db
    stack.mariadb.execute(f"CREATE TABLE `{db}`.blobs (id INT PRIMARY KEY, b LONGBLOB, note VARCHAR(20))",
                          f"CREATE TABLE `{db}`.small (id INT PRIMARY KEY, v INT)")
    stack.start_loader()
    sizes = {1: 2 * 1024 * 1024, 2: 64 * 1024 * 1024, 3: 10, 4: 2 * 1024 * 1024}
    small = 0
    for key, size in sizes.items():
        # Bytes that differ along the value, so a chunk out of place or missing shows.
        stack.mariadb.execute(
            f"INSERT INTO `{db}`.blobs VALUES ({key}, SUBSTRING(REPEAT(SHA2('{key}', 256), {size // 64 + 1}), 1, "
            f"{size}), 'n{key}')",
            f"INSERT INTO `{db}`.small VALUES " + ", ".join(f"({small + i}, {i})" for i in range(50)))
        small += 50
    # One transaction of two rows, each a 2 MiB before and after: two objects
    stack.mariadb.execute(f"UPDATE `{db}`.blobs SET note = 'changed' WHERE id IN (1, 4)")
    cdc = stack.wait_cdc(len(sizes) + small + 2, timeout=300)
    refs = [m for m in read_stream_sync(stack.nats_url, "BINLAKE_CDC", resolve=False) if "Binlake-Object" in m.headers]
    assert len(refs) == 5 and all(m.env["ref"]["bucket"] == "binlake_cdc_objects" for m in refs)
    stack.wait_loaded(max(m.seq for m in cdc))
    first, last = (m.seq for m in cdc if m.env["op"] == "u")
    assert not [seq for seq in commits(stack.loader) if first <= seq < last], "the UPDATE was committed in parts"
    stack.wait_merged(["blobs", "small"])
    for table in ("blobs", "small"):
        assert_cells_equal(stack, table)
    lake = stack.current("blobs")
    assert lake is not None
    assert sorted(len(b) for b in lake.column("b").to_pylist()) == sorted(sizes.values())
    assert stack.loader.running and "ObjectMissing" not in stack.loader.output

"""DDL the source applies to existing values without row events, followed by the lake (DESIGN §8.8):
partition statements, MODIFYs keeping the lake type, and a re-snapshot request that survives a kill.

Every service is a real process (tests/integration/lake_stack.py); the lake is read without Spark.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from services.launcher.processes import ServiceProcess
from services.loader.naming import BOOK_NAMESPACE, RESNAPSHOTS_TABLE
from tests.integration.lake_stack import Stack, assert_cells_equal, read_table
from tests.integration.support import read_stream_sync, snapshot_cli, wait_until
from tests.integration.test_loader import start_stack
from tests.servers import MariaDB

ServiceFactory = Callable[..., ServiceProcess]


@pytest.fixture
def stack(source: MariaDB, database: str, nats_url: str, parser: ServiceProcess, sink_factory: ServiceFactory,
          service_factory: ServiceFactory, tmp_path: Path) -> Stack:
    return start_stack(source, database, nats_url, sink_factory, service_factory, tmp_path)


@pytest.fixture
def slow_snapshots(source: MariaDB, database: str, nats_url: str, parser_factory: Callable[..., ServiceProcess],
                   sink_factory: ServiceFactory, service_factory: ServiceFactory,
                   tmp_path: Path) -> tuple[Stack, ServiceProcess]:
    """The stack, its parser snapshotting in chunks of 20 rows at 100 rows/s."""
    parser = parser_factory(BINLAKE_SNAPSHOT_CHUNK_ROWS="20", BINLAKE_SNAPSHOT_MAX_ROWS_S="100")
    return start_stack(source, database, nats_url, sink_factory, service_factory, tmp_path), parser


def wait_equal(stack: Stack, *tables: str, timeout: float = 600) -> None:
    """Until every table's current lake rows equal the source's (the loader must stay up)."""
    last: list[str] = []

    def equal() -> bool:
        assert stack.loader.running, f"the loader died:\n{stack.loader.output[-5000:]}"
        try:
            for t in tables:
                assert_cells_equal(stack, t)
        except AssertionError as exc:
            last[:] = [str(exc)]
            return False
        return True

    try:
        wait_until(equal, timeout, f"the lake to equal the source for {tables}", interval=3)
    except AssertionError:
        raise AssertionError(f"{last}; the loader said:\n{stack.loader.output[-6000:]}") from None


def requests(stack: Stack) -> list[dict[str, object]]:
    rows = read_table(Path(stack.warehouse) / BOOK_NAMESPACE / RESNAPSHOTS_TABLE)
    return [] if rows is None else rows.to_pylist()


def snapshot_rows(stack: Stack, table: str) -> int:
    return sum(len(m.env["rows"]) for m in read_stream_sync(stack.nats_url, "BINLAKE_CDC")
               if m.env.get("db") == stack.db and m.env.get("table") == table and m.env["op"] == "r")


@pytest.mark.timeout(1200)
def test_partition_statements_leave_the_lake_equal_to_the_source_for_both_tables_of_an_exchange(stack):
    db = stack.db
    stack.mariadb.execute(
        f"CREATE TABLE `{db}`.parts (id INT PRIMARY KEY, v VARCHAR(10)) PARTITION BY RANGE (id) "
        "(PARTITION p0 VALUES LESS THAN (10), PARTITION p1 VALUES LESS THAN (20), "
        "PARTITION p2 VALUES LESS THAN (30), PARTITION p3 VALUES LESS THAN MAXVALUE)",
        f"CREATE TABLE `{db}`.outside (id INT PRIMARY KEY, v VARCHAR(10))",
        f"INSERT INTO `{db}`.parts VALUES " + ", ".join(f"({i}, 'p{i}')" for i in range(40)),
        f"INSERT INTO `{db}`.outside VALUES " + ", ".join(f"({i}, 'o{i}')" for i in range(10, 15)))
    stack.start_loader()
    wait_equal(stack, "parts", "outside")
    stack.mariadb.execute(
        f"ALTER TABLE `{db}`.parts TRUNCATE PARTITION p0",
        f"ALTER TABLE `{db}`.parts EXCHANGE PARTITION p1 WITH TABLE `{db}`.outside",
        f"ALTER TABLE `{db}`.parts DROP PARTITION p2",
        f"INSERT INTO `{db}`.parts VALUES (1, 'after'), (45, 'after')",
        f"UPDATE `{db}`.outside SET v = 'after' WHERE id = 15")
    assert len(stack.mariadb.query(f"SELECT * FROM `{db}`.parts")) == 5 + 10 + 2  # outside's rows, p3, the inserts
    wait_equal(stack, "parts", "outside")
    assert {(r["db"], r["tbl"]) for r in requests(stack)} == {(db, "parts"), (db, "outside")}
    assert all(r["filed"] for r in requests(stack))


@pytest.mark.timeout(1200)
def test_modify_keeping_the_lake_type_leaves_the_lake_equal_to_the_source(stack):
    db = stack.db
    stack.mariadb.execute(
        f"CREATE TABLE `{db}`.mods (id INT PRIMARY KEY, d DATETIME(6), v VARCHAR(20), e ENUM('a','b','c'))",
        f"CREATE TABLE `{db}`.loose (d DATETIME(6), v VARCHAR(20))",  # no key
        f"INSERT INTO `{db}`.mods VALUES " + ", ".join(
            f"({i}, '2024-01-01 00:00:0{i}.{i}7{i}999', 'value number {i:02d}', '{'abc'[i % 3]}')" for i in range(9)),
        f"INSERT INTO `{db}`.loose VALUES ('2024-01-01 00:00:00.999999', 'a long value')")
    stack.start_loader()
    wait_equal(stack, "mods", "loose")
    stack.mariadb.execute(
        "SET SESSION sql_mode = ''",  # the source converts what does not fit, as a lax server does
        f"ALTER TABLE `{db}`.mods MODIFY d DATETIME(0)",
        f"ALTER TABLE `{db}`.mods MODIFY v VARCHAR(5)",
        f"ALTER TABLE `{db}`.mods MODIFY e ENUM('a','b')",
        f"ALTER TABLE `{db}`.loose MODIFY d DATETIME(0), MODIFY v VARCHAR(3)",
        f"INSERT INTO `{db}`.mods VALUES (100, '2024-05-05 05:05:05', 'new', 'b')")
    wait_equal(stack, "mods")
    assert any(r["tbl"] == "loose" for r in requests(stack))  # keyless tables ask for it too


@pytest.mark.timeout(1200)
def test_a_resnapshot_request_survives_a_loader_killed_after_the_commit_of_its_ddl(stack):
    db = stack.db
    stack.mariadb.execute(
        f"CREATE TABLE `{db}`.casts (id INT PRIMARY KEY, v VARCHAR(10))",
        f"INSERT INTO `{db}`.casts VALUES (1, '12abc'), (2, '7'), (3, ' 8'), (4, 'x')")
    dying = stack.factory("tests.integration.loader_dies_before_filing", "loader-dies", **stack.env)

    def loaded() -> bool:
        assert dying.running, dying.output[-5000:]
        current = stack.current("casts")
        return current is not None and current.num_rows == 4

    wait_until(loaded, 600, "the first rows in the lake", interval=2)
    stack.mariadb.execute("SET SESSION sql_mode = ''", f"ALTER TABLE `{db}`.casts MODIFY v INT")
    wait_until(lambda: not dying.running, 600, "the loader to die before filing", interval=1)
    pending = requests(stack)
    assert [(r["tbl"], r["filed"]) for r in pending] == [("casts", False)], pending
    current = stack.current("casts")
    assert current is not None
    assert dict(zip(current.column("id").to_pylist(), current.column("v").to_pylist(), strict=True))[1] is None, \
        "Spark's cast of '12abc' (the value the re-snapshot corrects)"
    stack.start_loader()
    wait_equal(stack, "casts")
    assert [(r["tbl"], r["filed"]) for r in requests(stack)] == [("casts", True)]
    assert snapshot_rows(stack, "casts") == 4  # one re-snapshot


@pytest.mark.timeout(1200)
def test_a_partition_dropped_during_a_snapshot_of_its_table_restarts_the_snapshot(slow_snapshots):
    stack, parser = slow_snapshots
    db = stack.db
    stack.mariadb.execute(
        f"CREATE TABLE `{db}`.big (id INT PRIMARY KEY, v INT) PARTITION BY RANGE (id) "
        "(PARTITION p0 VALUES LESS THAN (500), PARTITION p1 VALUES LESS THAN (1000))",
        f"INSERT INTO `{db}`.big VALUES " + ", ".join(f"({i}, {i})" for i in range(1000)))
    stack.start_loader()
    wait_equal(stack, "big")
    done = snapshot_cli(stack.nats_url, f"{db}.big", "--no-wait")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: snapshot_rows(stack, "big") >= 100, 300, "a part of the snapshot in BINLAKE_CDC", interval=0.5)
    stack.mariadb.execute(f"ALTER TABLE `{db}`.big DROP PARTITION p1")
    assert snapshot_rows(stack, "big") < 1000, "the snapshot was over before the statement: nothing is shown"
    wait_equal(stack, "big")
    assert '"snapshot.restarted"' in parser.output

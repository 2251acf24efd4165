"""Crash safety: kill -9 at random moments, standby takeover, and schema changes mid-stream."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.integration.conftest import ParserFactory
from tests.integration.exactly_once import assert_exactly_once
from tests.integration.support import (
    count_rows,
    read_stream_sync,
    wait_until,
)
from tests.integration.workload import Workload
from tests.servers import MariaDB


def _run_workload(workload: Workload) -> threading.Thread:
    workload.create_tables()
    thread = threading.Thread(target=workload.run, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(300)
def test_kill_9_at_random_moments_loses_and_duplicates_nothing(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    workload = Workload(mariadb, database, target=20_000)
    parser = parser_factory(BINLAKE_INSTANCE="crash-test")
    thread = _run_workload(workload)
    rnd = random.Random(11)
    kills = 0
    while not workload.done.is_set() or kills < 5:
        time.sleep(rnd.uniform(0.3, 1.5))
        parser.kill()
        kills += 1
        parser = parser_factory(wait_ready=False, log_name=f"parser{kills}.log", BINLAKE_INSTANCE="crash-test")
    thread.join()
    assert workload.error is None, workload.error
    assert kills >= 5 and workload.changes >= 20_000
    wait_until(lambda: count_rows(read_stream_sync(nats_url), database) >= workload.changes, 120,
               f"{workload.changes} row changes in BINLAKE_RAW")
    assert_exactly_once(read_stream_sync(nats_url), workload)


@pytest.mark.timeout(180)
def test_standby_takes_over_when_the_active_parser_dies(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    workload = Workload(mariadb, database, target=6_000, seed=3)
    active = parser_factory(BINLAKE_INSTANCE="a")
    standby = parser_factory(wait_ready=False, log_name="standby.log", BINLAKE_INSTANCE="b")
    wait_until(lambda: '"lease.standby"' in standby.output, 20, "the second parser to wait as standby")
    thread = _run_workload(workload)
    wait_until(lambda: count_rows(read_stream_sync(nats_url), database) > 1000, 60, "the first changes")
    active.kill()
    killed_at = time.monotonic()
    wait_until(lambda: '"lease.acquired"' in standby.output, 20, "the standby to take over")
    assert time.monotonic() - killed_at < 10
    thread.join()
    assert workload.error is None
    wait_until(lambda: count_rows(read_stream_sync(nats_url), database) >= workload.changes, 60, "every change")
    assert_exactly_once(read_stream_sync(nats_url), workload)
    assert standby.running


def test_rows_decode_with_the_columns_they_were_written_with(mariadb_factory, parser_factory, nats_url):
    server: MariaDB = mariadb_factory()
    server.execute(
        "CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY, a INT, b VARCHAR(10))",
        "INSERT INTO s.t VALUES (1, 10, 'one')",
        "ALTER TABLE s.t ADD COLUMN c DATE",
        "INSERT INTO s.t VALUES (2, 20, 'two', '2020-02-02')",
        "UPDATE s.t SET a = 11 WHERE id = 1",
        "ALTER TABLE s.t DROP COLUMN a",
        "INSERT INTO s.t VALUES (3, 'three', NULL)",
        "ALTER TABLE s.t RENAME COLUMN b TO name",
        "INSERT INTO s.t VALUES (4, 'four', '2024-04-04')",
        "DELETE FROM s.t WHERE id = 2",
    )
    # The parser starts after every ALTER and reads the old binlog: each row still decodes with
    # the columns of its own moment, because they come from that moment's TableMap.
    parser_factory(BINLAKE_SOURCE_URL=server.dsn(), BINLAKE_START="earliest")
    msgs = wait_until(lambda: (m := [x for x in read_stream_sync(nats_url) if x.env.get("db") == "s"])
                      and len(m) >= 10 and m, 30, "all events of s.t")
    got = [(m.env["op"], m.env.get("ddl") or m.env["rows"]) for m in msgs if m.env["table"] == "t"]
    assert got == [
        ("ddl", "CREATE TABLE s.t (id INT PRIMARY KEY, a INT, b VARCHAR(10))"),
        ("i", [{"after": {"id": 1, "a": 10, "b": "one"}}]),
        ("ddl", "ALTER TABLE s.t ADD COLUMN c DATE"),
        ("i", [{"after": {"id": 2, "a": 20, "b": "two", "c": "2020-02-02"}}]),
        ("u", [{"before": {"id": 1, "a": 10, "b": "one", "c": None},
                "after": {"id": 1, "a": 11, "b": "one", "c": None}}]),
        ("ddl", "ALTER TABLE s.t DROP COLUMN a"),
        ("i", [{"after": {"id": 3, "b": "three", "c": None}}]),
        ("ddl", "ALTER TABLE s.t RENAME COLUMN b TO name"),
        ("i", [{"after": {"id": 4, "name": "four", "c": "2024-04-04"}}]),
        ("d", [{"before": {"id": 2, "name": "two", "c": "2020-02-02"}}]),
    ]
    assert [m.subject.split(".")[-1] for m in msgs if m.env["table"] == "t"] == ["t"] * 10

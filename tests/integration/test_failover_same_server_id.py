"""Failover between servers that share a server_id (DESIGN §8.2, §8.8).

A primary and a replica that logs what it replicates (MariaDB, or MySQL); the primary's binlog
numbers run ahead of the replica's (it flushed its logs), so every position of the replica is
lower than the primary's. The primary dies, the replica is promoted and given the primary's
server_id (Galera nodes, clones and replicas configured alike share it), and the parser is
pointed at it. The parser must see another server (its binlog at the resume point is not the
one it read) and move into the next epoch; a parser that does not see it must halt rather than
publish order keys that go backwards, which the lake would drop as already applied.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from services.launcher.processes import ServiceProcess
from tests.integration.conftest import ParserFactory
from tests.integration.support import StoredMsg, parser_env, read_stream_sync, replay, wait_until
from tests.servers import MariaDB, MySQL

DB, TABLES = "shop", ("a", "b")


def workload(server: MariaDB, rng: random.Random, transactions: int, ids: list[int]) -> None:
    """Transactions of 1-4 inserts and updates over the tables."""
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            for _ in range(transactions):
                cur.execute("BEGIN")
                for _ in range(rng.randint(1, 4)):
                    table = rng.choice(TABLES)
                    if rng.random() < 0.7 or not ids:
                        ids.append(len(ids) + 1)
                        cur.execute(f"INSERT INTO {DB}.{table} VALUES ({ids[-1]}, 0)")
                    else:
                        cur.execute(f"UPDATE {DB}.{table} SET v = v + 1 WHERE id = {rng.choice(ids)}")
                cur.execute("COMMIT")
    finally:
        conn.close()


def rows(server: MariaDB, table: str) -> dict[int, dict[str, int]]:
    return {int(i): {"id": int(i), "v": int(v)} for i, v in server.query(f"SELECT id, v FROM {DB}.{table}")}


def table_keys(msgs: list[StoredMsg]) -> dict[str, list[tuple[int, int]]]:
    keys: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for m in msgs:
        if m.env.get("db") == DB:
            keys[m.env["table"]].append((m.env["scn"], m.env.get("chunk", 0)))
    return keys


def assert_increasing(msgs: list[StoredMsg]) -> None:
    for table, keys in table_keys(msgs).items():
        assert all(a < b for a, b in itertools.pairwise(keys)), f"{table}: order keys not increasing"


def fail_over_to_a_replica_with_the_same_server_id(
        servers: Callable[[], tuple[MariaDB, MariaDB]], parser_factory: ParserFactory, nats_url: str,
        rng: random.Random, ids: list[int]) -> MariaDB:
    """Publish a workload from the primary, kill it, and promote its replica under server_id 1."""
    primary, replica = servers()
    mariadb = not isinstance(primary, MySQL)
    primary.execute(*["FLUSH NO_WRITE_TO_BINLOG BINARY LOGS"] * 3, f"CREATE DATABASE {DB}",
                    *(f"CREATE TABLE {DB}.{t} (id INT PRIMARY KEY, v INT)" for t in TABLES))
    if mariadb:
        replica.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, MASTER_USER='root', "
                        "MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos", "START SLAVE")
    else:
        replica.execute(f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='127.0.0.1', SOURCE_PORT={primary.port}, "
                        "SOURCE_USER='root', SOURCE_PASSWORD='', SOURCE_AUTO_POSITION=1, GET_SOURCE_PUBLIC_KEY=1",
                        "START REPLICA")
    first = parser_factory(BINLAKE_SOURCE_URL=primary.dsn(), BINLAKE_START="earliest")
    workload(primary, rng, 60, ids)
    wait_until(lambda: all(replay(read_stream_sync(nats_url), DB, t) == rows(primary, t) for t in TABLES), 120,
               "the parser to publish the primary's workload")
    first.stop()
    if mariadb:
        pos = primary.query("SELECT @@gtid_binlog_pos")[0][0]
        assert replica.query(f"SELECT MASTER_GTID_WAIT('{pos}', 60)")[0][0] == 0
    else:
        executed = primary.query("SELECT @@gtid_executed")[0][0]
        assert replica.query("SELECT WAIT_FOR_EXECUTED_GTID_SET(%s, 60)", executed)[0][0] == 0
    primary.kill()
    replica.execute(*(("STOP SLAVE", "RESET SLAVE ALL") if mariadb else ("STOP REPLICA", "RESET REPLICA ALL")),
                    "SET GLOBAL server_id = 1")
    assert replica.query("SHOW BINARY LOGS")[-1][0] < primary_file(read_stream_sync(nats_url))
    return replica


def mariadb_pair(request: pytest.FixtureRequest) -> Callable[[], tuple[MariaDB, MariaDB]]:
    make: Callable[..., MariaDB] = request.getfixturevalue("mariadb_factory")
    return lambda: (make(), make(extra_args=["--server-id=2"]))


def mysql_pair(request: pytest.FixtureRequest) -> Callable[[], tuple[MariaDB, MariaDB]]:
    make: Callable[..., MySQL] = request.getfixturevalue("mysql_factory")
    return lambda: (make(), make(server_id=2))


def primary_file(msgs: list[StoredMsg]) -> str:
    return str(msgs[-1].env["resume"]["file"])


@pytest.mark.timeout(400)
@pytest.mark.parametrize("flavour", ["mariadb", "mysql"])
def test_the_parser_sees_another_server_with_the_same_server_id_and_moves_to_the_next_epoch(
        flavour: str, request: pytest.FixtureRequest, parser_factory: ParserFactory,
        sink_factory: Callable[..., ServiceProcess], nats_url: str) -> None:
    """MariaDB: its binlog at the resume point differs; MySQL: its server_uuid differs."""
    rng, ids = random.Random(28), list[int]()
    servers = mariadb_pair(request) if flavour == "mariadb" else mysql_pair(request)
    replica = fail_over_to_a_replica_with_the_same_server_id(servers, parser_factory, nats_url, rng, ids)
    sink_factory("sink")
    second = parser_factory(wait_ready=False, log_name="parser-2.log", BINLAKE_SOURCE_URL=replica.dsn())
    workload(replica, rng, 60, ids)
    want = {t: rows(replica, t) for t in TABLES}

    def caught_up() -> list[StoredMsg] | None:
        assert second.running, second.output[-3000:]
        msgs = read_stream_sync(nats_url, "BINLAKE_CDC")
        return msgs if all(replay(msgs, DB, t) == want[t] for t in TABLES) else None

    msgs = wait_until(caught_up, 120, "BINLAKE_CDC to equal the promoted replica")
    assert_increasing(msgs)
    assert '"pipeline.server_switched"' in second.output and '"same_server_id": true' in second.output
    assert sorted({m.env["scn"] >> 56 for m in msgs if m.env.get("db") == DB}) == [0, 1]


@pytest.mark.timeout(400)
def test_a_parser_blind_to_the_switch_halts_before_an_order_key_goes_backwards(
        request: pytest.FixtureRequest, parser_factory: ParserFactory, nats_url: str, tmp_path: Path) -> None:
    rng, ids = random.Random(29), list[int]()
    replica = fail_over_to_a_replica_with_the_same_server_id(mariadb_pair(request), parser_factory, nats_url, rng,
                                                             ids)
    before = read_stream_sync(nats_url)
    blind = ServiceProcess("tests.integration.blind_parser",
                           parser_env(replica, nats_url, BINLAKE_SOURCE_URL=replica.dsn()),
                           tmp_path / "blind-parser.log").start()
    try:
        workload(replica, rng, 5, ids)
        assert blind.wait(60) == 1, blind.output[-3000:]
    finally:
        blind.stop()
    assert "OrderWentBack" in blind.output and "would go backwards" in blind.output, blind.output[-3000:]
    after = read_stream_sync(nats_url)
    assert [m for m in after if m.env.get("db") == DB] == [m for m in before if m.env.get("db") == DB]
    assert_increasing(after)

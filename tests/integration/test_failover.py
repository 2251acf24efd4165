"""Failover (DESIGN §5, §8.2): the primary dies, the parser continues on its GTID replica.

A primary (server_id 1) and a replica (server_id 2, logging what it replicates, replicating by
GTID), MariaDB or MySQL. The workload runs on the primary with the parser and a sink reading it
(on MySQL some transactions compressed, some tagged); the primary is killed, the replica promoted,
the parser pointed at it (as a DNS name that moves would), and the workload goes on there.
BINLAKE_CDC replayed must equal the replica's tables, with no message id twice and order keys
strictly increasing per table across the switch.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest

from services.launcher.processes import ServiceProcess
from tests.integration.conftest import ParserFactory
from tests.integration.support import StoredMsg, read_stream_sync, replay, wait_until
from tests.servers import MariaDB, MySQL

TABLES = ("a", "b", "c")


def workload(server: MariaDB, db: str, rng: random.Random, transactions: int, ids: list[int]) -> None:
    """Transactions of 1-5 inserts, updates and deletes over the three tables."""
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            for _ in range(transactions):
                if isinstance(server, MySQL):
                    cur.execute(f"SET SESSION binlog_transaction_compression = {rng.randint(0, 1)}")
                    cur.execute("SET gtid_next = %s", (rng.choice(["AUTOMATIC", "AUTOMATIC", "AUTOMATIC:etl"]),))
                cur.execute("BEGIN")
                for _ in range(rng.randint(1, 5)):
                    table = rng.choice(TABLES)
                    op = rng.random()
                    if op < 0.6 or not ids:
                        ids.append(max(ids, default=0) + 1)
                        cur.execute(f"INSERT INTO `{db}`.{table} VALUES ({ids[-1]}, {rng.randint(0, 999)})")
                    elif op < 0.85:
                        cur.execute(f"UPDATE `{db}`.{table} SET v = v + 1 WHERE id = {rng.choice(ids)}")
                    else:
                        cur.execute(f"DELETE FROM `{db}`.{table} WHERE id = {rng.choice(ids)}")
                cur.execute("COMMIT")
    finally:
        conn.close()


def source_rows(server: MariaDB, db: str, table: str) -> dict[int, dict[str, int]]:
    return {int(i): {"id": int(i), "v": int(v)} for i, v in server.query(f"SELECT id, v FROM `{db}`.{table}")}


class Topology:
    """A primary and its GTID replica of one flavour, and how to wait for and promote the replica."""

    def __init__(self, flavour: str, mariadb_factory: Callable[..., MariaDB],
                 mysql_factory: Callable[..., MySQL]) -> None:
        self.flavour = flavour
        if flavour == "mariadb":
            self.primary = mariadb_factory()
            self.replica = mariadb_factory(extra_args=["--server-id=2"])
            self.replica.execute(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.primary.port}, "
                                 "MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos", "START SLAVE")
        else:
            self.primary = mysql_factory()
            self.replica = mysql_factory(server_id=2)
            self.replica.execute(f"CHANGE REPLICATION SOURCE TO SOURCE_HOST='127.0.0.1', "
                                 f"SOURCE_PORT={self.primary.port}, SOURCE_USER='root', SOURCE_PASSWORD='', "
                                 "SOURCE_AUTO_POSITION=1, GET_SOURCE_PUBLIC_KEY=1", "START REPLICA")

    def wait_replica(self) -> None:
        if self.flavour == "mariadb":
            pos = self.primary.query("SELECT @@gtid_binlog_pos")[0][0]
            assert self.replica.query(f"SELECT MASTER_GTID_WAIT('{pos}', 60)")[0][0] == 0
        else:
            executed = self.primary.query("SELECT @@gtid_executed")[0][0]
            assert self.replica.query("SELECT WAIT_FOR_EXECUTED_GTID_SET(%s, 60)", executed)[0][0] == 0

    def promote(self) -> None:
        self.replica.execute(*(("STOP SLAVE", "RESET SLAVE ALL") if self.flavour == "mariadb"
                               else ("STOP REPLICA", "RESET REPLICA ALL")))


def stop_between_transactions(parser: ServiceProcess, nats_url: str) -> None:
    """Kill `parser` at a moment its stream does not end inside a transaction.

    (A switch while the stream ends inside a transaction published in part is refused: the new
    server splits its rows its own way; tests/unit/parser/test_failover.py covers that refusal.)
    """
    for _ in range(200):
        os.kill(parser.pid, signal.SIGSTOP)
        msgs = read_stream_sync(nats_url)
        if not msgs or msgs[-1].env["txn"]["last"]:
            parser.kill()
            return
        os.kill(parser.pid, signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError("the parser's stream never ended between transactions")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("behind", [False, True], ids=["caught-up", "behind"])
@pytest.mark.parametrize("flavour", ["mariadb", "mysql"])
def test_the_parser_moves_to_a_gtid_replica_without_loss_duplicates_or_reordering(
        flavour: str, behind: bool, mariadb_factory: Callable[..., MariaDB], mysql_factory: Callable[..., MySQL],
        parser_factory: ParserFactory, sink_factory: Callable[..., ServiceProcess], nats_url: str) -> None:
    """The primary dies with the parser caught up, or behind it (the parser then publishes the rest
    from the replica, as the replica's changes)."""
    topology = Topology(flavour, mariadb_factory, mysql_factory)
    primary, replica = topology.primary, topology.replica
    db = "shop"
    primary.execute(f"CREATE DATABASE {db}", *(f"CREATE TABLE {db}.{t} (id INT PRIMARY KEY, v INT)" for t in TABLES))
    first = parser_factory(BINLAKE_SOURCE_URL=primary.dsn(), BINLAKE_START="earliest")
    sink_factory("sink")
    rng, ids = random.Random(17), list[int]()
    if behind:  # the parser dies a third of the way into the workload
        workload(primary, db, rng, 50, ids)
        wait_until(lambda: any(m.env.get("db") == db for m in read_stream_sync(nats_url)), 60,
                   "the first changes in BINLAKE_RAW")
        stop_between_transactions(first, nats_url)
        workload(primary, db, rng, 100, ids)
    else:
        workload(primary, db, rng, 150, ids)
        wait_until(lambda: all(replay(read_stream_sync(nats_url), db, t) == source_rows(primary, db, t)
                               for t in TABLES), 120, "the parser to publish the whole workload")
        stop_between_transactions(first, nats_url)

    # The replica has everything; the primary dies.
    topology.wait_replica()
    primary.kill()
    topology.promote()

    # The parser moves, is killed, and moves again. Caught up, it was killed before anything of
    # the replica's was published: the position it stands at is still the old server's, found on
    # the replica by GTID. Behind, it published the rest from the replica, as the replica's: its
    # successor resumes on the same server.
    moving = parser_factory(wait_ready=False, log_name="parser-2.log", BINLAKE_SOURCE_URL=replica.dsn(),
                            BINLAKE_START="earliest")
    if behind:
        wait_until(lambda: all(replay(read_stream_sync(nats_url), db, t) == source_rows(replica, db, t)
                               for t in TABLES) or not moving.running, 120, "the rest from the replica")
        assert moving.running, moving.output[-3000:]
        stop_between_transactions(moving, nats_url)
    else:
        wait_until(lambda: '"pipeline.start"' in moving.output or not moving.running, 60, "the parser on the replica")
        moving.kill()
    second = parser_factory(wait_ready=False, log_name="parser-3.log", BINLAKE_SOURCE_URL=replica.dsn(),
                            BINLAKE_START="earliest")
    workload(replica, db, rng, 150, ids)
    want = {t: source_rows(replica, db, t) for t in TABLES}

    def caught_up() -> list[StoredMsg] | None:
        assert second.running, second.output[-3000:]
        msgs = read_stream_sync(nats_url, "BINLAKE_CDC")
        return msgs if all(replay(msgs, db, t) == want[t] for t in TABLES) else None

    msgs = wait_until(caught_up, 120, "BINLAKE_CDC to equal the promoted replica")
    assert '"pipeline.server_switched"' in moving.output and '"by_gtid": true' in moving.output
    assert ('"pipeline.server_switched"' in second.output) is not behind, second.output[-3000:]
    assert behind or '"by_gtid": true' in second.output
    ids_seen = Counter(m.headers["Nats-Msg-Id"] for m in msgs)
    assert [i for i, n in ids_seen.items() if n > 1] == []
    order: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for m in msgs:
        if m.env.get("db") == db:
            order[m.env["table"]].append((m.env["scn"], m.env.get("chunk", 0)))
    for table, keys in order.items():
        assert all(a < b for a, b in itertools.pairwise(keys)), f"{table}: order keys not increasing"
    epochs = sorted({m.env["scn"] >> 56 for m in msgs if m.env.get("db") == db})
    # changes from both servers, the replica's after the primary's: in epoch 1, or in epoch 2 when
    # the moving parser published a heartbeat in epoch 1 (still at the old server's position)
    # before it was killed and the second parser switched again
    assert epochs in ([[0, 1]] if behind else [[0, 1], [0, 2]]), epochs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("flavour", ["mariadb", "mysql"])
def test_a_server_that_lacks_the_published_transactions_is_refused_with_the_fix(
        flavour: str, mariadb_factory: Callable[..., MariaDB], mysql_factory: Callable[..., MySQL],
        parser_factory: ParserFactory, nats_url: str) -> None:
    if flavour == "mariadb":
        primary, stranger = mariadb_factory(), mariadb_factory(extra_args=["--server-id=3"])
    else:
        primary, stranger = mysql_factory(), mysql_factory(server_id=3)  # not replicating from the primary
    primary.execute("CREATE DATABASE shop", "CREATE TABLE shop.a (id INT PRIMARY KEY, v INT)",
                    *(f"INSERT INTO shop.a VALUES ({i}, 0)" for i in range(20)))
    first = parser_factory(BINLAKE_SOURCE_URL=primary.dsn(), BINLAKE_START="earliest")
    wait_until(lambda: sum(m.env["op"] == "i" for m in read_stream_sync(nats_url)) == 20, 60, "the inserts")
    first.stop()
    before = len(read_stream_sync(nats_url))
    second = parser_factory(wait_ready=False, log_name="parser-2.log", BINLAKE_SOURCE_URL=stranger.dsn())
    assert second.wait(60) == 1, second.output[-3000:]
    assert "SourceSwitched" in second.output and "lacks transactions binlake already published" in second.output
    assert len(read_stream_sync(nats_url)) == before  # nothing published from the wrong server

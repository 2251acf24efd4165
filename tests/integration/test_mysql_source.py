"""MySQL 9.7 as a source: what only MySQL writes into its binlog.

Compressed transactions (global and per session, a kill -9 inside one), tagged GTIDs and the
resume by GTID set, partial row images refused with the setting and position, MySQL-only column
shapes (VECTOR, generated invisible primary keys, invisible columns, functional indexes), the
caching_sha2_password login with and without TLS, and a 64 MiB row.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import nats
import pytest

from services.launcher.processes import ServiceProcess
from tests.integration.conftest import ParserFactory
from tests.integration.exactly_once import assert_exactly_once
from tests.integration.support import count_rows, read_stream_sync, row_changes, snapshot_cli, wait_until
from tests.integration.workload import Workload
from tests.servers import MYSQL_SOURCE, MySQL

pytestmark = MYSQL_SOURCE


def started(parser: ServiceProcess) -> bool:
    return '"pipeline.start"' in parser.output or not parser.running


def rows_of(nats_url: str, db: str, table: str | None = None) -> list[dict[str, Any]]:
    return [r for m in row_changes(read_stream_sync(nats_url), db) if table in (None, m.env["table"])
            for r in m.env["rows"]]


def start_lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if '"pipeline.start"' in line]


def test_mysql_only_shapes(source: MySQL, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    db = database
    mysql = source
    mysql.execute(
        f"CREATE TABLE `{db}`.vec (id INT PRIMARY KEY, v VECTOR(3), w VECTOR(1))",
        f"CREATE TABLE `{db}`.inv (id INT PRIMARY KEY, a INT, secret VARCHAR(10) INVISIBLE)",
        f"CREATE TABLE `{db}`.fx (id INT PRIMARY KEY, s VARCHAR(20), INDEX ((UPPER(s))))",
        "SET SESSION sql_generate_invisible_primary_key = ON",
        f"CREATE TABLE `{db}`.gipk (a INT, b VARCHAR(5))",
        "SET SESSION sql_generate_invisible_primary_key = OFF",
    )
    parser = parser_factory(BINLAKE_SOURCE_URL=mysql.dsn(), BINLAKE_START="current")
    conn = mysql.connect()
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO `{db}`.vec VALUES (1, STRING_TO_VECTOR('[1.5, -2, 3.25]'), NULL)")
        cur.execute(f"INSERT INTO `{db}`.inv (id, a, secret) VALUES (1, 2, 'hidden')")
        cur.execute(f"INSERT INTO `{db}`.fx VALUES (1, 'abc')")
        cur.execute(f"INSERT INTO `{db}`.gipk VALUES (7, 'x'), (8, 'y')")
        cur.execute(f"UPDATE `{db}`.gipk SET b = 'z' WHERE a = 8")
    conn.close()
    msgs = wait_until(lambda: (m := row_changes(read_stream_sync(nats_url), db)) and len(m) >= 5 and m, 30,
                      "the inserts")
    assert parser.running, parser.output
    by_table = {m.env["table"]: m.env for m in msgs if m.env["op"] == "i"}
    assert by_table["vec"]["rows"] == [{"after": {"id": 1, "v": [1.5, -2.0, 3.25], "w": None}}]
    vec = {c["name"]: c for c in by_table["vec"]["schema"]["columns"]}["v"]
    assert vec["type"] == "vector" and vec["dimensions"] == 3
    assert by_table["inv"]["rows"] == [{"after": {"id": 1, "a": 2, "secret": "hidden"}}]
    assert by_table["fx"]["rows"] == [{"after": {"id": 1, "s": "abc"}}]  # no hidden index column
    assert by_table["gipk"]["pk"] == ["my_row_id"]
    assert [r["after"] for r in by_table["gipk"]["rows"]] == [{"my_row_id": 1, "a": 7, "b": "x"},
                                                             {"my_row_id": 2, "a": 8, "b": "y"}]
    # A snapshot reads the same values and the same schema (invisible columns are selected by name).
    done = snapshot_cli(nats_url, *(f"{db}.{t}" for t in ("vec", "inv", "fx", "gipk")))
    assert done.returncode == 0, done.stderr + parser.output[-3000:]
    snapped = {m.env["table"]: m.env for m in read_stream_sync(nats_url) if m.env.get("db") == db
               and m.env["op"] == "r"}
    for table in ("vec", "inv", "fx"):
        assert snapped[table]["rows"] == by_table[table]["rows"], table
        assert snapped[table]["schema"] == by_table[table]["schema"], table
    assert snapped["gipk"]["pk"] == ["my_row_id"]
    assert sorted(r["after"]["b"] for r in snapped["gipk"]["rows"]) == ["x", "z"]


@pytest.mark.timeout(300)
def test_compressed_and_tagged_transactions_survive_kill_9_with_the_gtid_set_tracked(
        source: MySQL, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    """Half the transactions compressed in their session, a third tagged; the parser killed mid-stream
    restarts where it stopped with the executed GTID set (tags included) in its resume point, and the
    stream holds every change once, in order."""
    workload = Workload(source, database, target=15_000, seed=5, compressed=0.5, tagged=True)
    workload.create_tables()
    parser = parser_factory(BINLAKE_INSTANCE="mysql-crash")
    thread = threading.Thread(target=workload.run, daemon=True)
    thread.start()
    rnd = random.Random(3)
    kills, outputs = 0, []
    while not workload.done.is_set() or kills < 4:
        wait_until(partial(started, parser), 60, "the parser to start")  # each kill lands mid-stream
        time.sleep(rnd.uniform(0.3, 1.2))
        parser.kill()
        outputs.append(parser.output)
        kills += 1
        parser = parser_factory(wait_ready=False, log_name=f"parser{kills}.log", BINLAKE_INSTANCE="mysql-crash")
    thread.join()
    assert workload.error is None, workload.error
    wait_until(lambda: count_rows(read_stream_sync(nats_url), database) >= workload.changes or not parser.running,
               120, f"{workload.changes} row changes in BINLAKE_RAW")
    assert parser.running, parser.output[-3000:]
    msgs = read_stream_sync(nats_url)
    assert_exactly_once(msgs, workload)
    uuid = source.query("SELECT @@server_uuid")[0][0]
    resumed = [line["resume_gtid"] for out in [*outputs[1:], parser.output] for line in start_lines(out)]
    assert resumed and all(g and uuid in g for g in resumed), resumed  # every restart knew its GTID set
    assert any(":etl:" in g for g in resumed), resumed
    tagged = {m.env["txn"]["id"] for m in row_changes(msgs, database) if ":etl:" in m.env["txn"]["id"]}
    assert tagged, "no tagged transaction reached the stream"
    executed = source.query("SELECT @@gtid_executed")[0][0].replace("\n", "")
    assert ":etl:" in executed


async def _raw_count(nats_url: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        return int((await nc.jetstream().stream_info("BINLAKE_RAW")).state.messages)
    finally:
        await nc.close()


async def _kill_at(parser: ServiceProcess, nats_url: str, messages: int, timeout: float = 60) -> None:
    """SIGKILL the parser as soon as BINLAKE_RAW holds `messages`: polled with one cheap stream info
    per round trip, so that a loaded machine still kills it inside a transaction."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while (await js.stream_info("BINLAKE_RAW")).state.messages < messages:
            assert time.monotonic() < deadline and parser.running, "the parser published too little"
        parser.kill()
    finally:
        await nc.close()


@pytest.mark.timeout(300)
def test_a_kill_inside_one_large_compressed_transaction(source: MySQL, database: str, parser_factory: ParserFactory,
                                                        nats_url: str) -> None:
    """Global compression on; one transaction of 300 statements is published in many messages; the
    parser is killed while only part of them are in the stream and finishes it after its restart."""
    db = database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(200))",
                   f"CREATE TABLE `{db}`.u (id INT PRIMARY KEY, n INT)")
    parser = parser_factory(BINLAKE_INSTANCE="mysql-big", BINLAKE_PUBLISH_WINDOW="1")
    before = asyncio.run(_raw_count(nats_url))  # idle but for a heartbeat a second
    source.execute("SET GLOBAL binlog_transaction_compression = ON")
    try:
        conn = source.connect(autocommit=False)  # a new session: it takes the global setting
        with conn.cursor() as cur:
            cur.execute("SELECT @@session.binlog_transaction_compression")
            assert cur.fetchone()[0] == 1
            for s in range(300):
                rows = ", ".join(f"({s * 50 + i}, REPEAT('v', {i}))" for i in range(50))
                cur.execute(f"INSERT INTO `{db}`.t VALUES {rows}")
                cur.execute(f"INSERT INTO `{db}`.u VALUES ({s}, {s})")
            conn.commit()
        conn.close()
    finally:
        source.execute("SET GLOBAL binlog_transaction_compression = OFF")
    asyncio.run(_kill_at(parser, nats_url, before + 20))
    partial = row_changes(read_stream_sync(nats_url), db)
    assert partial and not partial[-1].env["txn"]["last"], "the kill did not land inside the transaction"
    parser = parser_factory(wait_ready=False, log_name="parser-2.log", BINLAKE_INSTANCE="mysql-big")
    wait_until(lambda: count_rows(read_stream_sync(nats_url), db) >= 300 * 51 or not parser.running, 120,
               "the whole transaction")
    msgs = row_changes(read_stream_sync(nats_url), db)
    assert count_rows(msgs, db) == 300 * 51
    assert [m.env["txn"]["i"] for m in msgs] == list(range(len(msgs)))  # each batch once, in order
    assert len({m.env["txn"]["id"] for m in msgs}) == 1 and msgs[-1].env["txn"]["last"]
    skip = start_lines(parser.output)[0]["skip"]
    assert skip, parser.output[-2000:]  # it resumed at the transaction's start, skipping what was there
    ids = sorted(r["after"]["id"] for m in msgs if m.env["table"] == "t" for r in m.env["rows"])
    assert ids == list(range(300 * 50))


@pytest.mark.parametrize(("session", "statement", "setting"), [
    ("SET SESSION binlog_row_image = 'MINIMAL'", "UPDATE `{db}`.t SET a = 5 WHERE id = 1", "binlog_row_image=FULL"),
    ("SET SESSION binlog_row_image = 'NOBLOB'", "UPDATE `{db}`.t SET a = 6 WHERE id = 1", "binlog_row_image=FULL"),
    ("SET SESSION binlog_row_value_options = 'PARTIAL_JSON'",
     "UPDATE `{db}`.t SET j = JSON_SET(j, '$.k', 2) WHERE id = 1", "binlog_row_value_options=''"),
], ids=["minimal", "noblob", "partial-json"])
def test_a_partial_row_image_halts_with_the_setting_and_position(
        source: MySQL, database: str, parser_factory: ParserFactory, nats_url: str, session: str,
        statement: str, setting: str) -> None:
    """A session that logs partial rows stops capture before anything of it is published, naming the
    setting and the position: a partial image never becomes NULLs in the lake."""
    db = database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, a INT, b BLOB, j JSON)",
                   f"INSERT INTO `{db}`.t VALUES (1, 1, 'blob', '{{\"k\": 1, \"pad\": \"{'x' * 100}\"}}')")
    parser = parser_factory()
    before = len(row_changes(read_stream_sync(nats_url), db))
    conn = source.connect()
    with conn.cursor() as cur:
        cur.execute(session)
        cur.execute(statement.format(db=db))
    conn.close()
    assert parser.wait(60) != 0, parser.output[-2000:]
    assert "SourceMisconfigured" in parser.output and setting in parser.output, parser.output[-2000:]
    assert re.search(r"at binlog\.\d+:\d+", parser.output), parser.output[-2000:]
    assert len(row_changes(read_stream_sync(nats_url), db)) == before


def test_caching_sha2_password_login_with_and_without_tls(source: MySQL, database: str,
                                                          parser_factory: ParserFactory, nats_url: str) -> None:
    """MySQL 9's only built-in login, over plain TCP (RSA key exchange) and over TLS."""
    db = database
    source.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)",
                   "DROP USER IF EXISTS 'cdc'@'%'",
                   "CREATE USER 'cdc'@'%' IDENTIFIED WITH caching_sha2_password BY 's3cret-pw'",
                   "GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'cdc'@'%'")
    def captured(rows: int, parser: ServiceProcess) -> bool:
        return len(rows_of(nats_url, db)) >= rows or not parser.running

    for n, query in enumerate(["", "?ssl-mode=REQUIRED"]):
        source.execute("FLUSH PRIVILEGES")  # empties the fast-auth cache: the full exchange runs each time
        url = source.dsn(user="cdc", password="s3cret-pw") + "/" + query
        parser = parser_factory(wait_ready=False, log_name=f"parser{n}.log", BINLAKE_SOURCE_URL=url)
        wait_until(partial(started, parser), 60, "the parser to start")
        source.execute(f"INSERT INTO `{db}`.t VALUES ({n})")
        wait_until(partial(captured, n + 1, parser), 60, "the row")
        assert parser.running, parser.output[-3000:]
        assert "s3cret-pw" not in parser.output
        parser.stop()
    assert sorted(r["after"]["id"] for r in rows_of(nats_url, db)) == [0, 1]


@pytest.mark.timeout(300)
def test_a_64_mib_row_in_a_compressed_transaction(source: MySQL, database: str, parser_factory: ParserFactory,
                                                  nats_url: str) -> None:
    db = database
    source.execute(f"CREATE TABLE `{db}`.big (id INT PRIMARY KEY, b LONGBLOB)")
    parser_factory()
    blob = random.Random(1).randbytes(1024) * (64 * 1024)  # 64 MiB that zstd shrinks: one small payload event
    conn = source.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION binlog_transaction_compression = ON")
        cur.execute(f"INSERT INTO `{db}`.big VALUES (1, %s)", (blob,))
    conn.close()
    rows = wait_until(lambda: rows_of(nats_url, db), 120, "the 64 MiB row")
    assert rows[0]["after"]["b"] == blob


def test_tagged_gtids_across_binlog_files_from_the_earliest(mysql_factory: Callable[..., MySQL],
                                                           parser_factory: ParserFactory, nats_url: str) -> None:
    """Previous_gtids events holding tagged GTIDs (the library cannot read them) at every file start."""
    server = mysql_factory()
    server.execute("CREATE DATABASE shop", "CREATE TABLE shop.t (id INT PRIMARY KEY)")
    for i in range(6):
        server.execute(f"SET gtid_next = 'AUTOMATIC{':etl' if i % 2 else ''}'", f"INSERT INTO shop.t VALUES ({i})",
                       *(["FLUSH BINARY LOGS"] if i % 3 == 2 else []))
    parser = parser_factory(BINLAKE_SOURCE_URL=server.dsn(), BINLAKE_START="earliest")
    wait_until(lambda: len(rows_of(nats_url, "shop")) == 6 or not parser.running, 60, "the six rows")
    assert parser.running, parser.output[-3000:]
    parser.stop()
    executed = server.query("SELECT @@gtid_executed")[0][0].replace("\n", "")
    last = [m for m in read_stream_sync(nats_url) if m.env.get("resume")][-1].env["resume"]
    assert last["gtid"] == executed  # the tracked set is the server's, tags included
    server.execute("INSERT INTO shop.t VALUES (6)")
    again = parser_factory(wait_ready=False, log_name="parser-2.log", BINLAKE_SOURCE_URL=server.dsn())
    wait_until(lambda: len(rows_of(nats_url, "shop")) == 7 or not again.running, 60, "the seventh row")
    assert start_lines(again.output)[0]["resume_gtid"] == executed
    assert sorted(r["after"]["id"] for r in rows_of(nats_url, "shop")) == list(range(7))

"""Parser operations: restart inside a transaction, partition transform, metrics, cursor,
heartbeats, NATS and MariaDB going away, and DDL routing."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig

from services.launcher.processes import ServiceProcess
from services.parser.position import PositionReporter
from services.parser.transactions import Outgoing, Resume
from shared import envelope, keys
from shared.actor import Latest
from shared.lease import Lease
from shared.metrics import Registry
from shared.subjects import DDL_TABLE, HEARTBEAT_TABLE, INTERNAL_TOKEN, Names, partition
from tests.integration.conftest import ParserFactory
from tests.integration.exactly_once import assert_exactly_once, assert_source_equals_stream
from tests.integration.support import StoredMsg, count_rows, http_get, parse_metrics, wait_until
from tests.integration.workload import TABLES, Workload
from tests.servers import MariaDB, NatsServer, free_port

SOURCE = "main"
PARTITIONS = 16
NAMES = Names()
RAW = NAMES.raw_stream


# ----------------------------------------------------------------------------- helpers


def log_events(proc: ServiceProcess, event: str) -> list[dict[str, Any]]:
    """The parser's structlog JSON lines whose `event` is `event`, in order."""
    out = []
    for line in proc.output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == event:
            out.append(rec)
    return out


def internal_subject(kind: str) -> str:
    """Stored subject of binlake's own messages (`$binlake.heartbeat`, `$binlake.ddl`)."""
    return f"{NAMES.prefix}.raw.{SOURCE}.{partition(PARTITIONS, SOURCE, INTERNAL_TOKEN, kind)}.{INTERNAL_TOKEN}.{kind}"


async def _read_all(nats_url: str, subject: str = ">", timeout: float = 90) -> list[StoredMsg]:
    """Every message of BINLAKE_RAW matching `subject` up to its newest one when called, in order.

    Unlike `support.read_stream`, a slow fetch on a loaded machine neither escapes as a plain
    TimeoutError nor ends the read early with a partial list.
    """
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            if subject == ">":
                info = await js.stream_info(RAW)
                if info.state.messages == 0:
                    return []
                last = info.state.last_seq
            else:
                last = int((await js.get_last_msg(RAW, subject)).seq or 0)
        except nats.js.errors.NotFoundError:
            return []
        sub = await js.pull_subscribe(subject, stream=RAW, config=ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
            filter_subject=subject if subject != ">" else None, inactive_threshold=60))
        out: list[StoredMsg] = []
        deadline = time.monotonic() + timeout
        try:
            while not out or out[-1].seq < last:
                if time.monotonic() > deadline:
                    raise AssertionError(f"read only {len(out)} messages of {RAW} up to seq {last} in {timeout}s")
                try:
                    batch = await sub.fetch(1000, timeout=5)
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                out += [StoredMsg(m.metadata.sequence.stream, m.subject, dict(m.headers or {}),
                                  msgpack.unpackb(m.data, raw=False, strict_map_key=False)) for m in batch]
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()


def read_all(nats_url: str, subject: str = ">") -> list[StoredMsg]:
    return asyncio.run(_read_all(nats_url, subject))


async def _stored_count(nats_url: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        try:
            return (await nc.jetstream().stream_info(RAW)).state.messages
        except nats.js.errors.NotFoundError:
            return 0
    finally:
        await nc.close()


def start_parser(parser_factory: ParserFactory, nats_url: str, **env: str) -> ServiceProcess:
    """`parser_factory(**env)`, then wait for the stream to hold a message (a check that survives load)."""
    proc = parser_factory(wait_ready=False, **env)
    wait_until(lambda: asyncio.run(_stored_count(nats_url)) > 0 or not proc.running, 60, "the parser's first message")
    assert proc.running, proc.output
    return proc


async def _last_msg(nats_url: str, subject: str) -> tuple[str, dict[str, Any]] | None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            msg = await js.get_last_msg(RAW, subject)
        except nats.js.errors.NotFoundError:
            return None
        return str(msg.subject), dict(msgpack.unpackb(msg.data, raw=False, strict_map_key=False))
    finally:
        await nc.close()


def last_msg_sync(nats_url: str, subject: str = f"{NAMES.prefix}.raw.>") -> tuple[str, dict[str, Any]] | None:
    return asyncio.run(_last_msg(nats_url, subject))


async def _cursor(nats_url: str) -> list[dict[str, Any]]:
    """Every stored revision of the parser's cursor, oldest first (empty when none)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            kv = await js.key_value(NAMES.cursors_bucket)
            entries = await kv.history(keys.parser_cursor(SOURCE))
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NoKeysError, nats.js.errors.KeyNotFoundError):
            return []
        return [json.loads(e.value) for e in entries if e.value]
    finally:
        await nc.close()


def cursor_history(nats_url: str) -> list[dict[str, Any]]:
    return asyncio.run(_cursor(nats_url))


async def _cursor_revision(nats_url: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        try:
            kv = await nc.jetstream().key_value(NAMES.cursors_bucket)
            return int((await kv.get(keys.parser_cursor(SOURCE))).revision or 0)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
            return 0
    finally:
        await nc.close()


def cursor_revision(nats_url: str) -> int:
    """The revision of the parser's cursor key (0 when there is none)."""
    return asyncio.run(_cursor_revision(nats_url))


def master_status(server: MariaDB) -> tuple[str, int, str]:
    file, pos = server.query("SHOW MASTER STATUS")[0][:2]
    gtid = server.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    return str(file), int(pos), str(gtid)


def assert_no_duplicates(msgs: list[StoredMsg]) -> None:
    ids = Counter(m.headers["Nats-Msg-Id"] for m in msgs)
    assert [i for i, n in ids.items() if n > 1] == [], "duplicate message ids"
    batches = Counter((m.env["txn"]["id"], m.env["txn"]["i"]) for m in msgs if m.env["op"] != "hb")
    assert [b for b, n in batches.items() if n > 1] == [], "a transaction batch was published twice"


def assert_transactions_complete(msgs: list[StoredMsg]) -> None:
    """Every transaction in the stream has batches 0..n-1, in order, and only its final one is `last`."""
    txns: dict[str, list[dict[str, Any]]] = {}
    for m in msgs:
        if m.env["op"] != "hb":
            txns.setdefault(m.env["txn"]["id"], []).append(m.env["txn"])
    for tid, parts in txns.items():
        assert [p["i"] for p in parts] == list(range(len(parts))), f"transaction {tid}: batches out of sequence"
        assert [p["last"] for p in parts] == [False] * (len(parts) - 1) + [True], f"transaction {tid}: last flags"


# ----------------------------------------------------------------------------- 1. restart inside a transaction

BIG_TXN = 3000


async def _kill_once_started(nats_url: str, subject: str, before: int, proc: ServiceProcess, timeout: float) -> int:
    """Poll the stored count of `subject` every ~5 ms; SIGKILL `proc` as soon as it exceeds `before`."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = await js.stream_info(RAW, subjects_filter=subject)
            stored = (info.state.subjects or {}).get(subject, 0)
            if stored > before:
                proc.kill()
                return stored
            await asyncio.sleep(0.005)
        raise AssertionError(f"no message on {subject} within {timeout}s")
    finally:
        await nc.close()


async def _last_seq(nats_url: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        return (await nc.jetstream().stream_info(RAW)).state.last_seq
    finally:
        await nc.close()


def wait_stream_quiet(nats_url: str, quiet_s: float = 0.5, timeout: float = 30) -> None:
    """Wait until BINLAKE_RAW gained no message for `quiet_s`."""
    deadline = time.monotonic() + timeout
    seq = asyncio.run(_last_seq(nats_url))
    while True:
        time.sleep(quiet_s)
        now = asyncio.run(_last_seq(nats_url))
        if now == seq:
            return
        assert time.monotonic() < deadline, "BINLAKE_RAW kept growing"
        seq = now


def _big_transaction(server: MariaDB, db: str, table: str) -> None:
    conn = server.connect(autocommit=False)
    try:
        with conn.cursor() as cur:
            for i in range(BIG_TXN):
                cur.execute(f"INSERT INTO `{db}`.`{table}` VALUES ({i}, 'row {i}')")
        conn.commit()
    finally:
        conn.close()


@pytest.mark.timeout(300)
def test_restart_inside_a_transaction_skips_what_is_stored(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    # One publish in flight at a time: the 3000 batches of the transaction take long enough to
    # be stored for the kill to land inside the transaction even on a loaded machine.
    env = {"BINLAKE_INSTANCE": "skip-test", "BINLAKE_PUBLISH_WINDOW": "1"}
    parser = start_parser(parser_factory, nats_url, **env)
    skipped_at: tuple[dict[str, Any], ServiceProcess] | None = None
    for attempt in range(5):
        table = f"big{attempt}"
        subject = NAMES.raw_stored(SOURCE, database, table, PARTITIONS)
        mariadb.execute(f"CREATE TABLE `{database}`.`{table}` (id INT PRIMARY KEY, v VARCHAR(20))")
        wait_until(functools.partial(last_msg_sync, nats_url, subject), 30, f"the CREATE TABLE on {subject}")
        _big_transaction(mariadb, database, table)
        asyncio.run(_kill_once_started(nats_url, subject, 1, parser, 60))
        assert not parser.running
        wait_stream_quiet(nats_url)  # publishes still in the socket buffers land now
        tail = last_msg_sync(nats_url)
        assert tail is not None
        stored = [m for m in read_all(nats_url, subject=subject) if m.env["op"] == "i"]
        parser = start_parser(parser_factory, nats_url, log_name=f"parser{attempt + 1}.log", **env)
        def all_rows(s: str = subject) -> bool:
            return count_rows(read_all(nats_url, subject=s), database) >= BIG_TXN

        wait_until(all_rows, 120, f"all {BIG_TXN} rows of {table}")
        tail_subject, tail_env = tail
        if tail_env["op"] == "i" and not tail_env["txn"]["last"]:
            assert tail_subject == subject
            assert 0 < len(stored) < BIG_TXN
            skipped_at = (tail_env, parser)
            break
        # Too late: the whole transaction was stored before the kill; try a new one.
        assert len(stored) == BIG_TXN
    assert skipped_at is not None, "the kill never landed inside the transaction in 5 attempts"
    tail_env, restarted = skipped_at

    msgs = read_all(nats_url)
    assert_no_duplicates(msgs)
    assert_transactions_complete(msgs)
    big = [m for m in msgs if m.env.get("table") == table and m.env["op"] == "i"]
    ids = Counter(r["after"]["id"] for m in big for r in m.env["rows"])
    assert sorted(ids) == list(range(BIG_TXN)) and set(ids.values()) == {1}, "every row exactly once"
    assert [m.env["txn"]["i"] for m in big] == list(range(BIG_TXN))
    assert len({m.env["txn"]["id"] for m in big}) == 1
    assert big[-1].env["txn"]["last"] and not any(m.env["txn"]["last"] for m in big[:-1])

    starts = wait_until(lambda: log_events(restarted, "pipeline.start"), 30, "the restarted pipeline.start line")
    assert starts[0]["skip"] is not None, starts[0]
    assert (starts[0]["resume_file"], starts[0]["resume_offset"], starts[0]["resume_gtid"]) == (
        tail_env["resume"]["file"], tail_env["resume"]["offset"], tail_env["resume"]["gtid"])
    assert str(tail_env["txn"]["id"]) in str(starts[0]["skip"]) and str(tail_env["txn"]["i"]) in str(starts[0]["skip"])
    assert restarted.running


# ----------------------------------------------------------------------------- 2. partition transform

def test_stored_subjects_match_our_partition_function(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    other = f"dé-1-{uuid.uuid4().hex[:6]}"
    tables = [(database, "plain"), (database, "a.b c"), (database, "with space"), (database, "tä€ble"),
              (database, "日本"), (database, "$binlake"), (other, "a.b c"), (other, "x*y>z"), (other, "per%cent")]
    start_parser(parser_factory, nats_url)
    try:
        mariadb.execute(f"CREATE DATABASE `{other}` CHARACTER SET utf8mb4")
        for db, table in tables:
            t = f"`{db}`.`{table}`"
            mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(10))",
                            f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')",
                            f"UPDATE {t} SET v = 'c' WHERE id = 1",
                            f"DELETE FROM {t} WHERE id = 2")
        expected: set[tuple[str, str | None, str]] = {(db, table, op) for db, table in tables
                                                       for op in ("ddl", "i", "u", "d")}
        expected.add((other, None, "ddl"))  # CREATE DATABASE names no table

        def ours() -> list[StoredMsg]:
            return [m for m in read_all(nats_url) if m.env.get("db") in (database, other)]

        msgs = wait_until(lambda: (m := ours()) and len(m) >= len(expected) and m, 60, "every change")
        assert {(m.env["db"], m.env["table"], m.env["op"]) for m in msgs} == expected
        assert len(msgs) == len(expected)
        for m in msgs:
            db, table = m.env["db"], m.env["table"]
            if table is None:
                assert m.subject == internal_subject(DDL_TABLE)
                continue
            assert m.subject == NAMES.raw_stored(SOURCE, db, table, PARTITIONS), (db, table)
            src, part, sdb, stable = NAMES.parse_raw_stored(m.subject)
            assert (src, sdb, stable) == (SOURCE, db, table)
            assert part == partition(PARTITIONS, *m.subject.split(".")[2:3], *m.subject.split(".")[4:])
            assert m.env["source"] == SOURCE
        assert len({m.subject.split(".")[3] for m in msgs}) > 1, "the transform spreads tables over partitions"
    finally:
        mariadb.execute(f"DROP DATABASE IF EXISTS `{other}`")


# ----------------------------------------------------------------------------- 3. /metrics and /healthz

def test_metrics_and_healthz(mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    port = free_port()
    start_parser(parser_factory, nats_url, BINLAKE_METRICS_PORT=str(port), BINLAKE_HEARTBEAT_S="30")
    base = f"http://127.0.0.1:{port}"
    status, body = http_get(f"{base}/metrics")
    assert status == 200, body
    assert "\nbinlake_parser_leader 1\n" in body
    assert http_get(f"{base}/healthz") == (200, "ok\n")
    assert http_get(f"{base}/nothing")[0] == 404

    mariadb.execute(f"CREATE TABLE `{database}`.m (id INT PRIMARY KEY)",
                    *(f"INSERT INTO `{database}`.m VALUES ({i})" for i in range(20)))
    wait_until(lambda: count_rows(read_all(nats_url), database) >= 20, 30, "the 20 inserts")

    def scraped() -> dict[str, float] | None:
        status, body = http_get(f"{base}/metrics")
        assert status == 200, body
        values = parse_metrics(body)
        return values if "binlake_parser_lag_seconds" in values else None

    values = wait_until(scraped, 30, "parser_lag_seconds")
    _, body = http_get(f"{base}/metrics")
    assert "# TYPE binlake_parser_messages_total counter" in body
    assert "\nbinlake_parser_leader 1\n" in body
    assert 0 <= values["binlake_parser_lag_seconds"] < 60
    assert values["binlake_parser_pipeline_starts_total"] == 1
    assert values["binlake_parser_messages_total"] >= 1
    # 20 transactions of one table: its TableMap is compiled once, then found in the cache.
    assert values["binlake_parser_table_schemas_compiled_total"] == 1
    assert http_get(f"{base}/healthz") == (200, "ok\n")


def test_messages_total_counts_every_acked_message(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    port = free_port()
    start_parser(parser_factory, nats_url, BINLAKE_METRICS_PORT=str(port), BINLAKE_HEARTBEAT_S="30")
    t = f"`{database}`.m"
    conn = mariadb.connect(autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)")
            for i in range(500):
                cur.execute(f"INSERT INTO {t} VALUES ({i})")
            conn.commit()
    finally:
        conn.close()
    wait_until(lambda: count_rows(read_all(nats_url), database) >= 500, 30, "the 500 inserts")
    stored = len(read_all(nats_url))

    def total() -> float:
        return parse_metrics(http_get(f"http://127.0.0.1:{port}/metrics")[1]).get("binlake_parser_messages_total", 0)

    time.sleep(1.5)
    assert total() == stored


# ----------------------------------------------------------------------------- 4. cursor in meta's bucket

def _last_boundary(nats_url: str) -> dict[str, Any]:
    msgs = read_all(nats_url)
    resume: dict[str, Any] = [m for m in msgs if m.env["txn"]["last"]][-1].env["resume"]
    return resume


def _cursor_matches_stream(nats_url: str) -> dict[str, Any] | None:
    history = cursor_history(nats_url)
    if not history:
        return None
    cur = history[-1]
    resume = _last_boundary(nats_url)
    same = (cur["file"], cur["offset"], cur["gtid"]) == (resume["file"], resume["offset"], resume["gtid"])
    return cur if same else None


def _assert_monotonic(history: list[dict[str, Any]]) -> None:
    scns = [h["scn"] for h in history]
    assert scns == sorted(scns), f"the cursor moved backwards: {scns}"


def test_cursor_bucket_mirrors_the_last_published_transaction(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    env = {"BINLAKE_INSTANCE": "cursor-test", "BINLAKE_HEARTBEAT_S": "30"}
    parser = start_parser(parser_factory, nats_url, **env)
    t = f"`{database}`.c"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)",
                    *(f"INSERT INTO {t} VALUES ({i}, {i})" for i in range(50)), f"UPDATE {t} SET v = v + 1")
    wait_until(lambda: count_rows(read_all(nats_url), database) >= 100, 30, "the changes")
    cur = wait_until(lambda: _cursor_matches_stream(nats_url), 30, "the cursor to reach the last transaction")
    assert set(cur) >= {"file", "offset", "gtid", "scn", "ts", "lag_ms"}
    assert cur["source"] == SOURCE
    assert cur["scn"] == envelope.scn(cur["file"], cur["offset"])
    assert (cur["file"], cur["offset"], cur["gtid"]) == master_status(mariadb)
    assert 0 <= cur["lag_ms"] < 60_000 and cur["ts"] > 0
    before = cur["scn"]

    parser.kill()
    parser = start_parser(parser_factory, nats_url, log_name="parser2.log", **env)
    mariadb.execute(*(f"INSERT INTO {t} VALUES ({i}, {i})" for i in range(50, 60)))
    wait_until(lambda: count_rows(read_all(nats_url), database) >= 110, 30, "the new changes")
    cur = wait_until(lambda: _cursor_matches_stream(nats_url), 30, "the cursor after the restart")
    assert cur["scn"] > before
    assert (cur["file"], cur["offset"], cur["gtid"]) == master_status(mariadb)

    # A restart without new changes keeps the cursor where it is.
    parser.stop()
    parser = start_parser(parser_factory, nats_url, log_name="parser3.log", **env)
    time.sleep(3)
    history = cursor_history(nats_url)
    assert history[-1]["scn"] == cur["scn"]
    _assert_monotonic(history)
    assert parser.running


async def _purge_raw(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().purge_stream(Names().raw_stream)
    finally:
        await nc.close()


def test_an_emptied_raw_stream_resumes_from_the_saved_position(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    """RAW purged (retention, an operator) while the parser is down: what was written meanwhile is not lost."""
    env = {"BINLAKE_INSTANCE": "purge-test", "BINLAKE_HEARTBEAT_S": "30"}
    parser = start_parser(parser_factory, nats_url, **env)
    t = f"`{database}`.p"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT)",
                    *(f"INSERT INTO {t} VALUES ({i}, {i})" for i in range(20)))
    wait_until(lambda: count_rows(read_all(nats_url), database) >= 20, 30, "the first changes")
    wait_until(lambda: _cursor_matches_stream(nats_url), 30, "the cursor to reach the last transaction")
    parser.stop()
    asyncio.run(_purge_raw(nats_url))
    mariadb.execute(*(f"INSERT INTO {t} VALUES ({i}, {i})" for i in range(20, 35)), f"DELETE FROM {t} WHERE id < 5")

    parser = start_parser(parser_factory, nats_url, log_name="parser2.log", **env)  # BINLAKE_START=current
    wait_until(lambda: count_rows(read_all(nats_url), database) >= 20, 30, "the changes made while it was down")
    msgs = [m for m in read_all(nats_url) if m.env.get("db") == database]
    assert sorted(r["after"]["id"] for m in msgs if m.env["op"] == "i" for r in m.env["rows"]) == list(range(20, 35))
    assert sorted(r["before"]["id"] for m in msgs if m.env["op"] == "d" for r in m.env["rows"]) == list(range(5))
    start = log_events(parser, "pipeline.start")[0]
    assert start["origin"] == "saved position" and start["fresh"] is True


# ----------------------------------------------------------------------------- 5. heartbeats

def test_idle_source_heartbeats_at_the_last_boundary(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    start_parser(parser_factory, nats_url, BINLAKE_HEARTBEAT_S="1")
    mariadb.execute(f"CREATE TABLE `{database}`.h (id INT PRIMARY KEY)", f"INSERT INTO `{database}`.h VALUES (1)")
    wait_until(lambda: count_rows(read_all(nats_url), database) >= 1, 30, "the insert")
    position = master_status(mariadb)

    def heartbeats_after_insert() -> list[StoredMsg] | None:
        msgs = read_all(nats_url)
        at = max(n for n, m in enumerate(msgs) if m.env.get("db") == database)
        hbs = [m for m in msgs[at + 1:] if m.env["op"] == "hb"]
        return hbs if len(hbs) >= 3 else None

    hbs = wait_until(heartbeats_after_insert, 30, "three heartbeats after the insert")
    insert = [m for m in read_all(nats_url) if m.env.get("db") == database and m.env["op"] == "i"][-1]
    assert insert.env["txn"]["last"]
    part = partition(PARTITIONS, SOURCE, "$binlake", "heartbeat")
    for hb in hbs:
        assert hb.subject == internal_subject(HEARTBEAT_TABLE) == f"binlake.raw.main.{part}.$binlake.heartbeat"
        env = hb.env
        assert env["op"] == "hb" and env["db"] is None and env["table"] is None
        assert env["txn"]["last"] is True
        assert env["resume"] == insert.env["resume"]
        assert (env["resume"]["file"], env["resume"]["offset"], env["resume"]["gtid"]) == position
        assert env["scn"] == envelope.scn(env["resume"]["file"], env["resume"]["offset"])
        assert hb.headers["Binlake-Op"] == "hb"
    stamps = [hb.env["ts"] for hb in hbs]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


# ----------------------------------------------------------------------------- 6. NATS goes away

def _start_workload(workload: Workload) -> threading.Thread:
    workload.create_tables()
    thread = threading.Thread(target=workload.run, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["stop", "kill"])
def test_nats_restart_mid_stream(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_server: NatsServer,
        nats_url: str, how: str) -> None:
    """SIGTERM or SIGKILL of nats-server while the parser publishes: what JetStream acked is there
    after the restart (docs/operations.md#durability: a process kill loses nothing acked, whatever
    the sync interval), and the parser goes on exactly once."""
    parser = start_parser(parser_factory, nats_url, BINLAKE_INSTANCE="nats-restart")
    workload = Workload(mariadb, database, target=8000, seed=5)
    thread = _start_workload(workload)
    wait_until(lambda: count_rows(read_all(nats_url), database) > 1000, 60, "the first changes")
    if how == "kill":
        nats_server.kill()
    else:
        nats_server.stop()
    time.sleep(2)
    nats_server.start()
    thread.join(120)
    assert workload.error is None, workload.error
    wait_until(lambda: count_rows(read_all(nats_url), database) >= workload.changes or not parser.running,
               120, f"{workload.changes} row changes in BINLAKE_RAW")
    assert parser.running, f"the parser exited with {parser.returncode}:\n{parser.output[-3000:]}"
    msgs = read_all(nats_url)
    assert_exactly_once(msgs, workload)
    assert_transactions_complete(msgs)
    # After the outage it still (or again) holds its lease, and SIGTERM still stops it.
    wait_until(lambda: lease_holder(nats_url) == "nats-restart", 15, "the parser to hold its lease")
    assert parser.stop(timeout=15) == 0, parser.output[-3000:]


@pytest.mark.timeout(1200)  # above the sum of its own waits: a loaded CI machine took 300 s
def test_sigterm_during_a_publish_burst_stops_the_parser(mariadb: MariaDB, database: str, parser_factory: ParserFactory,
                                                         nats_url: str) -> None:
    t = f"`{database}`.burst"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)")
    batch = 5000
    # Where SIGTERM's cancellation lands is a race, so it is tried several times, each while the
    # parser publishes a backlog of single-row transactions. Lease renewals and cursor writes are
    # kept out of the way (one cursor write per run, done before the SIGTERM), so the cancellation
    # meets the pipeline; test_cancel_arriving_with_a_kv_reply_ends_the_actor covers those two.
    env = {"BINLAKE_INSTANCE": "burst", "BINLAKE_LEASE_TTL_S": "60", "BINLAKE_REPORT_INTERVAL_S": "60"}
    for attempt in range(8):
        reported = cursor_revision(nats_url)
        parser = start_parser(parser_factory, nats_url, log_name=f"burst{attempt}.log", **env)
        before = asyncio.run(_stored_count(nats_url))
        mariadb.execute(f"BEGIN NOT ATOMIC DECLARE i INT DEFAULT {attempt * batch}; "
                        f"WHILE i < {(attempt + 1) * batch} DO INSERT INTO {t} VALUES (i); SET i = i + 1; END WHILE; "
                        "END")
        def burst(n: int = before) -> bool:
            return asyncio.run(_stored_count(nats_url)) > n + 500

        def written(n: int = reported) -> bool:
            return cursor_revision(nats_url) > n

        wait_until(burst, 60, "the burst to be published")
        wait_until(written, 30, "this run's cursor write")
        code = parser.stop(timeout=20)
        assert code == 0, f"attempt {attempt + 1}: SIGTERM did not stop the parser (exit {code}):\n" \
            f"{parser.output[-3000:]}"
    final = start_parser(parser_factory, nats_url, log_name="final.log", **env)
    total = 8 * batch
    # One message per single-row transaction: the cheap count first (reading 40,000 messages on
    # every poll took the CPU the parser needed to publish them), then the rows themselves.
    stored: list[int] = []

    def published() -> bool:
        stored.append(asyncio.run(_stored_count(nats_url)))
        return stored[-1] >= total or not final.running

    try:
        wait_until(published, 300, f"{total} messages", interval=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {stored[-1]} stored; the parser said:\n{final.output[-4000:]}") from None
    assert final.running, f"the parser exited with {final.returncode}:\n{final.output[-4000:]}"
    def all_rows() -> list[StoredMsg] | None:
        msgs = read_all(nats_url)
        return msgs if count_rows(msgs, database) >= total else None

    msgs: list[StoredMsg] = wait_until(all_rows, 120, f"all {total} rows", interval=2)
    assert_no_duplicates(msgs)
    ids = [r["after"]["id"] for m in msgs if m.env.get("table") == "burst" and m.env["op"] == "i"
           for r in m.env["rows"]]
    assert ids == list(range(total))


async def _cancel_with_the_reply(nats_url: str, actor: str) -> bool:
    """Cancel a running `actor` (lease keep / position reporter) the moment the reply to its KV
    write arrives, and report whether it then ends within 3 s."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket=f"ops_{actor}", ttl=30, history=1))
        if actor == "keep":
            lease = Lease(kv, "k", "me", ttl_s=0.3)  # renews every 0.1 s
            await lease.acquire()
            task = asyncio.create_task(lease.keep())
        else:
            progress: Latest[Outgoing] = Latest()
            reporter = PositionReporter(kv, SOURCE, progress, Registry(), interval_s=0.05)
            task = asyncio.create_task(reporter.run())

            async def feed() -> None:
                for n in range(1, 10_000):
                    progress.set(Outgoing("s", b"", f"m{n}", {}, "i", int(time.time() * 1000), 1,
                                          Resume("mysql-bin.000001", 1000 + n, None), True))
                    await asyncio.sleep(0.05)

            feeder = asyncio.create_task(feed())
        cancelled = asyncio.Event()

        def cancel(_: asyncio.Future[Any]) -> None:
            if not cancelled.is_set():
                cancelled.set()
                task.cancel()

        seen: set[int] = set()
        deadline = time.monotonic() + 10
        while not cancelled.is_set():
            assert time.monotonic() < deadline, f"no KV write of {actor} seen"
            for fut in list(nc._resp_map.values()):  # the reply futures of pending requests
                if id(fut) not in seen and not fut.done():
                    seen.add(id(fut))
                    fut.add_done_callback(cancel)
            await asyncio.sleep(0)
        done, _ = await asyncio.wait([task], timeout=3)
        if actor != "keep":
            feeder.cancel()
        if not done:
            task.cancel()  # a second cancel ends it (the first one was lost)
            await asyncio.wait([task], timeout=3)
        return bool(done)
    finally:
        await nc.close()


@pytest.mark.parametrize("actor", ["keep", "reporter"])
def test_cancel_arriving_with_a_kv_reply_ends_the_actor(nats_url, actor):
    assert asyncio.run(_cancel_with_the_reply(nats_url, actor)), f"{actor} ran on after its cancellation"


async def _set_stream_subjects(nats_url: str, stream: str, subjects: list[str]) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        config = (await js.stream_info(stream)).config
        config.subjects = subjects
        await js.update_stream(config)
    finally:
        await nc.close()


def test_kv_write_without_responders_keeps_the_parser_running(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    parser = start_parser(parser_factory, nats_url, BINLAKE_HEARTBEAT_S="30")
    t = f"`{database}`.k"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)", f"INSERT INTO {t} VALUES (1)")
    wait_until(lambda: _cursor_matches_stream(nats_url), 30, "the first cursor write")
    # For a few seconds the cursor bucket's stream serves no subject, as when NATS restarted and
    # JetStream has not loaded the bucket yet: the reporter's next write gets no responders.
    stream, bucket_subjects = f"KV_{NAMES.cursors_bucket}", [f"$KV.{NAMES.cursors_bucket}.>"]
    asyncio.run(_set_stream_subjects(nats_url, stream, [f"$KV.{NAMES.cursors_bucket}_paused.>"]))
    try:
        mariadb.execute(f"INSERT INTO {t} VALUES (2)")
        wait_until(lambda: count_rows(read_all(nats_url), database) >= 2, 30, "the second insert")
        time.sleep(3)  # the reporter (every 1 s) tries to write the new position
    finally:
        asyncio.run(_set_stream_subjects(nats_url, stream, bucket_subjects))
    mariadb.execute(f"INSERT INTO {t} VALUES (3)")
    wait_until(lambda: count_rows(read_all(nats_url), database) >= 3 or not parser.running, 30, "the third insert")
    assert parser.running, f"the parser exited with {parser.returncode}:\n{parser.output[-3000:]}"
    wait_until(lambda: _cursor_matches_stream(nats_url), 30, "the cursor to catch up")


@pytest.mark.timeout(300)
def test_nats_outage_longer_than_a_request_timeout_keeps_the_parser_running(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_server: NatsServer, nats_url: str) -> None:
    # A lease TTL longer than the outage keeps the lease out of the picture (see the next test);
    # with a report every 3 s and changes acked right up to the outage, the reporter writes the
    # cursor within 3 s of NATS going away, and that write times out 5 s later.
    parser = start_parser(parser_factory, nats_url, BINLAKE_LEASE_TTL_S="60", BINLAKE_REPORT_INTERVAL_S="3")
    workload = Workload(mariadb, database, target=30_000, seed=8)
    thread = _start_workload(workload)
    wait_until(lambda: count_rows(read_all(nats_url), database) > 1000, 60, "the first changes")
    def publishing() -> bool:
        n = asyncio.run(_stored_count(nats_url))
        time.sleep(0.3)
        return asyncio.run(_stored_count(nats_url)) > n

    wait_until(publishing, 60, "the parser to be publishing")
    nats_server.stop()
    time.sleep(10)
    nats_server.start()
    thread.join(120)
    assert workload.error is None, workload.error
    wait_until(lambda: count_rows(read_all(nats_url), database) >= workload.changes or not parser.running,
               120, f"{workload.changes} row changes in BINLAKE_RAW")
    try:
        assert parser.running, f"the parser exited with {parser.returncode}:\n{parser.output[-3000:]}"
        assert_exactly_once(read_all(nats_url), workload)
        assert log_events(parser, "position.report_failed"), "the outage was meant to fail a cursor write"
        wait_until(lambda: _cursor_matches_stream(nats_url), 30, "the cursor to catch up after the outage")
    finally:
        parser.kill()


async def _lease_holder(nats_url: str) -> str | None:
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(NAMES.leases_bucket)
        try:
            entry = await kv.get(f"parser.{SOURCE}")
        except nats.js.errors.KeyNotFoundError:
            return None
        return entry.value.decode() if entry.value else None
    finally:
        await nc.close()


def lease_holder(nats_url: str) -> str | None:
    return asyncio.run(_lease_holder(nats_url))


@pytest.mark.timeout(300)
def test_lease_lost_during_a_nats_outage_is_taken_again(mariadb: MariaDB, database: str, parser_factory: ParserFactory,
                                                        nats_server: NatsServer, nats_url: str) -> None:
    backlog = 10_000
    # One publish in flight: with a backlog the pipeline always waits for its window slot (the
    # oldest ack), and stays there while NATS is away.
    parser = start_parser(parser_factory, nats_url, BINLAKE_INSTANCE="outage", BINLAKE_PUBLISH_WINDOW="1")
    assert lease_holder(nats_url) == "outage"
    t = f"`{database}`.burst"
    mariadb.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY)",
                    f"BEGIN NOT ATOMIC DECLARE i INT DEFAULT 0; WHILE i < {backlog} DO "
                    f"INSERT INTO {t} VALUES (i); SET i = i + 1; END WHILE; END")
    wait_until(lambda: asyncio.run(_stored_count(nats_url)) > 1000, 60, "the parser to work on the backlog")
    nats_server.stop()
    # Longer than the 5 s timeout of a lease renewal: keep() raises LeaseLost while NATS is away.
    time.sleep(8)
    nats_server.start()
    wait_until(lambda: count_rows(read_all(nats_url), database) >= backlog or not parser.running, 240,
               f"all {backlog} rows in BINLAKE_RAW")
    assert parser.running, parser.output[-4000:]
    msgs = read_all(nats_url)
    assert_no_duplicates(msgs)
    ids = [r["after"]["id"] for m in msgs if m.env.get("table") == "burst" and m.env["op"] == "i"
           for r in m.env["rows"]]
    assert ids == list(range(backlog))
    assert log_events(parser, "lease.lost"), "the outage was meant to cost the lease"
    try:
        # The parser that publishes must hold the lease (else a standby would run beside it) ...
        wait_until(lambda: lease_holder(nats_url) == "outage", 15, "the parser to hold its lease again")
        # ... and it still stops cleanly.
        assert parser.stop(timeout=10) == 0, parser.output[-4000:]
    finally:
        parser.kill()


# ----------------------------------------------------------------------------- 7. MariaDB goes away

class TolerantWorkload(Workload):
    """A workload that may lose its server: counts what certainly committed and what was tried."""

    committed: int = 0

    def run(self) -> None:
        rnd = random.Random(self.seed)
        next_id = {"accounts": 1, "events": 1, "tags": 1}
        started = time.monotonic()
        try:
            conn = self.mariadb.connect(autocommit=False)
        except BaseException as exc:
            self.error = exc
            self.done.set()
            return
        try:
            with conn.cursor() as cur:
                while self.changes < self.target:
                    ahead = self.changes / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                    txn = 0
                    for _ in range(rnd.choice([1, 1, 2, 3, 40])):
                        n = self._statement(cur, rnd, rnd.choice(list(TABLES)), next_id)
                        self.changes += n
                        txn += n
                    conn.commit()
                    self.committed += txn
        except BaseException as exc:
            self.error = exc
        finally:
            try:
                conn.close()
            except Exception:
                pass
            self.done.set()


def test_mariadb_crash_mid_stream(
        mariadb_factory: Callable[..., MariaDB], parser_factory: ParserFactory, nats_url: str) -> None:
    server: MariaDB = mariadb_factory()
    server.execute("CREATE DATABASE a CHARACTER SET utf8mb4", "CREATE DATABASE b CHARACTER SET utf8mb4")
    parser = start_parser(parser_factory, nats_url, BINLAKE_SOURCE_URL=server.dsn())
    first = TolerantWorkload(server, "a", target=50_000, seed=9)
    thread = _start_workload(first)
    wait_until(lambda: count_rows(read_all(nats_url), "a") > 2000, 60, "the first changes")
    server.kill()
    thread.join(30)
    assert first.error is not None, "the workload should have lost its server"
    time.sleep(1)
    server.start()
    killed = first.committed, first.changes

    second = Workload(server, "b", target=3000, seed=10)
    _start_workload(second).join(120)
    assert second.error is None, second.error
    wait_until(lambda: count_rows(read_all(nats_url), "b") >= second.changes or not parser.running, 120,
               f"{second.changes} row changes of the second workload")
    assert parser.running, f"the parser exited with {parser.returncode}:\n{parser.output[-4000:]}"
    msgs = read_all(nats_url)
    assert_exactly_once(msgs, second)
    assert_no_duplicates(msgs)
    assert_transactions_complete(msgs)
    committed, tried = killed
    assert committed <= count_rows(msgs, "a") <= tried
    assert_source_equals_stream(msgs, first)
    assert len(log_events(parser, "pipeline.start")) >= 2, "the pipeline restarted after the crash"
    assert any(r["error"] == "SourceUnavailable" for r in log_events(parser, "actor.restart"))
    assert parser.running


# ----------------------------------------------------------------------------- 8. DDL routing

def test_ddl_without_a_table_and_multi_table_drop(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    extra = f"x_{uuid.uuid4().hex[:8]}"
    user = f"u{uuid.uuid4().hex[:8]}"
    start_parser(parser_factory, nats_url)
    try:
        mariadb.execute(f"CREATE DATABASE `{extra}`", f"CREATE USER '{user}'@'localhost'",
                        f"CREATE TABLE `{database}`.a (id INT PRIMARY KEY)",
                        f"CREATE TABLE `{database}`.b (id INT PRIMARY KEY)",
                        f"CREATE TABLE `{database}`.`c.d` (id INT PRIMARY KEY)",
                        f"INSERT INTO `{database}`.a VALUES (1)",
                        f"DROP TABLE `{database}`.a, `{database}`.b, `{database}`.`c.d`")
    finally:
        mariadb.execute(f"DROP DATABASE IF EXISTS `{extra}`", f"DROP USER IF EXISTS '{user}'@'localhost'")

    def ddl_msgs() -> list[StoredMsg] | None:
        msgs = [m for m in read_all(nats_url) if m.env["op"] == "ddl"]
        return msgs if any(f"DROP USER IF EXISTS '{user}'" in m.env["ddl"] for m in msgs) else None

    msgs = wait_until(ddl_msgs, 30, "the DDL")
    tableless = internal_subject(DDL_TABLE)
    assert tableless.endswith(".$binlake.ddl")

    def only(text: str) -> StoredMsg:
        found: list[StoredMsg] = [m for m in msgs if text in m.env["ddl"]]
        assert len(found) == 1, (text, found)
        return found[0]

    for text in (f"CREATE DATABASE `{extra}`", f"CREATE USER '{user}'", f"DROP DATABASE IF EXISTS `{extra}`",
                 f"DROP USER IF EXISTS '{user}'"):
        m = only(text)
        assert m.subject == tableless, (text, m.subject)
        assert m.env["table"] is None and m.env["txn"]["last"]

    drops = [m for m in msgs if m.env["ddl"].upper().startswith("DROP TABLE")]
    assert [(m.env["db"], m.env["table"]) for m in drops] == [(database, "a"), (database, "b"), (database, "c.d")]
    assert [m.subject for m in drops] == [NAMES.raw_stored(SOURCE, database, t, PARTITIONS) for t in ("a", "b", "c.d")]
    assert len({m.env["scn"] for m in drops}) == 1
    assert [m.env["txn"]["i"] for m in drops] == [0, 1, 2]
    assert [m.env["txn"]["last"] for m in drops] == [False, False, True]
    assert len({m.headers["Nats-Msg-Id"] for m in drops}) == 3
    creates = {m.env["table"]: m.subject for m in msgs if m.env["ddl"].startswith("CREATE TABLE")}
    assert creates == {t: NAMES.raw_stored(SOURCE, database, t, PARTITIONS) for t in ("a", "b", "c.d")}


@pytest.mark.timeout(120)
def test_lower_case_table_names_keeps_a_tables_ddl_with_its_rows(
        mariadb_factory: Callable[..., MariaDB], parser_factory: ParserFactory, nats_url: str) -> None:
    """lower_case_table_names=1 stores `Shop.Orders` as `shop.orders` and the rows' TableMaps say so: the
    table's DDL, however the SQL (or USE) spells it, is published with its rows, in order."""
    server: MariaDB = mariadb_factory(extra_args=["--lower-case-table-names=1"])
    assert server.query("SELECT @@lower_case_table_names") == [(1,)]
    start_parser(parser_factory, nats_url, BINLAKE_SOURCE_URL=server.dsn())
    server.execute("CREATE DATABASE Shop CHARACTER SET utf8mb4",
                   "CREATE TABLE Shop.Orders (id INT PRIMARY KEY)",
                   "INSERT INTO Shop.Orders VALUES (1)",
                   "ALTER TABLE Shop.ORDERS ADD COLUMN x INT",
                   "INSERT INTO Shop.Orders VALUES (2, 20)",
                   "USE Shop",
                   "ALTER TABLE Orders ADD COLUMN y INT",
                   "INSERT INTO oRDERS VALUES (3, 30, 300)",
                   "RENAME TABLE Orders TO Old_Orders",
                   "INSERT INTO Shop.OLD_ORDERS VALUES (4, 40, 400)")
    subject = NAMES.raw_stored(SOURCE, "shop", "orders", PARTITIONS)

    def changes() -> list[StoredMsg] | None:
        msgs = [m for m in read_all(nats_url) if m.env["op"] != "hb"]
        return msgs if sum(m.env["op"] == "i" for m in msgs) >= 4 else None

    msgs = wait_until(changes, 60, "the four inserts")
    assert all(m.env["db"] in ("shop", None) for m in msgs), [(m.env["db"], m.env["table"]) for m in msgs]
    orders = [m for m in msgs if m.env["table"] == "orders"]
    assert [(m.subject, m.env["db"], m.env["op"]) for m in orders] == [(subject, "shop", op) for op in
                                                                       ("ddl", "i", "ddl", "i", "ddl", "i", "ddl")]
    assert [m.env["ddl"] for m in orders if m.env["op"] == "ddl"] == [
        "CREATE TABLE Shop.Orders (id INT PRIMARY KEY)", "ALTER TABLE Shop.ORDERS ADD COLUMN x INT",
        "ALTER TABLE Orders ADD COLUMN y INT", "RENAME TABLE Orders TO Old_Orders"]
    assert [m.env["rows"][0]["after"] for m in orders if m.env["op"] == "i"] == [
        {"id": 1}, {"id": 2, "x": 20}, {"id": 3, "x": 30, "y": 300}]
    assert orders[-1].env["alter"]["renames"] == [["shop", "orders", "shop", "old_orders"]]
    old = [(m.subject, m.env["op"]) for m in msgs if m.env["table"] == "old_orders"]
    assert old == [(NAMES.raw_stored(SOURCE, "shop", "old_orders", PARTITIONS), op) for op in ("ddl", "i")]
    assert {m.env["table"] for m in msgs} == {"orders", "old_orders", None}


@pytest.mark.timeout(300)
def test_a_hung_source_turns_unhealthy_and_the_standby_takes_over(
        mariadb_factory: Callable[..., MariaDB], parser_factory: ParserFactory, nats_url: str) -> None:
    """The source SIGSTOPped: /healthz says 503 with the reason, the active parser gives its lease up;
    SIGCONT: the standby reads on, nothing lost or doubled."""
    server: MariaDB = mariadb_factory()
    server.execute("CREATE DATABASE h CHARACTER SET utf8mb4", "CREATE TABLE h.t (id INT PRIMARY KEY, v INT)")
    port = free_port()
    env = {"BINLAKE_SOURCE_URL": server.dsn(), "BINLAKE_HEARTBEAT_S": "1", "BINLAKE_SOURCE_STALL_S": "6"}
    active = start_parser(parser_factory, nats_url, BINLAKE_INSTANCE="active", BINLAKE_METRICS_PORT=str(port), **env)
    standby = parser_factory(wait_ready=False, log_name="standby.log", BINLAKE_INSTANCE="standby", **env)
    server.execute(*(f"INSERT INTO h.t VALUES ({i}, {i})" for i in range(10)))
    wait_until(lambda: count_rows(read_all(nats_url), "h") >= 10, 30, "the first changes")
    assert http_get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")

    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        def unhealthy() -> str | None:
            status, body = http_get(f"http://127.0.0.1:{port}/healthz")
            return body if status == 503 else None

        body = wait_until(unhealthy, 30, "/healthz to report the hung source")
        assert "no binlog event or heartbeat from the source" in body
        assert time.monotonic() - stopped < 6 + 10
        wait_until(lambda: not active.running, 30, "the active parser to give up")
        assert log_events(active, "source.stalled")
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    wait_until(lambda: log_events(standby, "lease.acquired"), 30, "the standby to take the lease")
    server.execute(*(f"INSERT INTO h.t VALUES ({i}, {i})" for i in range(10, 30)), "UPDATE h.t SET v = v + 1")
    wait_until(lambda: count_rows(read_all(nats_url), "h") >= 60, 60, "the changes after the source came back")
    msgs = read_all(nats_url)
    assert count_rows(msgs, "h") == 60
    assert_no_duplicates(msgs)
    assert standby.running

"""Sink workers: scaling and crashes keep every change exactly once and in order; poison stops a partition."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import msgpack
import nats
import pytest
from nats.js.api import DiscardPolicy

from services.launcher.processes import ServiceProcess
from services.launcher.servers import free_port
from shared import objects
from shared.subjects import DEFAULT_PARTITIONS, Names
from tests.integration.support import (
    StoredMsg,
    assert_table_order,
    binlake_cli,
    count_rows,
    http_get,
    read_stream_sync,
    replay,
    row_changes,
    wait_until,
)
from tests.integration.workload import TABLES, Workload


def assert_cdc_exactly_once(cdc: list[StoredMsg], raw: list[StoredMsg], workload: Workload) -> None:
    db = workload.db
    ids = Counter(m.headers["Nats-Msg-Id"] for m in cdc)
    assert [i for i, n in ids.items() if n > 1] == [], "duplicate events in BINLAKE_CDC"
    assert count_rows(cdc, db) == workload.changes
    raw_ids = {m.headers["Nats-Msg-Id"] for m in row_changes(raw, db)}
    assert {m.headers["Nats-Msg-Id"] for m in row_changes(cdc, db)} == raw_ids
    assert_table_order(cdc)
    for table in TABLES:
        assert replay(cdc, db, table).keys() == workload.snapshot(table).keys(), table


@pytest.mark.timeout(300)
def test_workers_scale_and_crash_without_loss_or_reordering(mariadb, database, parser, sink_factory, nats_url):
    workload = Workload(mariadb, database, target=20_000, rate=1200)
    workload.create_tables()
    thread = threading.Thread(target=workload.run, daemon=True)
    thread.start()
    a = sink_factory("a")
    time.sleep(2)
    b, c = sink_factory("b"), sink_factory("c")  # 1 -> 3
    wait_until(lambda: '"sink.rebalance"' in c.output, 20, "the third worker to take partitions")
    time.sleep(2)
    b.kill()  # 3 -> 2, without a goodbye: its membership expires
    wait_until(lambda: a.output.count('"sink.rebalance"') >= 3, 30, "the survivors to take b's partitions")
    time.sleep(1)
    c.stop()  # 2 -> 1 cleanly ...
    d = sink_factory("d")  # ... and back to 2
    thread.join()
    assert workload.error is None, workload.error
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), database) >= workload.changes, 120,
               "every change in BINLAKE_CDC")
    time.sleep(1)  # anything still in flight would show up as a duplicate now
    assert_cdc_exactly_once(read_stream_sync(nats_url, "BINLAKE_CDC"), read_stream_sync(nats_url), workload)
    assert a.running and d.running


async def _keep_only_the_last_raw_messages(nats_url: str, count: int) -> None:
    """Retention as an operator or the stream's limits would apply it: the oldest messages go."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        cfg = (await js.stream_info("BINLAKE_RAW")).config
        cfg.max_msgs, cfg.discard = count, DiscardPolicy.OLD
        await js.update_stream(cfg)
    finally:
        await nc.close()


async def _publish_raw(nats_url: str, subject: str, data: bytes, msg_id: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().publish(subject, data, headers={"Nats-Msg-Id": msg_id})
    finally:
        await nc.close()


def test_poisoned_message_goes_to_dead_letters_and_stops_its_partition(mariadb, database, parser, sink_factory,
                                                                       nats_url):
    mariadb.execute(f"CREATE TABLE `{database}`.p (id INT PRIMARY KEY)", f"INSERT INTO `{database}`.p VALUES (1)")
    sink = sink_factory("s")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), database) == 1, 30, "the first row")
    parser.stop()  # so the poisoned message sits between two real ones in this table's partition
    names = Names()
    subject = names.raw("main", database, "p")
    bad = msgpack.packb({"v": 99, "source": "main", "op": "i", "ts": 0, "pos": {}, "scn": 1, "txn": {}})
    asyncio.run(_publish_raw(nats_url, subject, bad, "poison-1"))
    dlq = wait_until(lambda: read_stream_sync(nats_url, "BINLAKE_DLQ"), 30, "the dead letter")
    assert dlq[0].subject == "binlake.dlq.main"
    assert "envelope version 99 is not supported" in dlq[0].headers["Binlake-Dlq-Reason"]
    assert dlq[0].headers["Binlake-Raw-Subject"].endswith(f".{database}.p")
    wait_until(lambda: '"partition.halted"' in sink.output, 10, "the halt log line")
    # A valid change after the poison stays behind it: nothing after the poison is handled.
    first = row_changes(read_stream_sync(nats_url), database)[0].env
    later = {**first, "scn": first["scn"] + 1, "rows": [{"after": {"id": 2}}]}
    asyncio.run(_publish_raw(nats_url, subject, msgpack.packb(later), "main:after-poison"))
    wait_until(lambda: count_rows(read_stream_sync(nats_url), database) == 2, 30, "row 2 in BINLAKE_RAW")
    time.sleep(2)
    cdc_rows = [r["after"]["id"] for m in row_changes(read_stream_sync(nats_url, "BINLAKE_CDC"), database)
                for r in m.env["rows"]]
    assert cdc_rows == [1]
    assert sink.running, "other partitions keep running"


def test_tables_are_spread_over_the_workers_not_partitions(mariadb, database, parser, sink_factory, nats_url):
    """Eight tables that all hash to even partitions: round-robin would give one worker all of them."""
    import json

    from shared.subjects import escape_token, partition

    db = database
    names = [t for t in (f"t{i}" for i in range(400))
             if partition(16, escape_token("main"), escape_token(db), escape_token(t)) % 2 == 0][:8]
    mariadb.execute(*(f"CREATE TABLE `{db}`.`{t}` (id INT PRIMARY KEY)" for t in names))
    mariadb.execute(*(f"INSERT INTO `{db}`.`{t}` VALUES (1), (2)" for t in names))
    a, b = sink_factory("a", BINLAKE_REBALANCE_S="1"), sink_factory("b", BINLAKE_REBALANCE_S="1")

    def split() -> tuple[dict[str, int], int]:
        """Tables per owner as `binlake status` computes the split, and the most tables of one partition."""
        out = binlake_cli(nats_url, "status", "--json")
        assert out.returncode == 0, out.stderr
        owners: dict[str, int] = {}
        parts = json.loads(out.stdout)["partitions"]
        for part in parts:
            owners[part["owner"]] = owners.get(part["owner"], 0) + part["tables"]
        return owners, max(part["tables"] for part in parts)

    def balanced() -> bool:
        owners, most = split()
        return set(owners) == {"a", "b"} and abs(owners["a"] - owners["b"]) <= most and sum(owners.values()) >= 8

    wait_until(balanced, 30, "the tables to be spread over both workers")
    owners, _ = split()
    for name, worker in (("a", a), ("b", b)):  # the workers' own split is the one status shows
        logged = f'"tables": {owners[name]}, "event": "sink.rebalance"'

        def said(w: ServiceProcess = worker, text: str = logged) -> bool:
            return text in w.output

        wait_until(said, 10, f"worker {name} to log its {owners[name]} tables")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) >= 16, 60, "every row in BINLAKE_CDC")
    assert a.running and b.running


@pytest.mark.timeout(240)
def test_raw_messages_removed_before_the_sink_read_them_halt_the_partition(mariadb, database, parser, sink_factory,
                                                                          nats_url):
    """Retention never skips silently: the partition stops and says which sequences are gone."""
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)", f"INSERT INTO `{db}`.t VALUES (1)")
    a = sink_factory("a", BINLAKE_CURSOR_INTERVAL_S="0.2")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) >= 1, 60, "the first row in CDC")
    a.stop()
    mariadb.execute(*(f"INSERT INTO `{db}`.t VALUES ({i})" for i in range(2, 32)))  # 30 transactions
    wait_until(lambda: sum(1 for m in row_changes(read_stream_sync(nats_url), db)) >= 31, 60, "30 more in RAW")

    asyncio.run(_keep_only_the_last_raw_messages(nats_url, 5))
    b = sink_factory("b", BINLAKE_CURSOR_INTERVAL_S="0.2")
    wait_until(lambda: '"partition.retention_gap"' in b.output, 60, "the partition to halt on the gap")
    line = next(x for x in b.output.splitlines() if '"partition.retention_gap"' in x)
    assert "BINLAKE_RAW no longer holds sequences" in line and "nats kv put" in line, line
    time.sleep(2)
    assert count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) == 1, "rows after the gap were published"
    assert b.running  # the other partitions go on


@pytest.mark.timeout(240)
def test_an_idle_partition_whose_old_messages_age_out_is_no_false_alarm(mariadb, database, parser, sink_factory,
                                                                         nats_url):
    from shared.subjects import escape_token, partition

    db = database

    def part(t: str) -> int:
        return partition(16, escape_token("main"), escape_token(db), escape_token(t))

    busy = "t"
    idle = next(t for t in (f"u{i}" for i in range(100)) if part(t) != part(busy))
    mariadb.execute(f"CREATE TABLE `{db}`.{busy} (id INT PRIMARY KEY)",
                    f"CREATE TABLE `{db}`.{idle} (id INT PRIMARY KEY)", f"INSERT INTO `{db}`.{idle} VALUES (1)",
                    f"INSERT INTO `{db}`.{busy} VALUES (1)")
    a = sink_factory("a", BINLAKE_CURSOR_INTERVAL_S="0.2")
    mariadb.execute(*(f"INSERT INTO `{db}`.{busy} VALUES ({i})" for i in range(2, 32)))
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) >= 32, 60, "every row in CDC")
    time.sleep(3)  # the idle partition records that the stream holds nothing more of it

    # The idle table's only message (among the first) goes, long handled; the slack is for heartbeats
    # that arrive after the idle partition's last record.
    asyncio.run(_keep_only_the_last_raw_messages(nats_url, 20))
    time.sleep(1)
    a.stop()
    b = sink_factory("b", BINLAKE_CURSOR_INTERVAL_S="0.2")
    mariadb.execute(f"INSERT INTO `{db}`.{idle} VALUES (2)", f"INSERT INTO `{db}`.{busy} VALUES (100)")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) >= 34, 60, "the new rows in CDC")
    assert '"partition.retention_gap"' not in b.output + a.output


def test_hostile_raw_messages_go_to_dead_letters_and_never_crash_the_worker(mariadb, database, parser,
                                                                           sink_factory, nats_url):
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.q (id INT PRIMARY KEY)", f"INSERT INTO `{db}`.q VALUES (1)")
    sink = sink_factory("s")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) == 1, 30, "the first row")
    first = row_changes(read_stream_sync(nats_url), db)[0]
    real = first.env
    names = Names()
    # An envelope naming another table than its subject, and a subject no parser writes (it has
    # too many tokens, so the stream stores it untransformed, inside another partition's filter:
    # the liar halts its own).
    liar = {**real, "table": "other", "scn": real["scn"] + 7}
    other = (int(first.subject.split(".")[3]) + 1) % DEFAULT_PARTITIONS
    asyncio.run(_publish_raw(nats_url, names.raw("main", db, "q"), msgpack.packb(liar), "hostile-1"))
    asyncio.run(_publish_raw(nats_url, f"binlake.raw.main.{other}.a.b.c", msgpack.packb(real), "hostile-2"))
    dlq = wait_until(lambda: (d := read_stream_sync(nats_url, "BINLAKE_DLQ")) and len(d) >= 2 and d, 30,
                     "two dead letters")
    reasons = sorted(m.headers["Binlake-Dlq-Reason"] for m in dlq)
    assert "is not a raw subject binlake publishes to" in reasons[0], reasons
    assert f"envelope of {db}.other on subject" in reasons[1], reasons
    time.sleep(1)
    assert sink.running, sink.output
    assert count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) == 1


@pytest.mark.timeout(240)
def test_a_first_sink_on_a_stream_that_lost_its_start_reads_from_where_it_starts(mariadb, database, parser,
                                                                                  sink_factory, nats_url):
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)",
                    *(f"INSERT INTO `{db}`.t VALUES ({i})" for i in range(1, 21)))
    wait_until(lambda: count_rows(read_stream_sync(nats_url), db) >= 20, 60, "20 rows in RAW")
    asyncio.run(_keep_only_the_last_raw_messages(nats_url, 5))  # before any sink ever ran
    sink = sink_factory("first", BINLAKE_CURSOR_INTERVAL_S="0.2")
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (100)")
    wait_until(lambda: any(r["after"]["id"] == 100 for m in row_changes(read_stream_sync(nats_url, "BINLAKE_CDC"), db)
                           for r in m.env["rows"]), 60, "the new row in CDC")
    assert '"partition.retention_gap"' not in sink.output


def test_a_reference_to_a_missing_object_goes_to_dead_letters_never_skipped(mariadb, database, parser, sink_factory,
                                                                            nats_url):
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.o (id INT PRIMARY KEY)", f"INSERT INTO `{db}`.o VALUES (1)")
    sink = sink_factory("s")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) == 1, 30, "the first row")
    real = row_changes(read_stream_sync(nats_url), db)[0].env
    gone = objects.reference({**real, "scn": real["scn"] + 9}, b"expired long ago", "binlake_raw_objects", "gone-1")

    async def publish() -> None:
        nc = await nats.connect(nats_url)
        try:
            headers = {"Nats-Msg-Id": "gone-1", objects.HEADER: "binlake_raw_objects/gone-1"}
            await nc.jetstream().publish(Names().raw("main", db, "o"), msgpack.packb(gone), headers=headers)
        finally:
            await nc.close()

    asyncio.run(publish())
    dlq = wait_until(lambda: read_stream_sync(nats_url, "BINLAKE_DLQ"), 30, "the dead letter")
    reason = dlq[0].headers["Binlake-Dlq-Reason"]
    assert "object 'gone-1." in reason and "is not in bucket binlake_raw_objects" in reason, reason
    wait_until(lambda: '"partition.halted"' in sink.output, 10, "the halt log line")
    mariadb.execute(f"INSERT INTO `{db}`.o VALUES (2)")  # behind the reference: never handled
    time.sleep(3)
    assert count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) == 1
    assert sink.running, "other partitions keep running"


@pytest.mark.timeout(300)
def test_a_raw_stream_defined_again_halts_the_partitions_ahead_until_rewound_to_its_start(
        mariadb, database, parser, sink_factory, nats_url):
    """BINLAKE_RAW deleted and defined again (sequences from 1) while sink cursors are past its end:
    the partitions halt and say how to resume, nothing of the new stream is skipped; after
    `binlake rewind --sink-partition all --to-start` and a restart every new change reaches CDC once."""
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)",
                    *(f"INSERT INTO `{db}`.t VALUES ({i})" for i in range(1, 21)))
    a = sink_factory("a", BINLAKE_CURSOR_INTERVAL_S="0.2")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) >= 20, 60, "20 rows in CDC")
    a.stop()
    parser.stop()
    asyncio.run(_define_raw_again(nats_url))
    parser.start()  # it resumes from its saved position: BINLAKE_RAW is empty
    mariadb.execute(*(f"INSERT INTO `{db}`.t VALUES ({i})" for i in range(21, 26)))
    wait_until(lambda: count_rows(read_stream_sync(nats_url), db) >= 5, 60, "5 new rows in the new RAW")

    b = sink_factory("b", BINLAKE_CURSOR_INTERVAL_S="0.2")
    wait_until(lambda: '"partition.stream_redefined"' in b.output, 60, "the partitions to halt")
    halt = next(x for x in b.output.splitlines() if "BINLAKE_RAW was deleted and defined again" in x)
    assert "binlake rewind --sink-partition" in halt and "--to-start" in halt, halt
    time.sleep(2)
    assert count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) == 20, "the new stream's rows were published"
    b.stop()

    done = binlake_cli(nats_url, "rewind", "--sink-partition", "all", "--to-start")
    assert done.returncode == 0, done.stderr
    assert "restart the sink" in done.stdout
    c = sink_factory("c", BINLAKE_CURSOR_INTERVAL_S="0.2")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) >= 25, 60, "the new rows in CDC")
    cdc = row_changes(read_stream_sync(nats_url, "BINLAKE_CDC"), db)
    assert sorted(r["after"]["id"] for m in cdc for r in m.env["rows"]) == list(range(1, 26))
    assert '"partition.stream_redefined"' not in c.output


async def _define_raw_again(nats_url: str) -> None:
    """BINLAKE_RAW deleted and created again, as `binlake init` does after a lost NATS volume."""
    from shared import jetstream

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.delete_stream("BINLAKE_RAW")
        await jetstream.ensure_stream(js, jetstream.raw_stream_config(Names(), DEFAULT_PARTITIONS))
    finally:
        await nc.close()


@pytest.mark.timeout(300)
def test_a_running_sink_halts_the_partitions_of_a_raw_stream_defined_under_it(mariadb, database, parser,
                                                                               sink_factory, nats_url):
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)",
                    *(f"INSERT INTO `{db}`.t VALUES ({i})" for i in range(1, 21)))
    port = free_port()
    a = sink_factory("a", BINLAKE_CURSOR_INTERVAL_S="0.2", BINLAKE_METRICS_PORT=str(port))
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) >= 20, 60, "20 rows in CDC")
    assert http_get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
    asyncio.run(_define_raw_again(nats_url))  # the parser and the sink keep running
    mariadb.execute(*(f"INSERT INTO `{db}`.t VALUES ({i})" for i in range(21, 26)))
    wait_until(lambda: count_rows(read_stream_sync(nats_url), db) >= 5, 60, "5 new rows in the new RAW")
    wait_until(lambda: '"partition.stream_redefined"' in a.output, 60, "the partitions to halt")
    time.sleep(2)
    assert count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), db) == 20, "the new stream's rows were published"
    assert a.running  # halted partitions, not a crashed worker
    code, body = http_get(f"http://127.0.0.1:{port}/healthz")
    assert code == 503 and "partition" in body and "BINLAKE_RAW was deleted and defined again" in body, body

"""Initial snapshots (issue 7): existing rows enter the stream as `op = "r"`, consistently.

The parser runs as a real process against the private MariaDB; `binlake snapshot` runs as
the real CLI. Consistency is checked the strong way: BINLAKE_RAW replayed into a dict keyed
by primary key must equal the source table, while a workload writes all over the key range
during the snapshot, and after the parser is killed with SIGKILL mid-snapshot.
"""

from __future__ import annotations

import json
import random
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

from services.launcher.processes import ROOT, ServiceProcess
from shared import envelope, keys
from tests.integration.conftest import ParserFactory
from tests.integration.lake_stack import (
    ServiceFactory,
    Stack,
    assert_cells_equal,
    assert_verify_equal,
    cursor_values,
    services_answer,
)
from tests.integration.support import (
    StoredMsg,
    assert_table_order,
    binlake_cli,
    cli_env,
    read_stream_sync,
    row_changes,
    snapshot_cli,
    wait_until,
)
from tests.integration.type_matrix import MATRIX, insert_sql
from tests.servers import BOTH_SOURCES, MYSQL_SOURCE, MariaDB, NatsServer

ROWS = 50_000
CHUNK = "1000"
# Rate-limited so the snapshot spans several seconds of the concurrent workload.
SNAPSHOT_ENV = {"BINLAKE_SNAPSHOT_CHUNK_ROWS": CHUNK, "BINLAKE_SNAPSHOT_POLL_S": "0.2",
                "BINLAKE_SNAPSHOT_MAX_ROWS_S": "6000"}


def snapshot_rows(msgs: list[StoredMsg], db: str, table: str) -> list[StoredMsg]:
    return [m for m in msgs if m.env.get("db") == db and m.env.get("table") == table and m.env["op"] == "r"]


@BOTH_SOURCES
@pytest.mark.parametrize("charsets", ["mixed", "utf8"])
def test_snapshot_rows_equal_binlog_rows_for_every_type(source: MariaDB, database: str, parser: ServiceProcess,
                                                        nats_url: str, tmp_path: Path, charsets: str) -> None:
    """The same rows read by SELECT and decoded from the binlog are identical, schema included:
    for a table with a latin1 column (every text value decoded by binlake) and one whose text is
    all UTF-8 (decoded by asyncmy's C row parser)."""
    db = database
    types = [t if charsets == "mixed" else t.replace("CHARACTER SET latin1", "CHARACTER SET utf8mb4")
             for t, _ in MATRIX]
    cols = ", ".join(f"c{i} {t}" for i, t in enumerate(types))
    source.execute(f"CREATE TABLE `{db}`.types (id INT PRIMARY KEY, touched INT NOT NULL DEFAULT 0, {cols})")
    conn = source.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        for stmt in insert_sql(db):
            cur.execute(stmt)
    conn.close()
    inserted = wait_until(lambda: (m := row_changes(read_stream_sync(nats_url), db)) and
                          sum(len(x.env["rows"]) for x in m) >= len(insert_sql(db)) and m, 30, "the inserts")
    done = snapshot_cli(nats_url, f"{db}.types")
    assert done.returncode == 0, done.stderr + parser.output[-3000:]
    msgs = snapshot_rows(read_stream_sync(nats_url), db, "types")
    assert msgs, parser.output[-3000:]
    by_id = {r["after"]["id"]: r["after"] for m in inserted for r in m.env["rows"]}
    snapped = {r["after"]["id"]: r["after"] for m in msgs for r in m.env["rows"]}
    for key, row in by_id.items():
        for name, value in row.items():
            assert snapped[key][name] == value, (key, name)
    assert snapped == by_id
    for ours, theirs in zip(msgs[0].env["schema"]["columns"], inserted[0].env["schema"]["columns"], strict=True):
        assert ours == theirs
    assert msgs[0].env["schema"] == inserted[0].env["schema"]
    assert msgs[0].headers["Binlake-Schema"] == inserted[0].headers["Binlake-Schema"]
    assert msgs[0].env["pk"] == ["id"]
    assert "snapshot done: 1 table(s)" in done.stderr


# -- helpers ----------------------------------------------------------------------------------


def replay_all(msgs: list[StoredMsg], db: str, table: str, key: Callable[[dict[str, Any]], Any]
               ) -> dict[Any, dict[str, Any]]:
    """Every event of one table, snapshot reads included, applied in stream order."""
    state: dict[Any, dict[str, Any]] = {}
    for m in msgs:
        env = m.env
        if env.get("db") != db or env.get("table") != table or env["op"] not in ("i", "u", "d", "r"):
            continue
        for row in env["rows"]:
            if "before" in row:
                state.pop(key(row["before"]), None)
            if "after" in row:
                state[key(row["after"])] = row["after"]
    return state


def replay_keyless(msgs: list[StoredMsg], db: str, table: str) -> Counter[tuple[Any, ...]]:
    """A keyless table's rows as the lake folds its events (`services.loader.merges`): a multiset,
    from its last `replace` that has its `replaced` on, without the `r` rows of a later one still open."""
    ops = ("i", "u", "d", "r", envelope.REPLACE, envelope.REPLACED)
    events = [m.env for m in msgs if m.env.get("db") == db and m.env.get("table") == table and m.env["op"] in ops]
    at = {op: [i for i, e in enumerate(events) if e["op"] == op] for op in (envelope.REPLACE, envelope.REPLACED)}
    done = max(at[envelope.REPLACED], default=-1)
    cut = max((i for i in at[envelope.REPLACE] if i < done), default=-1)
    began = max(at[envelope.REPLACE], default=-1)
    open_at = began if began > done else None
    rows: Counter[tuple[Any, ...]] = Counter()
    for i, env in enumerate(events[cut + 1:], start=cut + 1):
        if env["op"] in (envelope.REPLACE, envelope.REPLACED) or (env["op"] == "r" and open_at is not None
                                                                    and i > open_at):
            continue
        for row in env["rows"]:
            if "before" in row:
                rows[tuple(row["before"].values())] -= 1
            if "after" in row:
                rows[tuple(row["after"].values())] += 1
    return +rows


def last_change(msgs: list[StoredMsg], db: str) -> int:
    """The CDC sequence of the database's last change for the lake (a heartbeat after it never gets there)."""
    return max(m.seq for m in msgs if m.env.get("db") == db and m.env["op"] in ("i", "u", "d", "r", "ddl",
                                                                                    *envelope.SNAPSHOT_MARKS))


def by_id(row: dict[str, Any]) -> Any:
    return row["id"]


def big_source(mariadb: MariaDB, db: str) -> dict[int, tuple[Any, ...]]:
    return {r[0]: (r[1], r[2], str(r[3]), r[4].isoformat(timespec="microseconds"))
            for r in mariadb.query(f"SELECT id, grp, v, amount, at FROM `{db}`.big")}


def big_replayed(msgs: list[StoredMsg], db: str) -> dict[int, tuple[Any, ...]]:
    return {k: (r["grp"], r["v"], r["amount"], r["at"]) for k, r in replay_all(msgs, db, "big", by_id).items()}


def create_big(mariadb: MariaDB, db: str, rows: int = ROWS) -> None:
    """A table that already holds `rows` rows: written with sql_log_bin=0, so only a snapshot can see them."""
    mariadb.execute(
        f"CREATE TABLE `{db}`.big (id INT PRIMARY KEY, grp INT NOT NULL, v VARCHAR(64), amount DECIMAL(12,2), "
        "at DATETIME(6), KEY (grp))",
    )
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(f"INSERT INTO `{db}`.big SELECT seq, seq % 97, CONCAT('row ', seq), seq / 100, "
                        f"'2024-01-01 00:00:00' + INTERVAL seq SECOND FROM `{db}`.seq_1_to_{rows}")
    finally:
        conn.close()


@dataclass
class KeyRangeWorkload:
    """Random writes all over `big`'s key range until stopped: updates, deletes, inserts into holes and
    beyond the end, and primary key moves."""

    mariadb: MariaDB
    db: str
    hi: int = ROWS
    rate: float = 200.0  # statements per second
    seed: int = 3
    alter_at: int = 0  # after this many statements: ALTER TABLE big ADD COLUMN extra INT (0: never)
    statements: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> KeyRangeWorkload:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(60)
        assert self.error is None, self.error
        assert self.statements > 100, "the workload hardly ran"

    def run(self) -> None:
        rnd = random.Random(self.seed)
        conn = self.mariadb.connect(autocommit=False)
        t = f"`{self.db}`.big"
        next_id = self.hi + 1
        started = time.monotonic()
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    ahead = self.statements / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                    if self.alter_at and self.statements >= self.alter_at:
                        cur.execute(f"ALTER TABLE {t} ADD COLUMN extra INT")
                        self.alter_at = 0
                    for _ in range(rnd.choice([1, 1, 2, 5])):
                        lo = rnd.randint(1, next_id)
                        kind = rnd.choices(["update", "delete", "hole", "append", "move"], weights=[5, 2, 2, 1, 1])[0]
                        if kind == "update":
                            cur.execute(f"UPDATE {t} SET v = CONCAT('u', id, '-', %s), amount = amount + 1 "
                                        "WHERE id BETWEEN %s AND %s", (self.statements, lo, lo + rnd.randint(0, 30)))
                        elif kind == "delete":
                            cur.execute(f"DELETE FROM {t} WHERE id BETWEEN %s AND %s", (lo, lo + rnd.randint(0, 3)))
                        elif kind == "hole":
                            cur.execute(f"INSERT IGNORE INTO {t} (id, grp, v, amount, at) "
                                        "VALUES (%s, 1, 'hole', 0.5, '2025-01-01 00:00:00.5')", (lo,))
                        elif kind == "append":
                            cur.execute(f"INSERT INTO {t} (id, grp, v, amount, at) "
                                        "VALUES (%s, 2, 'new', 1.25, NOW(6))", (next_id,))
                            next_id += 1
                        else:
                            cur.execute(f"UPDATE IGNORE {t} SET id = id + 3000000 WHERE id = %s AND id < 3000000",
                                        (lo,))
                        self.statements += 1
                    conn.commit()
        except BaseException as exc:
            self.error = exc
        finally:
            conn.close()


def progress(nats_url: str, db: str, table: str) -> dict[str, Any] | None:
    """The table's snapshot progress as the parser stored it."""
    return cursor_values(nats_url, keys.snapshot_table("main", db, table))[0]


@dataclass
class SnapshotStack(Stack):
    parsers: list[ServiceProcess] = field(default_factory=list)


@pytest.fixture
def lake_stack(mariadb: MariaDB, database: str, nats_url: str, parser_factory: ParserFactory,
               sink_factory: ServiceFactory, service_factory: ServiceFactory, tmp_path: Path) -> SnapshotStack:
    """parser (small chunks) + sink + meta + store; the loader is started by the test."""
    parser = parser_factory(**SNAPSHOT_ENV)
    sink_factory("sink")
    service_factory("services.meta", "meta")
    service_factory("services.store", "store")
    wait_until(lambda: services_answer(nats_url), 60, "meta and store to answer", interval=0.5)
    return SnapshotStack(mariadb, database, nats_url, tmp_path / "lake", service_factory, batch_rows=20_000,
                         parsers=[parser])


def settle_and_check(spark: SparkSession, stack: Stack, workload: KeyRangeWorkload) -> list[StoredMsg]:
    """After the workload: BINLAKE_CDC replayed equals the source, and so does the lake."""
    db = stack.db
    source = big_source(stack.mariadb, db)
    assert len(source) > ROWS // 2

    def cdc_equal() -> list[StoredMsg] | None:
        msgs = read_stream_sync(stack.nats_url, "BINLAKE_CDC")
        return msgs if big_replayed(msgs, db) == source else None

    try:
        msgs: list[StoredMsg] = wait_until(cdc_equal, 180, "BINLAKE_CDC replayed to equal the source", interval=3)
    except AssertionError:
        replayed = big_replayed(read_stream_sync(stack.nats_url, "BINLAKE_CDC"), db)
        missing = sorted(source.keys() - replayed.keys())[:10]
        extra = sorted(replayed.keys() - source.keys())[:10]
        wrong = [k for k in source.keys() & replayed.keys() if source[k] != replayed[k]][:10]
        diff = [(k, source[k], replayed[k]) for k in wrong]
        raise AssertionError(f"missing {missing} extra {extra} wrong {diff}") from None
    assert_table_order(msgs)
    loader = stack.start_loader()
    stack.wait_loaded(last_change(msgs, db))
    assert loader.running
    assert_verify_equal(spark, stack, ["big"])
    return msgs


# -- consistency under writes -------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_snapshot_under_writes_all_over_the_key_range_equals_the_source(spark: SparkSession,
                                                                       lake_stack: SnapshotStack) -> None:
    stack = lake_stack
    create_big(stack.mariadb, stack.db)
    workload = KeyRangeWorkload(stack.mariadb, stack.db, alter_at=800).start()
    time.sleep(1)
    done = snapshot_cli(stack.nats_url, f"{stack.db}.big", timeout=600)
    workload.finish()
    assert done.returncode == 0, done.stderr
    assert workload.alter_at == 0, "the ALTER TABLE did not happen during the snapshot"
    state = progress(stack.nats_url, stack.db, "big")
    assert state is not None and state["state"] == "done" and state["key_kind"] == "primary"
    # Chunked, not one window; the workload's deletes thin the key range while it is read (more on a slow box).
    assert state["chunks"] >= ROWS // int(CHUNK) // 2
    msgs = settle_and_check(spark, stack, workload)
    reads = sum(len(m.env["rows"]) for m in msgs if m.env.get("table") == "big" and m.env["op"] == "r")
    assert ROWS // 2 < reads <= ROWS + workload.statements
    assert all(m.env["pos"]["file"] for m in msgs if m.env["op"] == "r")


@pytest.mark.timeout(900)
def test_snapshot_survives_two_parser_kills(spark: SparkSession, lake_stack: SnapshotStack,
                                            parser_factory: ParserFactory) -> None:
    """SIGKILL of the parser (which runs the snapshot) twice mid-snapshot: it resumes at its last chunk."""
    stack = lake_stack
    create_big(stack.mariadb, stack.db)
    workload = KeyRangeWorkload(stack.mariadb, stack.db).start()
    filed = snapshot_cli(stack.nats_url, f"{stack.db}.big", "--no-wait")
    assert filed.returncode == 0, filed.stderr
    chunks_at_kill = []
    for n, at in enumerate((8, 25)):
        def finished(at: int = at) -> bool:
            return int((progress(stack.nats_url, stack.db, "big") or {}).get("chunks", 0)) >= at

        wait_until(finished, 300, f"{at} finished chunks", interval=0.1)
        chunks_at_kill.append(progress(stack.nats_url, stack.db, "big")["chunks"])  # type: ignore[index]
        stack.parsers[-1].kill()
        stack.parsers.append(parser_factory(wait_ready=False, log_name=f"parser-{n + 2}.log", **SNAPSHOT_ENV))
    done = snapshot_cli(stack.nats_url, f"{stack.db}.big", timeout=600)  # joins the running snapshot
    workload.finish()
    assert done.returncode == 0, done.stderr
    state = progress(stack.nats_url, stack.db, "big")
    assert state is not None and state["state"] == "done"
    resumed = [json.loads(line) for line in (stack.data_dir.parent / "parser-3.log").read_text().splitlines()
               if '"snapshot.table"' in line]
    assert resumed and resumed[0]["resume_chunk"] >= chunks_at_kill[1] > chunks_at_kill[0] >= 8
    msgs = settle_and_check(spark, stack, workload)
    reads = sum(len(m.env["rows"]) for m in msgs if m.env.get("table") == "big" and m.env["op"] == "r")
    assert reads <= ROWS + workload.statements + 2 * int(CHUNK), "a resumed snapshot started over"


@pytest.mark.timeout(900)
def test_a_keyless_snapshot_killed_between_its_pages_starts_over_and_the_lake_counts_each_row_once(
        spark: SparkSession, lake_stack: SnapshotStack, parser_factory: ParserFactory) -> None:
    """SIGKILL of the parser while it hands out a keyless table's pages, writers on the table: the
    next parser begins a new consistent read (a new `replace`), the lake folds from the complete
    one and equals the source as a multiset."""
    stack, db = lake_stack, lake_stack.db
    t = f"`{db}`.heap"
    slow = {**SNAPSHOT_ENV, "BINLAKE_SNAPSHOT_CHUNK_ROWS": "200", "BINLAKE_SNAPSHOT_MAX_ROWS_S": "1000"}
    stack.parsers[-1].stop(timeout=30)
    stack.parsers.append(parser_factory(log_name="parser-slow.log", **slow))
    stack.mariadb.execute(f"CREATE TABLE {t} (a INT, b VARCHAR(10))")
    without_binlog(stack.mariadb, f"INSERT INTO {t} SELECT seq % 50, CONCAT('v', seq % 3) FROM `{db}`.seq_1_to_5000")
    stack.start_loader()
    stop = threading.Event()
    errors: list[BaseException] = []
    writer = writes(stack.mariadb, stop, errors, f"INSERT INTO {t} VALUES ({{n}} % 50, 'w')",
                    f"DELETE FROM {t} WHERE a = ({{n}} * 7) % 50 LIMIT 1",
                    f"UPDATE {t} SET b = 'u' WHERE a = ({{n}} * 3) % 50 LIMIT 2", pause=0.05)
    filed = snapshot_cli(stack.nats_url, f"{db}.heap", "--no-wait")
    assert filed.returncode == 0, filed.stderr
    wait_until(lambda: int((progress(stack.nats_url, db, "heap") or {}).get("chunks", 0)) >= 6, 300,
               "pages of the keyless table", interval=0.1)
    stack.parsers[-1].kill()
    stack.parsers.append(parser_factory(wait_ready=False, log_name="parser-after-kill.log", **slow))
    done = snapshot_cli(stack.nats_url, f"{db}.heap", timeout=600)  # joins the running snapshot
    stop.set()
    writer.join(10)
    assert not errors, errors
    assert done.returncode == 0, done.stderr
    stack.mariadb.execute(f"INSERT INTO {t} VALUES (-1, 'end')")
    wait_until(lambda: any(m.env.get("table") == "heap" and m.env["op"] == "i" and m.env["rows"][0]["after"]["a"] == -1
                           for m in stack.cdc()), 120, "the last insert in BINLAKE_CDC", interval=1)
    msgs = read_stream_sync(stack.nats_url, "BINLAKE_CDC")
    replaces = [m for m in msgs if m.env.get("table") == "heap" and m.env["op"] == envelope.REPLACE]
    assert len(replaces) >= 2  # begun again after the kill
    stack.wait_loaded(last_change(read_stream_sync(stack.nats_url, "BINLAKE_CDC"), db))
    stack.wait_merged(["heap"])
    assert_cells_equal(stack, "heap")


# -- table shapes -------------------------------------------------------------------------------


def without_binlog(mariadb: MariaDB, *sql: str) -> None:
    """Rows that were there before binlake: only a snapshot can see them."""
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            for stmt in sql:
                cur.execute(stmt)
    finally:
        conn.close()


def writes(mariadb: MariaDB, stop: threading.Event, errors: list[BaseException], *statements: str,
           pause: float = 0.002) -> threading.Thread:
    """Run the statements round-robin (`{n}`: a growing counter), `pause` apart, until stopped."""
    def run() -> None:
        n = 0
        conn = mariadb.connect()
        try:
            with conn.cursor() as cur:
                while not stop.is_set():
                    cur.execute(statements[n % len(statements)].replace("{n}", str(n)))
                    n += 1
                    time.sleep(pause)
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(900)
def test_a_keyless_table_snapshotted_after_its_rows_were_captured_holds_each_row_once(
        spark: SparkSession, lake_stack: SnapshotStack) -> None:
    """Rows the binlog brought (duplicates among them), then `binlake snapshot` of the table while it
    is written (read in pages of one consistent read), then a second snapshot: the lake equals the
    source as a multiset, no row twice."""
    stack, db = lake_stack, lake_stack.db
    t = f"`{db}`.dups"
    stack.mariadb.execute(f"CREATE TABLE {t} (a INT, b VARCHAR(10))",
                          f"INSERT INTO {t} VALUES " + ", ".join(f"({i % 40}, 'v{i % 3}')" for i in range(2500)))
    stack.start_loader()
    stack.wait_loaded(max(m.seq for m in stack.wait_cdc(2500)))
    stop = threading.Event()
    errors: list[BaseException] = []
    writer = writes(stack.mariadb, stop, errors, f"INSERT INTO {t} VALUES ({{n}} % 40, 'w')",
                    f"DELETE FROM {t} WHERE a = {{n}} % 40 LIMIT 1",
                    f"UPDATE {t} SET b = 'u' WHERE a = ({{n}} * 7) % 40 LIMIT 1", pause=0.05)
    for _ in range(2):
        done = snapshot_cli(stack.nats_url, f"{db}.dups", timeout=300)
        assert done.returncode == 0, done.stderr
    stop.set()
    writer.join(10)
    assert not errors, errors
    state = progress(stack.nats_url, db, "dups")
    assert state is not None and state["key_kind"] == "none"
    assert state["chunks"] >= 2500 // int(CHUNK) + 2  # the `replace`, pages of CHUNK rows, the `replaced`
    stack.mariadb.execute(f"INSERT INTO {t} VALUES (-1, 'end')")

    def ended() -> bool:
        return any(m.env.get("table") == "dups" and m.env["op"] == "i" and m.env["rows"][0]["after"]["a"] == -1
                   for m in stack.cdc())

    wait_until(ended, 120, "the last insert in BINLAKE_CDC", interval=1)
    stack.wait_loaded(max(m.seq for m in stack.cdc()))
    stack.wait_merged(["dups"])
    assert_cells_equal(stack, "dups")


@pytest.mark.timeout(900)
def test_tables_without_key_empty_composite_and_unique_key(mariadb: MariaDB, database: str,
                                                          parser_factory: ParserFactory, nats_url: str) -> None:
    db = database
    parser = parser_factory(BINLAKE_SNAPSHOT_CHUNK_ROWS="700", BINLAKE_SNAPSHOT_POLL_S="0.2",
                            BINLAKE_SNAPSHOT_MAX_ROWS_S="8000")
    mariadb.execute(
        f"CREATE TABLE `{db}`.nokey (a INT, b VARCHAR(10))",
        f"CREATE TABLE `{db}`.empty (id INT PRIMARY KEY)",
        f"CREATE TABLE `{db}`.composite (region CHAR(2), id INT, seq BIGINT, v VARCHAR(20), "
        "PRIMARY KEY (region, id, seq))",
        f"CREATE TABLE `{db}`.unique_only (code VARCHAR(20) NOT NULL, v INT, n INT NULL, UNIQUE KEY (n), "
        "UNIQUE KEY (code))",
    )
    without_binlog(
        mariadb,
        f"INSERT INTO `{db}`.nokey SELECT seq, CONCAT('b', seq) FROM `{db}`.seq_1_to_3000",
        f"INSERT INTO `{db}`.composite SELECT ELT(1 + seq % 3, 'eu', 'us', 'ap'), seq % 50, seq, CONCAT('v', seq) "
        f"FROM `{db}`.seq_1_to_10000",
        f"INSERT INTO `{db}`.unique_only SELECT CONCAT('Code-', seq), seq, NULL FROM `{db}`.seq_1_to_5000",
    )
    stop = threading.Event()
    errors: list[BaseException] = []
    writer = writes(
        mariadb, stop, errors,
        f"UPDATE `{db}`.composite SET v = 'w{{n}}' WHERE region = 'us' AND id = {{n}} % 50",
        f"DELETE FROM `{db}`.composite WHERE region = 'ap' AND seq = 1 + 3 * ({{n}} % 3333)",
        f"INSERT IGNORE INTO `{db}`.composite VALUES ('eu', {{n}} % 50, 20000 + {{n}}, 'new')",
        f"UPDATE `{db}`.composite SET region = 'zz' WHERE region = 'eu' AND seq = 3 * ({{n}} % 3333)",
        f"UPDATE `{db}`.unique_only SET v = -{{n}} WHERE code = CONCAT('Code-', 1 + {{n}} % 5000)",
    )
    # A keyless table's read begins again when a change comes while it begins: slower writes.
    slow = writes(
        mariadb, stop, errors,
        f"UPDATE `{db}`.nokey SET b = CONCAT('u', {{n}}) WHERE a = 1 + {{n}} % 3000",
        f"DELETE FROM `{db}`.nokey WHERE a = 1 + ({{n}} * 7) % 3000",
        f"INSERT INTO `{db}`.nokey VALUES (100000 + {{n}}, 'ins')",
        pause=0.15,
    )
    done = snapshot_cli(nats_url, rf"{db}\.(nokey|empty|composite|unique_only)", timeout=300)
    stop.set()
    writer.join(10)
    slow.join(10)
    assert not errors, errors
    assert done.returncode == 0, done.stderr + parser.output[-3000:]
    assert "snapshot done: 4 table(s)" in done.stderr

    def replayed_equals_source() -> list[StoredMsg] | None:
        msgs = read_stream_sync(nats_url)
        comp = {k: r["v"] for k, r in replay_all(msgs, db, "composite",
                                                 lambda r: (r["region"], r["id"], r["seq"])).items()}
        uniq = {k: r["v"] for k, r in replay_all(msgs, db, "unique_only", lambda r: r["code"]).items()}
        nokey = replay_keyless(msgs, db, "nokey")
        ok = (comp == {tuple(r[:3]): r[3] for r in mariadb.query(f"SELECT * FROM `{db}`.composite")}
              and uniq == {r[0]: r[1] for r in mariadb.query(f"SELECT code, v FROM `{db}`.unique_only")}
              and nokey == Counter(tuple(r) for r in mariadb.query(f"SELECT a, b FROM `{db}`.nokey")))
        return msgs if ok else None

    msgs = wait_until(replayed_equals_source, 60, "the stream replayed to equal every source table", interval=1)
    assert not snapshot_rows(msgs, db, "empty")
    assert_table_order(msgs)
    states = {t: progress(nats_url, db, t) for t in ("nokey", "empty", "composite", "unique_only")}
    assert {t: (s or {}).get("key_kind") for t, s in states.items()} == {
        "nokey": "none", "empty": "primary", "composite": "primary", "unique_only": "unique"}
    assert states["empty"]["rows"] == 0 and states["empty"]["state"] == "done"  # type: ignore[index]
    assert states["nokey"]["chunks"] >= 3000 // 700 + 2  # type: ignore[index]  # `replace`, pages, `replaced`
    assert states["composite"]["chunks"] >= 10000 // 700  # type: ignore[index]
    assert snapshot_rows(msgs, db, "composite")[0].env["pk"] == ["region", "id", "seq"]
    assert snapshot_rows(msgs, db, "nokey")[0].env["pk"] == []


@BOTH_SOURCES
@pytest.mark.timeout(600)
def test_a_keyless_table_is_read_in_pages_of_one_consistent_read_under_writes(
        source: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    """Pages of 100 rows of one consistent read, released by their own windows while writers insert,
    update and delete duplicates: the stream folded as the lake folds it equals the source."""
    db, t = database, f"`{database}`.heap"
    parser = parser_factory(BINLAKE_SNAPSHOT_CHUNK_ROWS="100", BINLAKE_SNAPSHOT_POLL_S="0.2",
                            BINLAKE_SNAPSHOT_MAX_ROWS_S="2000")
    source.execute(f"CREATE TABLE {t} (a INT, b VARCHAR(10))",
                   f"INSERT INTO {t} VALUES " + ", ".join(f"({i % 50}, 'v{i % 3}')" for i in range(1000)))
    stop = threading.Event()
    errors: list[BaseException] = []
    writer = writes(source, stop, errors, f"INSERT INTO {t} VALUES ({{n}} % 50, 'w')",
                    f"DELETE FROM {t} WHERE a = ({{n}} * 7) % 50 LIMIT 1",
                    f"UPDATE {t} SET b = 'u' WHERE a = ({{n}} * 3) % 50 LIMIT 2", pause=0.02)
    done = snapshot_cli(nats_url, f"{db}.heap", timeout=300)
    stop.set()
    writer.join(10)
    assert not errors, errors
    assert done.returncode == 0, done.stderr + parser.output[-3000:]
    state = progress(nats_url, db, "heap")
    assert state is not None and state["chunks"] >= 1000 // 100 + 2, state

    def folded_equals_source() -> bool:
        want = Counter(tuple(r) for r in source.query(f"SELECT a, b FROM {t}"))
        return replay_keyless(read_stream_sync(nats_url), db, "heap") == want

    wait_until(folded_equals_source, 60, "the stream folded to equal the source", interval=1)


@MYSQL_SOURCE
def test_a_keyless_snapshot_refuses_a_binlog_out_of_commit_order(
        source: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    db = database
    parser = parser_factory(BINLAKE_SNAPSHOT_POLL_S="0.2")
    source.execute(f"CREATE TABLE `{db}`.heap (a INT)", f"INSERT INTO `{db}`.heap VALUES (1), (1)")
    source.execute("SET GLOBAL binlog_order_commits = OFF")
    try:
        done = snapshot_cli(nats_url, f"{db}.heap")
    finally:
        source.execute("SET GLOBAL binlog_order_commits = ON")
    assert done.returncode != 0
    state = progress(nats_url, db, "heap")
    assert state is not None and state["state"] == "failed", state
    assert "set binlog_order_commits=ON, or give the table a key" in state["error"]
    assert parser.running


# -- operations -------------------------------------------------------------------------------------


def test_new_tables_are_snapshotted_on_first_sight_and_progress_is_visible(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    from tests.integration.support import http_get, parse_metrics
    from tests.servers import free_port

    db = database
    port = free_port()
    parser_factory(BINLAKE_SNAPSHOT_TABLES=rf"{db}\.auto_.*", BINLAKE_SNAPSHOT_SCAN_S="0.5",
                   BINLAKE_SNAPSHOT_POLL_S="0.2", BINLAKE_METRICS_PORT=str(port))
    # The table appears with its rows (renamed into the pattern): a scan (every 0.5 s) between a
    # CREATE and an INSERT would snapshot it empty.
    mariadb.execute(f"CREATE TABLE `{db}`.staging (id INT PRIMARY KEY, name VARCHAR(20))",
                    f"CREATE TABLE `{db}`.other (id INT PRIMARY KEY)")
    without_binlog(mariadb, f"INSERT INTO `{db}`.staging SELECT seq, CONCAT('n', seq) FROM `{db}`.seq_1_to_1234",
                   f"INSERT INTO `{db}`.other VALUES (1)")
    mariadb.execute(f"RENAME TABLE `{db}`.staging TO `{db}`.auto_items")
    state = wait_until(lambda: (s := progress(nats_url, db, "auto_items")) and s["state"] == "done" and s, 60,
                       "the automatic snapshot")
    assert state["rows"] == 1234 and state["run"].startswith("auto-")
    assert progress(nats_url, db, "other") is None
    msgs = snapshot_rows(read_stream_sync(nats_url), db, "auto_items")
    assert sum(len(m.env["rows"]) for m in msgs) == 1234

    status = binlake_cli(nats_url, "status", "--json")
    assert status.returncode == 0, status.stderr
    snaps = {s["table"]: s for s in json.loads(status.stdout)["snapshots"]}
    assert snaps[f"{db}.auto_items"]["state"] == "done" and snaps[f"{db}.auto_items"]["rows"] == 1234
    text = binlake_cli(nats_url, "status").stdout
    assert f"{db}.auto_items: done 1234/1234 rows (100%)" in text, text

    metrics = parse_metrics(http_get(f"http://127.0.0.1:{port}/metrics")[1])
    label = f'{{table="{db}.auto_items"}}'
    assert metrics[f"binlake_parser_snapshot_rows{label}"] == 1234
    assert metrics[f"binlake_parser_snapshot_done{label}"] == 1
    assert metrics["binlake_parser_snapshot_chunks_total"] >= 1


def test_killing_the_cli_leaves_the_snapshot_running(mariadb: MariaDB, database: str,
                                                     parser_factory: ParserFactory, nats_url: str) -> None:
    db = database
    parser_factory(BINLAKE_SNAPSHOT_CHUNK_ROWS="500", BINLAKE_SNAPSHOT_MAX_ROWS_S="5000",
                   BINLAKE_SNAPSHOT_POLL_S="0.2")
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)")
    without_binlog(mariadb, f"INSERT INTO `{db}`.t SELECT seq FROM `{db}`.seq_1_to_10000")
    cli = subprocess.Popen([sys.executable, "-m", "services.cli", "snapshot", f"{db}.t"], cwd=ROOT,
                           env=cli_env(nats_url),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: (progress(nats_url, db, "t") or {}).get("chunks", 0) >= 2, 60, "two chunks")
    cli.kill()
    cli.wait(10)
    state = wait_until(lambda: (s := progress(nats_url, db, "t")) and s["state"] == "done" and s, 60,
                       "the snapshot to finish without its CLI")
    assert state["rows"] == 10000


def test_columns_altered_between_chunks_reach_the_rows_of_later_chunks(mariadb: MariaDB, database: str,
                                                                     parser_factory: ParserFactory,
                                                                     nats_url: str) -> None:
    """A table's columns are read once per snapshot, not per chunk: an ALTER between two chunks
    (no window open) must still make the next chunks read, and describe, the new columns."""
    db = database
    parser_factory(BINLAKE_SNAPSHOT_CHUNK_ROWS="200", BINLAKE_SNAPSHOT_MAX_ROWS_S="2000",
                   BINLAKE_SNAPSHOT_POLL_S="0.2")
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, a INT, b VARCHAR(10))")
    without_binlog(mariadb, f"INSERT INTO `{db}`.t SELECT seq, seq, 'b' FROM `{db}`.seq_1_to_8000")
    assert snapshot_cli(nats_url, f"{db}.t", "--no-wait").returncode == 0
    wait_until(lambda: (progress(nats_url, db, "t") or {}).get("chunks", 0) >= 3, 60, "three chunks")
    mariadb.execute(f"ALTER TABLE `{db}`.t ADD COLUMN extra INT NOT NULL DEFAULT 7")
    wait_until(lambda: (progress(nats_url, db, "t") or {}).get("rows", 0) >= 4000, 60, "half of the rows")
    mariadb.execute(f"ALTER TABLE `{db}`.t DROP COLUMN b")
    state = wait_until(lambda: (s := progress(nats_url, db, "t")) and s["state"] == "done" and s, 120,
                       "the snapshot to finish")
    assert state["rows"] >= 8000, state
    msgs = snapshot_rows(read_stream_sync(nats_url), db, "t")
    latest: dict[int, dict[str, Any]] = {}
    for m in msgs:
        names = [c["name"] for c in m.env["schema"]["columns"]]
        for r in m.env["rows"]:
            assert sorted(r["after"]) == sorted(names), (names, r)  # rows match the schema they carry
            latest[r["after"]["id"]] = r["after"]
    assert sorted(latest) == list(range(1, 8001))
    last = [m for m in msgs if m.env["rows"][-1]["after"]["id"] == 8000][-1]
    assert [c["name"] for c in last.env["schema"]["columns"]] == ["id", "a", "extra"]
    assert last.env["rows"][-1]["after"] == {"id": 8000, "a": 8000, "extra": 7}
    assert any("extra" in m.env["rows"][0]["after"] and "b" in m.env["rows"][0]["after"] for m in msgs), \
        "no chunk was read between the two ALTERs"


def test_snapshot_failures_are_clear(mariadb: MariaDB, database: str, parser_factory: ParserFactory,
                                     nats_url: str) -> None:
    db = database
    bad_regex = snapshot_cli(nats_url, "shop.(")
    assert bad_regex.returncode == 1 and "not a table name or regular expression" in bad_regex.stderr

    nobody = snapshot_cli(nats_url, f"{db}.t", "--accept-timeout", "1")
    assert nobody.returncode == 1
    assert "no parser of source 'main' took the request" in nobody.stderr, nobody.stderr

    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY)",
                    f"CREATE TABLE `{db}`.odd (id INT PRIMARY KEY, u INET6)")
    without_binlog(mariadb, f"INSERT INTO `{db}`.t VALUES (1)", f"INSERT INTO `{db}`.odd VALUES (1, '::1')")
    parser = parser_factory(BINLAKE_SNAPSHOT_POLL_S="0.2")  # the request filed above is taken now
    wait_until(lambda: (s := progress(nats_url, db, "t")) and s["state"] == "done", 60, "the filed request's snapshot")

    none = snapshot_cli(nats_url, f"{db}.missing")
    assert none.returncode == 1 and f"no table of the source matches {db}.missing" in none.stderr, none.stderr

    odd = snapshot_cli(nats_url, f"{db}.odd")
    assert odd.returncode == 1, odd.stderr
    assert f"{db}.odd: failed" in odd.stderr and "inet6" in odd.stderr, odd.stderr
    assert parser.running

    # A source user that may read but not write the watermarks: that snapshot fails, capture goes on.
    user = f"ro_{db[-8:]}"
    mariadb.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'",
                    f"GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO '{user}'@'%'")
    try:
        parser.stop()
        limited = parser_factory(wait_ready=False, log_name="parser-ro.log", BINLAKE_SNAPSHOT_POLL_S="0.2",
                                 BINLAKE_SOURCE_URL=mariadb.dsn(user, "pw"))
        denied = snapshot_cli(nats_url, f"{db}.t")
        assert denied.returncode == 1, denied.stderr
        assert "GRANT CREATE, INSERT, UPDATE ON `binlake`.* TO <user>" in denied.stderr, denied.stderr
        mariadb.execute(f"INSERT INTO `{db}`.t VALUES (2)")
        wait_until(lambda: any(m.env.get("table") == "t" and m.env["op"] == "i"
                               for m in read_stream_sync(nats_url)), 30, "capture to go on")
        assert limited.running
    finally:
        mariadb.execute(f"DROP USER '{user}'@'%'")


@pytest.mark.timeout(600)
def test_snapshot_survives_a_mariadb_crash_and_a_nats_restart(mariadb_factory: Callable[..., MariaDB],
                                                               parser_factory: ParserFactory,
                                                               nats_server: NatsServer, nats_url: str) -> None:
    server = mariadb_factory()
    server.execute("CREATE DATABASE s CHARACTER SET utf8mb4", "CREATE TABLE s.t (id INT PRIMARY KEY, v VARCHAR(20))")
    without_binlog(server, "INSERT INTO s.t SELECT seq, CONCAT('v', seq) FROM s.seq_1_to_30000")
    parser = parser_factory(BINLAKE_SOURCE_URL=server.dsn(), BINLAKE_SNAPSHOT_CHUNK_ROWS="500",
                            BINLAKE_SNAPSHOT_MAX_ROWS_S="5000", BINLAKE_SNAPSHOT_POLL_S="0.2")
    assert snapshot_cli(nats_url, "s.t", "--no-wait").returncode == 0

    def chunks() -> int:
        return int((progress(nats_url, "s", "t") or {}).get("chunks", 0))

    wait_until(lambda: chunks() >= 5, 60, "five chunks")
    server.kill()
    time.sleep(1)
    server.start()
    at_crash = chunks()
    wait_until(lambda: chunks() >= at_crash + 10, 120, "ten more chunks after the crash")
    nats_server.stop()
    time.sleep(2)
    nats_server.start()
    state = wait_until(lambda: (s := progress(nats_url, "s", "t")) and s["state"] == "done" and s, 180,
                       "the snapshot to finish")
    assert state["rows"] == 30000
    assert parser.running, parser.output[-3000:]
    server.execute("UPDATE s.t SET v = 'after' WHERE id <= 10", "DELETE FROM s.t WHERE id > 29990")
    source = {r[0]: r[1] for r in server.query("SELECT id, v FROM s.t")}
    wait_until(lambda: {k: r["v"] for k, r in replay_all(read_stream_sync(nats_url), "s", "t", by_id).items()}
               == source, 60, "the stream replayed to equal the source")
    restarts = [line for line in parser.output.splitlines() if '"actor.restart"' in line]
    assert any("SourceUnavailable" in line for line in restarts), "the pipeline restarted after the crash"


def test_chunks_of_large_rows_end_at_their_byte_budget_and_rows_over_max_payload_go_to_objects(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory, nats_url: str) -> None:
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.blobs (id INT PRIMARY KEY, b LONGBLOB)")
    # 600 KB rows, and three over max_payload (1 MiB): those travel as object references.
    without_binlog(mariadb, f"INSERT INTO `{db}`.blobs SELECT seq, REPEAT(CHAR(65 + seq % 26), "
                            f"IF(seq % 10 = 0, 1500000, 600000)) FROM `{db}`.seq_1_to_30")
    # The parser starts after the rows are there: its scan (every 0.5 s) could otherwise snapshot the empty table.
    parser_factory(BINLAKE_SNAPSHOT_TABLES=rf"{db}\.blobs", BINLAKE_SNAPSHOT_SCAN_S="0.5",
                   BINLAKE_SNAPSHOT_POLL_S="0.2", BINLAKE_SNAPSHOT_CHUNK_BYTES=str(2 * 1024 * 1024))
    state = wait_until(lambda: (s := progress(nats_url, db, "blobs")) and s["state"] in ("done", "failed") and s, 120,
                       "the snapshot of the large rows")
    assert state["state"] == "done" and state["rows"] == 30, state
    assert state["chunks"] >= 8, state  # 2 MiB chunks of 600 KB rows, not one chunk of 30 rows
    msgs = snapshot_rows(read_stream_sync(nats_url), db, "blobs")
    got = {r["after"]["id"]: r["after"]["b"] for m in msgs for r in m.env["rows"]}
    assert got == {i: bytes([65 + i % 26]) * (1500000 if i % 10 == 0 else 600000) for i in range(1, 31)}
    refs = [m for m in read_stream_sync(nats_url, resolve=False) if "Binlake-Object" in m.headers]
    assert len(refs) == 3

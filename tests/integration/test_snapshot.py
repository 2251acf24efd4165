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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.integration.conftest import ParserFactory
from tests.integration.lake_stack import ServiceFactory, Stack, assert_verify_equal, services_answer
from tests.integration.support import (
    ROOT,
    ServiceProcess,
    StoredMsg,
    assert_table_order,
    read_stream_sync,
    row_changes,
    wait_until,
)
from tests.integration.test_parser_types import MATRIX, _insert_sql
from tests.servers import MariaDB

ROWS = 100_000
CHUNK = "2000"
# Rate-limited so the snapshot spans several seconds of the concurrent workload.
SNAPSHOT_ENV = {"BINLAKE_SNAPSHOT_CHUNK_ROWS": CHUNK, "BINLAKE_SNAPSHOT_POLL_S": "0.2",
                "BINLAKE_SNAPSHOT_MAX_ROWS_S": "12000"}


def snapshot_cli(nats_url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {"BINLAKE_NATS_URL": nats_url, "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "services.cli", "snapshot", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def snapshot_rows(msgs: list[StoredMsg], db: str, table: str) -> list[StoredMsg]:
    return [m for m in msgs if m.env.get("db") == db and m.env.get("table") == table and m.env["op"] == "r"]


def test_snapshot_rows_equal_binlog_rows_for_every_type(mariadb: MariaDB, database: str, parser: ServiceProcess,
                                                        nats_url: str, tmp_path: Path) -> None:
    """The same rows read by SELECT and decoded from the binlog are identical, schema included."""
    db = database
    cols = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(MATRIX))
    mariadb.execute(f"CREATE TABLE `{db}`.types (id INT PRIMARY KEY, touched INT NOT NULL DEFAULT 0, {cols})")
    conn = mariadb.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        for stmt in _insert_sql(db):
            cur.execute(stmt)
    conn.close()
    inserted = wait_until(lambda: (m := row_changes(read_stream_sync(nats_url), db)) and
                          sum(len(x.env["rows"]) for x in m) >= len(_insert_sql(db)) and m, 30, "the inserts")
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


def replay_all(msgs: list[StoredMsg], db: str, table: str, key: Callable[[dict[str, Any]], Any]) -> dict[Any, dict]:
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


def by_id(row: dict[str, Any]) -> Any:
    return row["id"]


def big_source(mariadb: MariaDB, db: str) -> dict[int, tuple]:
    return {r[0]: (r[1], r[2], str(r[3]), r[4].isoformat(timespec="microseconds"))
            for r in mariadb.query(f"SELECT id, grp, v, amount, at FROM `{db}`.big")}


def big_replayed(msgs: list[StoredMsg], db: str) -> dict[int, tuple]:
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
    rate: float = 400.0  # statements per second
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
    import asyncio

    import nats as nats_py

    from shared.snapshots import table_key

    async def read() -> dict[str, Any] | None:
        nc = await nats_py.connect(nats_url)
        try:
            kv = await nc.jetstream().key_value("binlake_cursors")
            try:
                return json.loads((await kv.get(table_key("main", db, table))).value or b"null")
            except Exception:
                return None
        finally:
            await nc.close()

    return asyncio.run(read())


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
    stack.wait_loaded(max(m.seq for m in msgs))
    assert loader.running
    assert_verify_equal(spark, stack, ["big"])
    return msgs


# -- consistency under writes -------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_snapshot_under_writes_all_over_the_key_range_equals_the_source(spark: SparkSession,
                                                                       lake_stack: SnapshotStack) -> None:
    stack = lake_stack
    create_big(stack.mariadb, stack.db)
    workload = KeyRangeWorkload(stack.mariadb, stack.db, alter_at=1500).start()
    time.sleep(1)
    done = snapshot_cli(stack.nats_url, f"{stack.db}.big", timeout=600)
    workload.finish()
    assert done.returncode == 0, done.stderr
    assert workload.alter_at == 0, "the ALTER TABLE did not happen during the snapshot"
    state = progress(stack.nats_url, stack.db, "big")
    assert state is not None and state["state"] == "done" and state["key_kind"] == "primary"
    assert state["chunks"] >= ROWS // int(CHUNK)
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
        wait_until(lambda at=at: ((progress(stack.nats_url, stack.db, "big") or {}).get("chunks", 0) >= at), 300,
                   f"{at} finished chunks", interval=0.1)
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

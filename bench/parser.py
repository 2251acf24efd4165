#!/usr/bin/env python
"""Parser benchmark: bare mysql-replication loop vs. `python -m services.parser`.

Starts a private MariaDB or MySQL (`--source`) and nats-server (tests/servers.py), writes N row changes
(inserts/updates/deletes, multi-row statements, 3 tables of mixed types), then on that
same binlog range runs alternately

  (a) the bare mysql-replication loop, touching every value of every row, and
  (b) the binlake parser as a subprocess publishing to a fresh BINLAKE_RAW (own prefix),

and reports rows/s of both, their ratio, message statistics, and the commit-to-message
latency of single-row transactions with the parser caught up. Exits non-zero when the
parser's output does not hold exactly the N row changes written.

The workload is the same on both servers, so their figures compare.

    python3 -m bench.parser [--source mariadb|mysql] [--rows 200000] [--runs 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import resource
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import HeartbeatLogEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from bench.common import (
    POLL_S,
    ROOT,
    TableState,
    arguments,
    connect_js,
    log_summary,
    percentile,
    proc_cpu,
    run_in_workdir,
    tail,
)
from services.launcher.processes import clean_env, spawn, stop_all
from services.launcher.servers import MariaDB, NatsServer, start_mariadb, start_mysql, start_nats
from shared import envelope
from shared.mysql import binlog_status_sql
from shared.subjects import Names

DB = "bench"
SOURCE = "main"
TABLES = ("t_wide", "t_bin", "t_narrow")
LAT_TABLE = "t_lat"
PLAN = (("i", 200), ("u", 80), ("d", 40))  # per table per transaction
SERVERS: dict[str, Callable[[Path], MariaDB]] = {"mariadb": start_mariadb, "mysql": start_mysql}
GTID_SQL = {"mariadb": "SELECT @@gtid_binlog_pos", "mysql": "SELECT @@gtid_executed"}
CHECK_COLUMN = {"t_wide": "a", "t_bin": "n", "t_narrow": "v"}  # int columns replayed and compared

DDL = (
    f"CREATE DATABASE {DB} CHARACTER SET utf8mb4",
    f"""CREATE TABLE {DB}.t_wide (id INT PRIMARY KEY, a BIGINT NOT NULL, b INT UNSIGNED,
        d DECIMAL(14,4), s VARCHAR(64), dt DATETIME(6), ts TIMESTAMP(3) NULL DEFAULT NULL, doc TEXT)""",
    f"""CREATE TABLE {DB}.t_bin (id INT PRIMARY KEY, n INT NOT NULL, bl BLOB, bn BINARY(8),
        e ENUM('red','green','blue'), st SET('a','b','c','d'), bt BIT(12), tm TIME(3), y YEAR, dbl DOUBLE)""",
    f"CREATE TABLE {DB}.t_narrow (id INT PRIMARY KEY, v INT NOT NULL)",
    f"CREATE TABLE {DB}.{LAT_TABLE} (id INT PRIMARY KEY, v INT NOT NULL)",
)
INSERT_SQL = {
    "t_wide": "INSERT INTO t_wide (id,a,b,d,s,dt,ts,doc) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
    "t_bin": "INSERT INTO t_bin (id,n,bl,bn,e,st,bt,tm,y,dbl) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
    "t_narrow": "INSERT INTO t_narrow (id,v) VALUES (%s,%s)",
}
UPDATE_SQL = {
    "t_wide": "UPDATE t_wide SET a=a+1, d=d+0.0001, s=CONCAT('u', id, '-', a), dt=dt + INTERVAL 1 SECOND, "
              "ts=COALESCE(ts, '2024-01-01 00:00:00.001') + INTERVAL 1 SECOND WHERE id BETWEEN %s AND %s",
    "t_bin": "UPDATE t_bin SET n=n+1, dbl=dbl*1.5+1, e=ELT(1+(n MOD 3),'red','green','blue'), "
             "st=IF(st='', 'a,c', ''), bt=bt ^ 5, tm=ADDTIME(tm, '00:00:01.5'), "
             "y=IF(y IS NULL OR y>=2155, 1901, y+1) WHERE id BETWEEN %s AND %s",
    "t_narrow": "UPDATE t_narrow SET v=v+1 WHERE id BETWEEN %s AND %s",
}


# ----------------------------------------------------------------------------- data types


@dataclass(frozen=True, order=True)
class BinlogPos:
    """A binlog position; ordered by (file, offset)."""

    file: str
    offset: int

    def __str__(self) -> str:
        """`file:offset`."""
        return f"{self.file}:{self.offset}"


@dataclass
class Workload:
    """What was written: exact row changes and the binlog range holding them."""

    rows: int = 0
    by_op: Counter[str] = field(default_factory=Counter)
    changes: list[tuple[str, str, int, int]] = field(default_factory=list)  # (table, op, lo, hi)
    transactions: int = 0
    statements: int = 0
    seconds: float = 0.0
    start: BinlogPos = BinlogPos("", 0)
    end: BinlogPos = BinlogPos("", 0)
    gtid_before: str = ""

    def expected(self) -> Counter[tuple[str, str, int]]:
        """Every (table, op, id) change, with multiplicity."""
        out: Counter[tuple[str, str, int]] = Counter()
        for table, op, lo, hi in self.changes:
            out.update((table, op, i) for i in range(lo, hi + 1))
        return out


@dataclass
class RunResult:
    """One measured run of (a) or (b)."""

    name: str
    rows: int
    seconds: float
    wall_s: float = 0.0
    first_rows_s: float = 0.0
    cpu_s: float = 0.0
    nats_cpu_s: float = 0.0
    messages: int = 0
    row_messages: int = 0
    values: int = 0
    log: Path | None = None

    @property
    def rate(self) -> float:
        """Rows per second of the measured interval."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Scan:
    """What one pass over a BINLAKE_RAW stream found."""

    messages: int = 0
    row_messages: int = 0
    header_rows: int = 0
    by_op: Counter[str] = field(default_factory=Counter)
    keys: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    snapshot: dict[tuple[str, int], Any] = field(default_factory=dict)
    start_ts: float = 0.0  # the parser's start-up heartbeat (stored right before it opens the binlog)
    first_ts: float = 0.0  # first rows message
    last_ts: float = 0.0  # last rows message


# ----------------------------------------------------------------------------- workload


def wide_row(rng: random.Random, i: int) -> tuple[Any, ...]:
    """A t_wide row: ints, unsigned, decimal, varchar, datetime(6), timestamp(3), JSON-ish text."""
    when = dt.datetime(2020, 1, 1) + dt.timedelta(seconds=rng.randint(0, 10**8), microseconds=rng.randint(0, 999_999))
    stamp = None if rng.random() < 0.2 else dt.datetime(2001, 1, 1) + dt.timedelta(
        seconds=rng.randint(0, 9 * 10**8), milliseconds=rng.randint(0, 999))
    doc = json.dumps({"id": i, "score": rng.random(), "tags": rng.sample(["x", "y", "zé", "漢字", "q"], 2),
                      "note": "n" * rng.randint(0, 80)}, ensure_ascii=False)
    dec = Decimal(f"{rng.randint(-10**9, 10**9)}.{rng.randint(0, 9999):04d}")
    unsigned = None if rng.random() < 0.1 else rng.randint(0, 2**32 - 1)
    return (i, rng.randint(-(2**62), 2**62), unsigned, dec, f"name-{i}-" + "x" * rng.randint(0, 40), when, stamp, doc)


def bin_row(rng: random.Random, i: int) -> tuple[Any, ...]:
    """A t_bin row: blob, binary(8), enum, set, bit(12), time(3) (also negative), year, double."""
    blob = None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 200))
    sign = "-" if rng.random() < 0.3 else ""
    tm = f"{sign}{rng.randint(0, 837)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}"
    members = ",".join(sorted(rng.sample("abcd", rng.randint(0, 4))))
    return (i, rng.randint(0, 1000), blob, rng.randbytes(rng.randint(1, 8)), rng.choice(["red", "green", "blue", None]),
            members, rng.randint(0, 4095), tm, rng.choice([None, 0, 1901, 2024, 2155]), rng.uniform(-1e9, 1e9))


def narrow_row(rng: random.Random, i: int) -> tuple[Any, ...]:
    """A t_narrow row."""
    return (i, rng.randint(-(10**9), 10**9))


ROW_MAKERS: dict[str, Callable[[random.Random, int], tuple[Any, ...]]] = {
    "t_wide": wide_row, "t_bin": bin_row, "t_narrow": narrow_row,
}


def apply_op(cur: Any, rng: random.Random, table: str, op: str, lo: int, hi: int) -> int:
    """Run one multi-row statement; return the rows it affected."""
    if op == "i":
        cur.executemany(INSERT_SQL[table], [ROW_MAKERS[table](rng, i) for i in range(lo, hi + 1)])
        return int(cur.rowcount)
    if op == "u":
        return int(cur.execute(UPDATE_SQL[table], (lo, hi)))
    return int(cur.execute(f"DELETE FROM {table} WHERE id BETWEEN %s AND %s", (lo, hi)))


def server_version(db: MariaDB) -> str:
    """SELECT VERSION()."""
    return str(db.query("SELECT VERSION()")[0][0])


def binlog_status(db: MariaDB) -> BinlogPos:
    """The binlog file and position being written (MySQL 8.4+ has no SHOW MASTER STATUS)."""
    row = db.query(binlog_status_sql(server_version(db)))[0]
    return BinlogPos(str(row[0]), int(row[1]))


def write_workload(db: MariaDB, n: int, seed: int = 42) -> Workload:
    """Write exactly n row changes in transactions; record the binlog range around them."""
    db.execute(*DDL)
    gtid_before = str(db.query(GTID_SQL[db.kind])[0][0]).replace("\n", "")
    wl = Workload(start=binlog_status(db), gtid_before=gtid_before)
    rng, states = random.Random(seed), {t: TableState() for t in TABLES}
    conn = db.connect(database=DB, autocommit=False)
    t0 = time.perf_counter()
    try:
        with conn.cursor() as cur:
            while wl.rows < n:
                conn.begin()
                for table in TABLES:
                    for op, size in PLAN:
                        k = min(size, n - wl.rows)
                        if k <= 0:
                            break
                        lo, hi = states[table].take(op, k)
                        affected = apply_op(cur, rng, table, op, lo, hi)
                        if affected != hi - lo + 1:
                            raise RuntimeError(f"{op} {table} {lo}..{hi} affected {affected} rows")
                        wl.rows += affected
                        wl.by_op[op] += affected
                        wl.changes.append((table, op, lo, hi))
                        wl.statements += 1
                conn.commit()
                wl.transactions += 1
    finally:
        conn.close()
    wl.seconds = time.perf_counter() - t0
    wl.end = binlog_status(db)
    return wl


# ----------------------------------------------------------------------------- (a) baseline


def touch(row: dict[str, Any]) -> int:
    """Read every value of a mysql-replication row; return how many there were."""
    n = 0
    for key in ("values", "before_values", "after_values"):
        image = row.get(key)
        if image is not None:
            for _value in image.values():
                n += 1
    return n


def run_baseline(db: MariaDB, wl: Workload, server_id: int) -> RunResult:
    """The bare mysql-replication loop over [start, end): decode and touch every row."""
    settings = {"host": db.host, "port": db.port, "user": "root", "passwd": ""}
    t0 = time.perf_counter()
    # File and position on both servers, so both runs take the same path through mysql-replication
    # (is_mariadb=True would switch to MariaDB's GTID dump, which ignores log_file/log_pos).
    stream = BinLogStreamReader(
        connection_settings=settings, server_id=server_id, blocking=True, is_mariadb=False,
        log_file=wl.start.file, log_pos=wl.start.offset, resume_stream=True, slave_heartbeat=1.0,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, HeartbeatLogEvent], enable_logging=False,
    )
    rows = values = 0
    try:
        for event in stream:
            for row in getattr(event, "rows", ()):
                values += touch(row)
                rows += 1
            if rows >= wl.rows or BinlogPos(stream.log_file, stream.log_pos) >= wl.end:
                break
    finally:
        stream.close()
    seconds = time.perf_counter() - t0
    return RunResult("a", rows, seconds, wall_s=seconds, values=values)


# ----------------------------------------------------------------------------- (b) binlake parser


def parser_env(db: MariaDB, nats_url: str, prefix: str, start: str) -> dict[str, str]:
    """Environment of one parser process (no inherited BINLAKE_* settings)."""
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(BINLAKE_SOURCE_URL=db.dsn(), BINLAKE_NATS_URL=nats_url, BINLAKE_PREFIX=prefix,
               BINLAKE_START=start, BINLAKE_SOURCE=SOURCE, BINLAKE_METRICS_PORT="-1")
    return env


@contextlib.contextmanager
def parser_process(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `python -m services.parser` with output to `log`; SIGTERM (then SIGKILL) on exit."""
    proc = spawn("services.parser", env, log)
    try:
        yield proc
    finally:
        stop_all([proc])


def decode(data: bytes) -> dict[str, Any]:
    """A binlake envelope as a dict."""
    return envelope.as_dict(envelope.decode(data))


async def last_envelope(js: JetStreamContext, prefix: str) -> dict[str, Any] | None:
    """The newest envelope of the prefix's raw stream, or None while there is none."""
    try:
        msg = await js.get_last_msg(Names(prefix).raw_stream, Names(prefix).raw_all)
    except (nats.js.errors.NotFoundError, nats.errors.TimeoutError):
        return None
    return decode(msg.data) if msg.data else None


async def wait_caught_up(js: JetStreamContext, prefix: str, end: BinlogPos, proc: subprocess.Popen[bytes],
                         log: Path, limit_s: float) -> float:
    """Poll until the stream's last message resumes at or after `end`; return that wall time."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"parser exited with code {proc.returncode}; log tail:\n{tail(log)}")
        env = await last_envelope(js, prefix)
        if env is not None and env["txn"]["last"]:
            resume = env["resume"]
            if BinlogPos(resume["file"], int(resume["offset"])) >= end:
                return time.time()
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"parser did not reach {end} within {limit_s:.0f}s; log tail:\n{tail(log)}")


def record(scan: Scan, env: dict[str, Any], stored: float) -> None:
    """Add one rows message to a scan: keys, op counts, replayed check column, timing."""
    table, op = env["table"], env["op"]
    check = CHECK_COLUMN.get(table)
    for row in env["rows"]:
        image = row.get("after") or row["before"]
        key = (table, image["id"])
        scan.keys[(table, op, image["id"])] += 1
        if op == "d":
            scan.snapshot.pop(key, None)
        elif check is not None:
            scan.snapshot[key] = image[check]
    scan.by_op[op] += len(env["rows"])
    scan.row_messages += 1
    scan.first_ts = scan.first_ts or stored
    scan.last_ts = stored


def scan_message(scan: Scan, msg: Msg) -> None:
    """Add one stored raw message to a scan."""
    stored = msg.metadata.timestamp.timestamp()
    scan.messages += 1
    env = decode(msg.data)
    if env["op"] == "hb" and not scan.start_ts:
        scan.start_ts = stored
    if env["op"] in ("i", "u", "d"):
        scan.header_rows += int((msg.headers or {}).get("Binlake-Rows", "0"))
        record(scan, env, stored)


async def scan_stream(js: JetStreamContext, prefix: str) -> Scan:
    """Read the whole raw stream in order (ephemeral pull consumer, gap-checked) and collect it."""
    stream = f"{prefix.upper()}_RAW"
    last_seq, scan = (await js.stream_info(stream)).state.last_seq, Scan()
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, mem_storage=True,
                            inactive_threshold=60.0)
    sub = await js.pull_subscribe(Names(prefix).raw_all, stream=stream, config=config)
    try:
        expected_seq = 1
        while expected_seq <= last_seq:
            for msg in await sub.fetch(500, timeout=10):
                seq = msg.metadata.sequence.stream
                if seq != expected_seq:
                    raise RuntimeError(f"scan of {stream} got seq {seq}, expected {expected_seq}")
                scan_message(scan, msg)
                expected_seq += 1
    finally:
        await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_consumer(stream, config.name or "")
    return scan


async def run_parser(db: MariaDB, ns: NatsServer, js: JetStreamContext, wl: Workload, prefix: str,
                     log: Path) -> tuple[RunResult, Scan]:
    """Run the parser from the earliest binlog into a fresh stream until it has published `wl`."""
    timeout = max(180.0, wl.rows / 300)
    usage0, nats_cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN), proc_cpu(ns.proc.pid if ns.proc else 0)
    t0 = time.time()
    with parser_process(parser_env(db, ns.url, prefix, "earliest"), log) as proc:
        done = await wait_caught_up(js, prefix, wl.end, proc, log, timeout)
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    scan = await scan_stream(js, prefix)
    result = RunResult("b", scan.by_op.total(), scan.last_ts - scan.start_ts, wall_s=done - t0, log=log,
                       first_rows_s=scan.last_ts - scan.first_ts,
                       cpu_s=(usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime),
                       nats_cpu_s=proc_cpu(ns.proc.pid if ns.proc else 0) - nats_cpu0,
                       messages=scan.messages, row_messages=scan.row_messages)
    return result, scan


# ----------------------------------------------------------------------------- correctness


def verify(db: MariaDB, wl: Workload, scan: Scan) -> list[str]:
    """Differences between what was written and what the stream holds (empty when exact)."""
    problems: list[str] = []
    expected = wl.expected()
    missing, extra = expected - scan.keys, scan.keys - expected
    if missing:
        problems.append(f"{missing.total()} row changes missing, e.g. {sorted(missing)[:10]}")
    if extra:
        problems.append(f"{extra.total()} unexpected/duplicate row changes, e.g. {sorted(extra)[:10]}")
    if scan.header_rows != scan.by_op.total():
        problems.append(f"Binlake-Rows headers sum to {scan.header_rows}, bodies hold {scan.by_op.total()} rows")
    for table, column in CHECK_COLUMN.items():
        source = {(table, int(i)): v for i, v in db.query(f"SELECT id, {column} FROM {DB}.{table}")}
        replayed = {k: v for k, v in scan.snapshot.items() if k[0] == table}
        if source != replayed:
            bad = sorted(k for k in source.keys() | replayed.keys() if source.get(k) != replayed.get(k))
            problems.append(f"{table}.{column} replayed from the stream differs from the source at "
                            f"{len(bad)} ids, e.g. {[(k, source.get(k), replayed.get(k)) for k in bad[:5]]}")
    return problems


def paced_inserts(db: MariaDB, ids: range, rate: float) -> dict[int, float]:
    """One single-row transaction per id at `rate`/s; return the wall time each COMMIT was sent."""
    conn = db.connect(database=DB, autocommit=False)
    commits: dict[int, float] = {}
    t0 = time.monotonic()
    try:
        with conn.cursor() as cur:
            for n, i in enumerate(ids):
                delay = t0 + n / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                conn.begin()
                cur.execute(f"INSERT INTO {LAT_TABLE} (id, v) VALUES (%s, %s)", (i, n))
                commits[i] = time.time()
                conn.commit()
    finally:
        conn.close()
    return commits


async def wait_for(pred: Callable[[], bool], limit_s: float, what: str) -> None:
    """Poll `pred` every POLL_S until true; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL_S)


async def measure_latency(db: MariaDB, js: JetStreamContext, prefix: str, count: int, rate: float) -> list[float]:
    """Commit-to-message latency (ms) of `count` single-row transactions, matched by primary key."""
    arrivals: dict[int, float] = {}

    async def on_msg(msg: Msg) -> None:
        """Note when each latency row's message arrived."""
        now = time.time()
        env = decode(msg.data)
        if env.get("table") == LAT_TABLE and env["op"] == "i":
            for row in env["rows"]:
                arrivals[row["after"]["id"]] = now

    config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.NEW, mem_storage=True)
    sub = await js.subscribe(Names(prefix).raw_all, cb=on_msg, config=config)
    try:
        # Warm-up row: the binlog connection is open and the path is hot before measuring.
        await asyncio.to_thread(paced_inserts, db, range(1, 2), rate)
        await wait_for(lambda: 1 in arrivals, 60, "the warm-up row")
        ids = range(1000, 1000 + count)
        commits = await asyncio.to_thread(paced_inserts, db, ids, rate)
        await wait_for(lambda: all(i in arrivals for i in ids), 60, f"{count} latency rows")
    finally:
        await sub.unsubscribe()
    return sorted((arrivals[i] - commits[i]) * 1000 for i in ids)


async def latency_phase(db: MariaDB, ns: NatsServer, js: JetStreamContext, log: Path, count: int,
                        rate: float) -> list[float]:
    """Start a parser at the current position (fresh prefix), let it settle, measure latency."""
    prefix = "benchlat"
    with parser_process(parser_env(db, ns.url, prefix, "current"), log) as proc:
        await wait_for(lambda: proc.poll() is not None or log.stat().st_size > 0, 60, "parser start")
        for _ in range(int(60 / POLL_S)):
            if proc.poll() is not None:
                raise RuntimeError(f"latency parser exited with code {proc.returncode}:\n{tail(log)}")
            if await last_envelope(js, prefix) is not None:
                break
            await asyncio.sleep(POLL_S)
        return await measure_latency(db, js, prefix, count, rate)


def print_workload(wl: Workload, db: MariaDB, nats_version: str) -> None:
    """Versions and what was written."""
    print(f"{db.kind + ' version':<21}: {server_version(db)}")
    print(f"nats-server version  : {nats_version}")
    print(f"python               : {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    ops = ", ".join(f"{op}={wl.by_op[op]}" for op in ("i", "u", "d"))
    print(f"workload             : {wl.rows} row changes ({ops}) in {wl.transactions} transactions, "
          f"{wl.statements} statements, written in {wl.seconds:.1f}s")
    print(f"binlog range         : {wl.start} .. {wl.end} ({wl.end.offset - wl.start.offset} bytes if one file), "
          f"GTIDs before: {wl.gtid_before!r}")


def print_runs(runs: list[RunResult]) -> None:
    """One line per measured run."""
    for r in runs:
        if r.name == "a":
            print(f"  (a) mysql-replication : {r.rows} rows, {r.seconds:.2f}s, {r.rate:,.0f} rows/s "
                  f"({r.values} values touched)")
        else:
            print(f"  (b) binlake parser    : {r.rows} rows, start heartbeat->last rows msg {r.seconds:.2f}s = "
                  f"{r.rate:,.0f} rows/s; first->last rows msg {r.first_rows_s:.2f}s; wall incl. process start "
                  f"{r.wall_s:.2f}s = {r.rows / r.wall_s:,.0f} rows/s; {r.messages} msgs; "
                  f"CPU parser {r.cpu_s:.1f}s, nats-server {r.nats_cpu_s:.1f}s")


def print_summary(runs: list[RunResult], latencies: list[float]) -> None:
    """Best of each side, ratio, message statistics, latency percentiles."""
    best_a = max((r for r in runs if r.name == "a"), key=lambda r: r.rate)
    best_b = max((r for r in runs if r.name == "b"), key=lambda r: r.rate)
    print(f"rows                 : {best_b.rows}")
    print(f"(a) rows/s (best)    : {best_a.rate:,.0f}")
    print(f"(b) rows/s (best)    : {best_b.rate:,.0f}  (wall incl. process start: {best_b.rows / best_b.wall_s:,.0f})")
    print(f"ratio b/a            : {best_b.rate / best_a.rate:.3f}  (wall-based: "
          f"{best_b.rows / best_b.wall_s / best_a.rate:.3f})")
    print(f"messages             : {best_b.messages} total, {best_b.row_messages} with rows")
    print(f"avg rows per message : {best_b.rows / max(1, best_b.row_messages):.1f}")
    p = [percentile(latencies, q) for q in (50, 95, 99)]
    print(f"latency commit->msg  : n={len(latencies)} p50={p[0]:.1f} ms p95={p[1]:.1f} ms p99={p[2]:.1f} ms "
          f"max={latencies[-1] if latencies else float('nan'):.1f} ms")


async def measure(db: MariaDB, ns: NatsServer, wl: Workload, args: argparse.Namespace,
                  logs: Path) -> tuple[list[RunResult], list[float], list[str]]:
    """Runs a, b alternately; then the latency phase. Returns runs, latencies, problems."""
    nc, js = await connect_js(ns.url)
    runs: list[RunResult] = []
    problems: list[str] = []
    try:
        for k in range(1, args.runs + 1):
            runs.append(run_baseline(db, wl, server_id=900_000 + k))
            print_runs(runs[-1:])
            result, scan = await run_parser(db, ns, js, wl, f"bench{k}", logs / f"parser-bench{k}.log")
            runs.append(result)
            print_runs(runs[-1:])
            problems += [f"run b{k}: {p}" for p in verify(db, wl, scan)]
        latencies = await latency_phase(db, ns, js, logs / "parser-latency.log", args.lat_count, args.lat_rate)
    finally:
        await nc.close()
    return runs, latencies, problems


def report_logs(logs: Path) -> None:
    """Print the non-info lines of every parser log."""
    for log in sorted(logs.glob("parser-*.log")):
        lines = log_summary(log)
        print(f"parser log {log.name}: {'no warnings/errors' if not lines else ''}")
        for line in lines:
            print(f"    {line}")


def run(args: argparse.Namespace, workdir: Path) -> int:
    """Start the servers, write the workload, measure, report; stop the servers always."""
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    db = SERVERS[args.source](workdir / args.source)
    ns: NatsServer | None = None
    try:
        ns = start_nats(workdir / "nats")
        nats_version = subprocess.run([ns.args[0], "--version"], capture_output=True, text=True).stdout.strip()
        print_workload(wl := write_workload(db, args.rows), db, nats_version)
        runs, latencies, problems = asyncio.run(measure(db, ns, wl, args, logs))
        print("---- summary")
        print_summary(runs, latencies)
        report_logs(logs)
        if wl.rows != args.rows:
            problems.append(f"workload wrote {wl.rows} rows, asked for {args.rows}")
        for p in problems:
            print(f"CORRECTNESS: {p}")
        return 1 if problems else 0
    finally:
        if ns is not None:
            ns.stop()
        db.stop()


def main() -> None:
    """Parse arguments and run in a temporary (or given) work directory."""
    ap = arguments(__doc__, "keep servers' files and parser logs here (default: temp, removed)")
    ap.add_argument("--source", choices=sorted(SERVERS), default="mariadb",
                    help="the server whose binlog is read (default mariadb)")
    ap.add_argument("--rows", type=int, default=200_000, help="row changes to write (default 200000)")
    ap.add_argument("--runs", type=int, default=2, help="alternating (a, b) pairs (default 2)")
    ap.add_argument("--lat-count", type=int, default=500, help="single-row transactions in the latency phase")
    ap.add_argument("--lat-rate", type=float, default=200.0, help="their rate per second")
    run_in_workdir(run, ap.parse_args(), "binlake-bench-")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""End to end: how many row changes per second binlake carries from a commit into the lake.

Runs the whole stack as `binlake up` runs it (a durable private MariaDB and nats-server; meta,
store, parser, two sink workers and the Spark loader, each a process with `binlake up`'s
environment). `--writers` threads (own connections, two tables each) drive 8 tables with
transactions of 1-50 rows (inserts, updates, deletes; one table per transaction) at
increasing target rates, each held for `--step-s` seconds. Every transaction's commit time is
kept; two readers follow BINLAKE_RAW and BINLAKE_CDC (headers only: the row counts are there)
and the loader's `loader_committed_seq` metric (polled every 0.25 s) says what the lake holds.

Per step it prints the achieved source rate, the lag of BINLAKE_RAW, BINLAKE_CDC and the lake
behind the source at the end of the step (the age of the oldest transaction not there yet:
RAW lag is the parser's, CDC minus RAW the sink's), CPU per process, and whether the step is
sustainable: the source reached its target and neither lag grew over the step. It stops after
the first step that is not (`--all` runs them all). Then freshness commit -> CDC and commit ->
lake (p50/p99) at the first step, the highest sustainable rate, and `ratio` = that rate / the
source's own bulk write rate (1,000-row INSERTs, measured first in the same run and server).

    python3 -m bench.e2e [--rates 1000 2000 ...] [--step-s 30] [--writers 4] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import random
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import arguments, percentile, proc_cpu, run_in_workdir, tail
from services.launcher import login, source
from services.launcher.app import DURABLE, child_env, services
from services.launcher.config import LauncherConfig
from services.launcher.processes import spawn, stop_all
from services.launcher.servers import MariaDB, free_port, start_mariadb, start_nats
from services.ops import init
from shared import jetstream
from shared.config import NatsSettings
from shared.ordered_reader import OrderedReader
from shared.subjects import Names

DB = "e2e"
TABLES = [f"t{i}" for i in range(8)]
BULK_ROWS = 200_000
POLL_S = 0.25


@dataclass
class Table:
    """One source table as the writer left it, and where its changes have got to."""

    name: str
    live: list[int] = field(default_factory=list)  # ids that exist now
    next_id: int = 1
    commits: list[tuple[int, float]] = field(default_factory=list)  # (rows so far, commit time)
    raw: list[tuple[int, int, float]] = field(default_factory=list)  # (RAW seq, rows so far, arrival time)
    cdc: list[tuple[int, int, float]] = field(default_factory=list)  # (CDC seq, rows so far, arrival time)


@dataclass
class Step:
    target: float
    start: float
    end: float = 0.0
    rows: int = 0
    raw_lag: list[tuple[float, float]] = field(default_factory=list)  # (time, lag s)
    cdc_lag: list[tuple[float, float]] = field(default_factory=list)
    lake_lag: list[tuple[float, float]] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def achieved(self) -> float:
        return self.rows / max(self.end - self.start, 1e-9)

    def growing(self, lags: list[tuple[float, float]], slack_s: float) -> bool:
        """Lag at the end of the step beyond the worst of its first half (plus slack)."""
        mid = self.start + (self.end - self.start) / 2
        first = [lag for t, lag in lags if t <= mid] or [0.0]
        last = [lag for t, lag in lags if t > self.end - (self.end - self.start) / 6] or [0.0]
        return max(last) > max(first) + slack_s

    @property
    def sustainable(self) -> bool:
        return (self.achieved >= 0.9 * self.target and not self.growing(self.cdc_lag, 2.0)
                and not self.growing(self.lake_lag, 10.0))


class Writer:
    """Paced transactions over its own tables from one connection (a thread: pymysql blocks)."""

    def __init__(self, mariadb: MariaDB, tables: list[Table], lock: threading.Lock, seed: int) -> None:
        self._conn = mariadb.connect(autocommit=False)
        self._tables = tables
        self._rnd = random.Random(seed)
        self.rate = 0.0
        self.first = list(tables)  # every table once before random ones
        self.rows = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.lock = lock

    def run(self) -> None:
        try:
            due = time.monotonic()
            while not self.stop.is_set():
                if self.rate <= 0:
                    time.sleep(0.05)
                    due = time.monotonic()
                    continue
                n = self._txn()
                due += n / self.rate
                ahead = due - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                elif ahead < -1.0:
                    due = time.monotonic() - 1.0  # behind: do not build up an unbounded burst
        except BaseException as exc:
            self.error = exc
        finally:
            self._conn.close()

    def _txn(self) -> int:
        t = self.first.pop() if self.first else self._rnd.choice(self._tables)
        n = self._rnd.randint(1, 50)
        kind = self._rnd.random()
        with self._conn.cursor() as cur:
            if kind < 0.6 or len(t.live) < 2 * n:
                ids = list(range(t.next_id, t.next_id + n))
                t.next_id += n
                cur.execute(f"INSERT INTO `{DB}`.`{t.name}` VALUES " + ", ".join(
                    f"({i}, {i % 997}, 'row-{i}', {i % 10000}.25, NOW(3))" for i in ids))
                t.live.extend(ids)
            elif kind < 0.9:
                ids = self._rnd.sample(t.live, n)
                cur.execute(f"UPDATE `{DB}`.`{t.name}` SET a = a + 1, d = NOW(3) "
                            f"WHERE id IN ({','.join(map(str, ids))})")
            else:
                idx = sorted(self._rnd.sample(range(len(t.live)), n), reverse=True)
                ids = [t.live[i] for i in idx]
                for i in idx:
                    t.live[i] = t.live[-1]
                    t.live.pop()
                cur.execute(f"DELETE FROM `{DB}`.`{t.name}` WHERE id IN ({','.join(map(str, ids))})")
        self._conn.commit()
        now = time.time()
        with self.lock:
            done = (t.commits[-1][0] if t.commits else 0) + n
            t.commits.append((done, now))
            self.rows += n
        return n


class Writers:
    """`--writers` Writer threads, each with its own tables and connection (commits overlap, as
    an application's would: one connection alone is bound by the durable commit's fsync)."""

    def __init__(self, mariadb: MariaDB, tables: dict[str, Table], n: int) -> None:
        self.lock = threading.Lock()
        all_tables = list(tables.values())
        self._writers = [Writer(mariadb, all_tables[i::n], self.lock, seed=7 + i) for i in range(n)]
        self._threads = [threading.Thread(target=w.run, daemon=True) for w in self._writers]
        for t in self._threads:
            t.start()

    def set_rate(self, rows_s: float) -> None:
        for w in self._writers:
            w.rate = rows_s / len(self._writers)

    @property
    def rows(self) -> int:
        return sum(w.rows for w in self._writers)

    @property
    def error(self) -> BaseException | None:
        return next((w.error for w in self._writers if w.error is not None), None)

    def stop(self) -> None:
        for w in self._writers:
            w.stop.set()
        for t in self._threads:
            t.join(10)


def bulk_rate(mariadb: MariaDB) -> float:
    """The source's own write rate: 1,000-row INSERTs, one transaction each."""
    mariadb.execute("CREATE DATABASE IF NOT EXISTS e2e_bulk",
                    "CREATE TABLE e2e_bulk.t (id BIGINT PRIMARY KEY, a INT, b VARCHAR(40), c DECIMAL(12,2), "
                    "d DATETIME(3))")
    conn = mariadb.connect(autocommit=False)
    started = time.monotonic()
    try:
        with conn.cursor() as cur:
            for lo in range(0, BULK_ROWS, 1000):
                cur.execute("INSERT INTO e2e_bulk.t VALUES " + ", ".join(
                    f"({i}, {i % 997}, 'row-{i}', {i % 10000}.25, NOW(3))" for i in range(lo, lo + 1000)))
                conn.commit()
    finally:
        conn.close()
    return BULK_ROWS / (time.monotonic() - started)


def oldest_missing(t: Table, arrived_rows: int, now: float) -> float:
    """Age of the oldest transaction of `t` beyond `arrived_rows` (0 when all are there)."""
    i = bisect.bisect_right(t.commits, (arrived_rows, float("inf")))
    return now - t.commits[i][1] if i < len(t.commits) else 0.0


def latencies(tables: dict[str, Table], since: float, until: float,
              arrival: dict[str, list[tuple[int, float]]]) -> list[float]:
    """Commit -> arrival (ms) of every transaction committed in [since, until)."""
    out: list[float] = []
    for t in tables.values():
        arr = arrival[t.name]
        for done, at in t.commits:
            if not since <= at < until:
                continue
            i = bisect.bisect_left(arr, (done, 0.0))
            if i < len(arr):
                out.append((arr[i][1] - at) * 1000)
    return sorted(out)


def loader_seq(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("binlake_loader_committed_seq "):
                    return int(float(line.split()[1]))
    except OSError:
        pass
    return 0


async def measure(args: argparse.Namespace, mariadb: MariaDB, nats_url: str, tables: dict[str, Table],
                  loader_port: int, pids: dict[str, int], auth: NatsSettings) -> list[Step]:
    names = Names()
    nc = await jetstream.connect(nats_url, "bench-e2e", auth=auth)
    js = nc.jetstream()
    lake: list[tuple[int, float]] = []  # (committed CDC seq, first seen)

    async def follow(stage: str, stream: str, subject: str) -> None:
        """Count each table's rows as they arrive in `stream` (headers only: the counts are there)."""
        reader = OrderedReader(js, stream, subject, 1, 1000, headers_only=True)
        try:
            while True:
                for msg in await reader.fetch(wait_s=0.2):
                    parts = msg.subject.split(".")
                    t = tables.get(parts[-1])
                    rows = int((msg.headers or {}).get("Binlake-Rows", 0))
                    if t is None or parts[-2] != DB or not rows:
                        continue
                    log = t.raw if stage == "raw" else t.cdc
                    log.append((msg.metadata.sequence.stream, (log[-1][1] if log else 0) + rows, time.time()))
        finally:
            await reader.close()

    followers = [asyncio.create_task(follow("raw", names.raw_stream, names.raw_all)),
                 asyncio.create_task(follow("cdc", names.cdc_stream, names.cdc_all))]
    writer = Writers(mariadb, tables, args.writers)
    loop = asyncio.get_running_loop()

    def lake_rows(t: Table) -> int:
        if not lake:
            return 0
        i = bisect.bisect_right(t.cdc, (lake[-1][0], 1 << 62, 0.0))
        return t.cdc[i - 1][1] if i else 0

    async def poll() -> tuple[float, float, float]:
        """How far RAW, CDC and the lake are behind the source (age of the oldest missing change, s)."""
        seq = await loop.run_in_executor(None, loader_seq, loader_port)
        now = time.time()
        if seq and (not lake or seq > lake[-1][0]):
            lake.append((seq, now))
        with writer.lock:
            raw = max(oldest_missing(t, t.raw[-1][1] if t.raw else 0, now) for t in tables.values())
            cdc = max(oldest_missing(t, t.cdc[-1][1] if t.cdc else 0, now) for t in tables.values())
            lk = max(oldest_missing(t, lake_rows(t), now) for t in tables.values())
        return raw, cdc, lk

    async def settle(timeout_s: float) -> None:
        """Until every table's changes so far are in BINLAKE_CDC and in the lake."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            _, cdc, lk = await poll()
            if cdc == 0 and lk == 0 and all(t.cdc for t in tables.values()):
                return
            await asyncio.sleep(POLL_S)
        raise SystemExit(f"the lake did not catch up within {timeout_s:.0f} s (CDC lag {cdc:.1f} s, lake {lk:.1f} s)")

    steps: list[Step] = []
    try:
        # Warm-up: the lake creates its tables (slow: Iceberg metadata, Spark's first jobs) untimed.
        writer.set_rate(200.0)
        await asyncio.sleep(5)
        writer.set_rate(0.0)
        await settle(600)
        for target in args.rates:
            step = Step(float(target), time.time())
            cpu0 = {n: proc_cpu(p) for n, p in pids.items()}
            rows0 = writer.rows
            writer.set_rate(float(target))
            while time.time() < step.start + args.step_s:
                await asyncio.sleep(POLL_S)
                if writer.error is not None:
                    raise writer.error
                raw, cdc, lk = await poll()
                step.raw_lag.append((time.time(), raw))
                step.cdc_lag.append((time.time(), cdc))
                step.lake_lag.append((time.time(), lk))
            step.end = time.time()
            step.rows = writer.rows - rows0
            step.cpu = {n: (proc_cpu(p) - cpu0[n]) / (step.end - step.start) for n, p in pids.items()}
            steps.append(step)
            print(report_line(step), flush=True)
            if not step.sustainable and not args.all:
                break
        writer.set_rate(0.0)
        # Let the last transactions arrive, for the freshness figures.
        deadline = time.time() + args.drain_s
        while time.time() < deadline:
            _, cdc, lk = await poll()
            if cdc == 0 and lk == 0:
                break
            await asyncio.sleep(POLL_S)
    finally:
        writer.stop()
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        await nc.close()
    first = steps[0]
    cdc_arrival = {t.name: [(done, at) for _, done, at in t.cdc] for t in tables.values()}
    lake_arrival: dict[str, list[tuple[int, float]]] = {}
    for t in tables.values():
        arr: list[tuple[int, float]] = []
        for seq, at in lake:
            i = bisect.bisect_right(t.cdc, (seq, 1 << 62, 0.0))
            if i and (not arr or t.cdc[i - 1][1] > arr[-1][0]):
                arr.append((t.cdc[i - 1][1], at))
        lake_arrival[t.name] = arr
    fresh_cdc = latencies(tables, first.start, first.end, cdc_arrival)
    fresh_lake = latencies(tables, first.start, first.end, lake_arrival)
    print(f"freshness at {first.target:,.0f} rows/s: commit -> BINLAKE_CDC p50 {percentile(fresh_cdc, 50):,.0f} ms "
          f"p99 {percentile(fresh_cdc, 99):,.0f} ms (n={len(fresh_cdc)}); commit -> lake p50 "
          f"{percentile(fresh_lake, 50):,.0f} ms p99 {percentile(fresh_lake, 99):,.0f} ms (n={len(fresh_lake)})")
    return steps


def report_line(s: Step) -> str:
    cpu = " ".join(f"{n} {v:.0%}" for n, v in sorted(s.cpu.items(), key=lambda kv: -kv[1]))
    return (f"target {s.target:>7,.0f} rows/s: achieved {s.achieved:>7,.0f}; lag at end RAW {s.raw_lag[-1][1]:5.1f} s, "
            f"CDC {s.cdc_lag[-1][1]:5.1f} s "
            f"(max {max(lag for _, lag in s.cdc_lag):5.1f}), lake {s.lake_lag[-1][1]:5.1f} s "
            f"(max {max(lag for _, lag in s.lake_lag):5.1f}); {'sustainable' if s.sustainable else 'NOT sustainable'}"
            f"\n    CPU: {cpu}")


def wait_for_loader(log: Path, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the loader exited:\n{tail(log)}")
        if '"loader.start"' in log.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise SystemExit(f"the loader did not start in {timeout_s:.0f} s:\n{tail(log)}")


def run(args: argparse.Namespace, workdir: Path) -> int:
    mariadb = start_mariadb(workdir / "mariadb", extra_args=DURABLE)
    cfg = LauncherConfig(data_dir=str(workdir / "data"), sinks=2)
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    # The services' own users, as `binlake up` runs them: the permission checks are part of the cost.
    nats = start_nats(workdir / "nats", extra_args=["-c", str(login.server_config(workdir / "data", Names()))])
    procs: list[subprocess.Popen[bytes]] = []
    try:
        bulk = bulk_rate(mariadb)
        print(f"source bulk write rate: {bulk:,.0f} rows/s (1,000-row INSERTs, {BULK_ROWS:,} rows)", flush=True)
        mariadb.execute(f"CREATE DATABASE `{DB}`", *(
            f"CREATE TABLE `{DB}`.`{t}` (id BIGINT PRIMARY KEY, a INT, b VARCHAR(40), c DECIMAL(12,2), d DATETIME(3))"
            for t in TABLES))
        source.record_url(workdir / "data", mariadb.dsn())  # the children read it from there
        env = child_env(cfg, workdir / "data", nats.url)
        asyncio.run(init.init(nats.url, login.admin(workdir / "data"), env))
        env.update(BINLAKE_START="current", BINLAKE_LOG_LEVEL="warning")
        loader_port = free_port()
        logs = workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        pids: dict[str, int] = {}
        for child in services(cfg, env, workdir / "data"):
            child_env_ = dict(child.env)
            if child.name == "loader":
                child_env_.update(BINLAKE_METRICS_PORT=str(loader_port), BINLAKE_LOG_LEVEL="info")
            proc = spawn(child.name, child_env_, logs / f"{child.name}.log", command=child.command)
            procs.append(proc)
            pids[child.name] = proc.pid
        pids["nats-server"] = nats.proc.pid if nats.proc else 0
        pids["mariadbd"] = mariadb.proc.pid if mariadb.proc else 0
        pids["bench"] = os.getpid()
        wait_for_loader(logs / "loader.log", procs[-1])
        tables = {t: Table(t) for t in TABLES}
        admin = login.admin(workdir / "data")
        steps = asyncio.run(measure(args, mariadb, nats.url, tables, loader_port, pids, admin))
        best = max((s.target for s in steps if s.sustainable), default=0.0)
        print(f"highest sustainable rate: {best:,.0f} rows/s; source bulk write rate {bulk:,.0f} rows/s; "
              f"ratio {best / bulk:.3f}")
        return 0
    finally:
        stop_all(procs)
        nats.stop()
        mariadb.stop()


def main() -> None:
    ap = arguments(__doc__, "keep servers' files and logs here (default: a temporary directory)")
    ap.add_argument("--rates", type=int, nargs="+", default=[1000, 2000, 3000, 5000, 7500, 10000, 20000, 40000],
                    help="target source rates, rows/s, one step each")
    ap.add_argument("--step-s", type=float, default=30.0, help="seconds each rate is held")
    ap.add_argument("--drain-s", type=float, default=60.0, help="seconds to wait for the last changes")
    ap.add_argument("--writers", type=int, default=4, help="source connections writing at once (2 tables each)")
    ap.add_argument("--all", action="store_true", help="run every step, also after an unsustainable one")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_in_workdir(run, ap.parse_args(), "binlake-bench-e2e-")


if __name__ == "__main__":
    main()

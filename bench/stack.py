"""The whole stack for the end-to-end benchmarks, and the source workload they drive through it.

A durable private MariaDB and nats-server (every service its own NATS user, as under `binlake up`);
meta, store, parser, two sink workers and the Spark loader, each a process with `binlake up`'s
environment, stopped and started again as a whole (`stop_services`, `start_services`). The
workload: `Writers` threads (own connections, two tables each) drive 8 tables with transactions
of 1-50 rows (inserts, updates, deletes; one table per transaction), paced or as fast as they
can; `Followers` count every table's rows as they reach BINLAKE_RAW and BINLAKE_CDC (headers
only: the counts are there), and the loader's `binlake_loader_committed_seq` says what the lake
holds.

Not a benchmark of its own: bench/e2e.py (steady ratio against the writers alone) and
bench/catch_up.py (catch-up ratio against the bare mysql-replication loop) measure with it.
"""

from __future__ import annotations

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

from nats.aio.client import Client as NATS

from bench.common import proc_cpu, tail
from services.launcher import login, source
from services.launcher.app import DURABLE, child_env, services
from services.launcher.config import LauncherConfig
from services.launcher.processes import spawn, stop_all
from services.launcher.servers import MariaDB, NatsServer, free_port, start_mariadb, start_nats
from services.ops import init
from shared import jetstream
from shared.envelope import ROWS_HEADER
from shared.ordered_reader import OrderedReader
from shared.subjects import Names

DB = "e2e"
TABLES = [f"t{i}" for i in range(8)]
TABLE_DDL = "(id BIGINT PRIMARY KEY, a INT, b VARCHAR(40), c DECIMAL(12,2), d DATETIME(3))"
UNPACED = float("inf")


@dataclass
class Table:
    """One source table as the writers left it, and where its changes have got to."""

    name: str
    live: list[int] = field(default_factory=list)  # ids that exist now
    next_id: int = 1
    commits: list[tuple[int, float]] = field(default_factory=list)  # (rows so far, commit time)
    raw: list[tuple[int, int, float]] = field(default_factory=list)  # (RAW seq, rows so far, arrival time)
    cdc: list[tuple[int, int, float]] = field(default_factory=list)  # (CDC seq, rows so far, arrival time)

    @property
    def committed(self) -> int:
        return self.commits[-1][0] if self.commits else 0


def new_tables() -> dict[str, Table]:
    return {t: Table(t) for t in TABLES}


class Writer:
    """Paced transactions over its own tables from one connection (a thread: pymysql blocks)."""

    def __init__(self, mariadb: MariaDB, db: str, tables: list[Table], lock: threading.Lock, seed: int) -> None:
        self._conn = mariadb.connect(autocommit=False)
        self._db = db
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
                rate = self.rate  # once: another thread sets it
                if rate <= 0:
                    time.sleep(0.02)
                    due = time.monotonic()
                    continue
                n = self._txn()
                due += n / rate
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
                cur.execute(f"INSERT INTO `{self._db}`.`{t.name}` VALUES " + ", ".join(
                    f"({i}, {i % 997}, 'row-{i}', {i % 10000}.25, NOW(3))" for i in ids))
                t.live.extend(ids)
            elif kind < 0.9:
                ids = self._rnd.sample(t.live, n)
                cur.execute(f"UPDATE `{self._db}`.`{t.name}` SET a = a + 1, d = NOW(3) "
                            f"WHERE id IN ({','.join(map(str, ids))})")
            else:
                idx = sorted(self._rnd.sample(range(len(t.live)), n), reverse=True)
                ids = [t.live[i] for i in idx]
                for i in idx:
                    t.live[i] = t.live[-1]
                    t.live.pop()
                cur.execute(f"DELETE FROM `{self._db}`.`{t.name}` WHERE id IN ({','.join(map(str, ids))})")
        self._conn.commit()
        now = time.time()
        with self.lock:
            t.commits.append((t.committed + n, now))
            self.rows += n
        return n


class Writers:
    """Writer threads, each with its own tables and connection (commits overlap, as an
    application's would: one connection alone is bound by the durable commit's fsync)."""

    def __init__(self, mariadb: MariaDB, tables: dict[str, Table], n: int, db: str = DB) -> None:
        self.lock = threading.Lock()
        all_tables = list(tables.values())
        self._writers = [Writer(mariadb, db, all_tables[i::n], self.lock, seed=7 + i) for i in range(n)]
        self._threads = [threading.Thread(target=w.run, daemon=True) for w in self._writers]
        for t in self._threads:
            t.start()

    def set_rate(self, rows_s: float) -> None:
        """Rows per second over all writers; UNPACED: as fast as the source takes them; 0: pause."""
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


def create_tables(mariadb: MariaDB, db: str = DB) -> None:
    mariadb.execute(f"CREATE DATABASE `{db}`", *(f"CREATE TABLE `{db}`.`{t}` {TABLE_DDL}" for t in TABLES))


def unpaced_rate(mariadb: MariaDB, seconds: float, writers: int) -> float:
    """The writers' highest rate (rows/s) with binlake stopped: unpaced for `seconds`, into tables
    of their own (database e2e_max)."""
    create_tables(mariadb, "e2e_max")
    w = Writers(mariadb, new_tables(), writers, db="e2e_max")
    try:
        started = time.monotonic()
        w.set_rate(UNPACED)
        time.sleep(seconds)
        w.set_rate(0.0)
        elapsed = time.monotonic() - started
        if w.error is not None:
            raise w.error
        return w.rows / elapsed
    finally:
        w.stop()


class Followers:
    """Two readers counting every table's rows as they reach BINLAKE_RAW and BINLAKE_CDC."""

    def __init__(self, nc: NATS, tables: dict[str, Table], lock: threading.Lock) -> None:
        self._js = nc.jetstream()
        self._tables = tables
        self._lock = lock
        names = Names()
        self._tasks = [asyncio.create_task(self._follow("raw", names.raw_stream, names.raw_all)),
                       asyncio.create_task(self._follow("cdc", names.cdc_stream, names.cdc_all))]

    async def _follow(self, stage: str, stream: str, subject: str) -> None:
        reader = OrderedReader(self._js, stream, subject, 1, 1000, headers_only=True)
        try:
            while True:
                for msg in await reader.fetch(wait_s=0.2):
                    parts = msg.subject.split(".")
                    t = self._tables.get(parts[-1])
                    rows = int((msg.headers or {}).get(ROWS_HEADER, 0))
                    if t is None or parts[-2] != DB or not rows:
                        continue
                    with self._lock:
                        log = t.raw if stage == "raw" else t.cdc
                        log.append((msg.metadata.sequence.stream, (log[-1][1] if log else 0) + rows, time.time()))
        finally:
            await reader.close()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def oldest_missing(t: Table, arrived_rows: int, now: float) -> float:
    """Age of the oldest transaction of `t` beyond `arrived_rows` (0 when all are there)."""
    i = bisect.bisect_right(t.commits, (arrived_rows, float("inf")))
    return now - t.commits[i][1] if i < len(t.commits) else 0.0


def rows_at(log: list[tuple[int, int, float]], seq: int) -> int:
    """Rows of a table in a stream up to and including stream sequence `seq`."""
    i = bisect.bisect_right(log, (seq, 1 << 62, 0.0))
    return log[i - 1][1] if i else 0


def loader_seq(port: int) -> int:
    """The CDC sequence the lake has committed up to (the loader's metric; 0 if unreadable)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("binlake_loader_committed_seq "):
                    return int(float(line.split()[1]))
    except OSError:
        pass
    return 0


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its descendants (the loader's JVM is its child); this
    benchmark's own process alone (the services are its children)."""
    if pid == os.getpid():
        return proc_cpu(pid)
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += proc_cpu(p, reaped=True)
        todo.extend(children.get(p, ()))
    return total


class Stack:
    """The servers, and binlake's services as processes that can be stopped and started again."""

    def __init__(self, workdir: Path, sinks: int = 2, nats_sync: str = LauncherConfig().nats_sync) -> None:
        self.workdir = workdir
        self.data = workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.cfg = LauncherConfig(data_dir=str(self.data), sinks=sinks)
        self.mariadb = start_mariadb(workdir / "mariadb", extra_args=DURABLE)
        self.nats: NatsServer | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []  # of procs
        self.loader_port = free_port()
        self._starts = 0
        try:
            self.nats = start_nats(workdir / "nats",
                                   extra_args=["-c", str(login.server_config(self.data, Names(), sync=nats_sync))])
        except BaseException:
            self.mariadb.stop()
            raise
        self.admin = login.admin(self.data)

    @property
    def nats_url(self) -> str:
        assert self.nats is not None
        return self.nats.url

    def init(self) -> None:
        """Record the source for the services and define the streams."""
        source.record_url(self.data, self.mariadb.dsn())  # the children read it from there
        asyncio.run(init.init(self.nats_url, self.admin, child_env(self.cfg, self.data, self.nats_url)))

    def start_services(self) -> None:
        """Every service as `binlake up` starts it; returns once the loader runs (Spark is up)."""
        env = child_env(self.cfg, self.data, self.nats_url)
        env.update(BINLAKE_START="current", BINLAKE_LOG_LEVEL="warning")
        self._starts += 1
        for child in services(self.cfg, env, self.data):
            cenv = dict(child.env)
            if child.name == "loader":
                cenv.update(BINLAKE_METRICS_PORT=str(self.loader_port), BINLAKE_LOG_LEVEL="info")
            self.procs.append(spawn(child.name, cenv, self.log(child.name), command=child.command))
            self.names.append(child.name)
        self._wait_for_loader()

    def log(self, name: str) -> Path:
        return self.logs / f"{name}-{self._starts}.log"

    def stop_services(self) -> None:
        stop_all(self.procs)
        self.procs, self.names = [], []

    def pids(self) -> dict[str, int]:
        """Every process of the run by name: the services, the servers and this benchmark."""
        out = {name: p.pid for name, p in zip(self.names, self.procs, strict=True)}
        out["nats-server"] = self.nats.proc.pid if self.nats is not None and self.nats.proc else 0
        out["mariadbd"] = self.mariadb.proc.pid if self.mariadb.proc else 0
        out["bench"] = os.getpid()
        return out

    def _wait_for_loader(self, timeout_s: float = 300) -> None:
        log, proc = self.log("loader"), self.procs[-1]
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the loader exited:\n{tail(log)}")
            if log.exists() and '"loader.start"' in log.read_text(errors="replace"):
                return
            time.sleep(0.25)
        raise SystemExit(f"the loader did not start in {timeout_s:.0f} s:\n{tail(log)}")

    async def connect(self) -> NATS:
        return await jetstream.connect(self.nats_url, "bench-e2e", auth=self.admin)

    def close(self) -> None:
        stop_all(self.procs)
        if self.nats is not None:
            self.nats.stop()
        self.mariadb.stop()

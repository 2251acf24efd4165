"""Source -> BINLAKE_CDC on a three-node JetStream cluster (R3) against one node (R1), same run.

For each bus the parser and two sink workers run as processes (as `binlake up` runs them);
the source then writes `--rows` row changes in bulk (transactions of 500 rows) and the
benchmark follows BINLAKE_CDC until they are all there. It prints rows/s from the first
commit to the last change in BINLAKE_CDC, the commit -> CDC latency percentiles of each
transaction, and `ratio` = cluster rows/s / single-node rows/s. Every size runs on both buses,
so the ratio is measured side by side; several sizes show how the cost grows.

    python3 -m bench.cluster [--rows 20000 60000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nats.aio.msg import Msg

from bench.common import arguments, percentile, run_in_workdir, tail
from services.launcher.processes import clean_env, spawn, stop_all
from services.launcher.servers import MariaDB, NatsCluster, NatsServer, start_mariadb, start_nats, start_nats_cluster
from shared import jetstream
from shared.subjects import Names

TXN_ROWS = 500


@dataclass
class Result:
    bus: str
    rows: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


@contextlib.contextmanager
def services(bus_url: str, replicas: int, source_url: str, logdir: Path) -> Iterator[None]:
    env = clean_env(BINLAKE_NATS_URL=bus_url, BINLAKE_SOURCE_URL=source_url, BINLAKE_REPLICAS=str(replicas),
                    BINLAKE_START="current", BINLAKE_METRICS_PORT="-1", BINLAKE_LOG_LEVEL="warning")
    procs: list[subprocess.Popen[bytes]] = []
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        for name, module, extra in (("parser", "services.parser", {}),
                                    ("sink-1", "services.sink", {"BINLAKE_INSTANCE": "sink-1"}),
                                    ("sink-2", "services.sink", {"BINLAKE_INSTANCE": "sink-2"})):
            procs.append(spawn(module, {**env, **extra}, logdir / f"{name}.log"))
        yield
    finally:
        stop_all(procs)


async def follow(url: str, db: str, rows: int, commits: dict[int, float],
                 timeout_s: float) -> tuple[float, list[float]]:
    """Until BINLAKE_CDC holds `rows` row changes of `db`: (time of the last, commit -> CDC latencies in ms)."""
    nc = await jetstream.connect(url, "bench-cluster")
    js = nc.jetstream()
    seen = 0
    done = asyncio.Event()
    arrived: dict[int, float] = {}
    last = 0.0

    async def on(msg: Msg) -> None:
        nonlocal seen, last
        headers = msg.headers or {}
        if msg.subject.split(".")[-2] != db:
            return
        seen += int(headers.get("Binlake-Rows", 0))
        last = time.time()
        txn = seen // TXN_ROWS
        arrived.setdefault(txn, last)
        if seen >= rows:
            done.set()

    names = Names()
    sub = await js.subscribe(f"{names.cdc_all}", ordered_consumer=True, cb=on)
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    finally:
        await sub.unsubscribe()
        await nc.close()
    lat = sorted((arrived[t] - commits[t]) * 1000 for t in arrived if t in commits and t > 0)
    return last, lat


def write(mariadb: MariaDB, db: str, rows: int, commits: dict[int, float]) -> float:
    """Bulk inserts in transactions of TXN_ROWS; returns the time of the first commit."""
    conn = mariadb.connect()
    first = 0.0
    try:
        with conn.cursor() as cur:
            for t in range(rows // TXN_ROWS):
                lo = t * TXN_ROWS
                cur.execute(f"INSERT INTO `{db}`.t VALUES " + ", ".join(
                    f"({i}, 'name-{i}', {i * 0.5}, NOW(6))" for i in range(lo, lo + TXN_ROWS)))
                conn.commit()
                commits[t + 1] = time.time()
                first = first or commits[t + 1]
    finally:
        conn.close()
    return first


def one_run(bus: str, url: str, replicas: int, mariadb: MariaDB, rows: int, logdir: Path) -> Result:
    db = f"b_{bus}_{rows}"
    mariadb.execute(f"DROP DATABASE IF EXISTS `{db}`", f"CREATE DATABASE `{db}`",
                    f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, name VARCHAR(40), v DOUBLE, at DATETIME(6))")
    commits: dict[int, float] = {}

    async def run() -> Result:
        follower = asyncio.create_task(follow(url, db, rows, commits, timeout_s=600))
        await asyncio.sleep(1.0)
        first = await asyncio.get_running_loop().run_in_executor(None, write, mariadb, db, rows, commits)
        last, lat = await follower
        return Result(bus, rows, last - first, lat)

    with services(url, replicas, mariadb.dsn(), logdir / f"{bus}-{rows}"):
        time.sleep(4)  # parser lease, sink membership
        try:
            return asyncio.run(run())
        except TimeoutError:
            raise SystemExit(f"{bus}: BINLAKE_CDC never held {rows} rows; parser log:\n"
                             f"{tail(logdir / f'{bus}-{rows}' / 'parser.log')}") from None


def run(args: argparse.Namespace, workdir: Path) -> int:
    mariadb = start_mariadb(workdir / "mariadb")
    results: list[tuple[Result, Result]] = []
    try:
        for rows in args.rows:
            single: NatsServer = start_nats(workdir / f"single-{rows}")
            try:
                one = one_run("single", single.url, 1, mariadb, rows, workdir / "logs")
            finally:
                single.stop()
            cluster: NatsCluster = start_nats_cluster(workdir / f"cluster-{rows}", 3)
            try:
                three = one_run("cluster", cluster.url, 3, mariadb, rows, workdir / "logs")
            finally:
                cluster.stop()
            results.append((one, three))
    finally:
        mariadb.stop()
    print(f"{'rows':>8} {'bus':>8} {'rows/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for one, three in results:
        for r in (one, three):
            print(f"{r.rows:>8} {r.bus:>8} {r.rate:>9.0f} {percentile(r.latencies_ms, 50):>8.0f} "
                  f"{percentile(r.latencies_ms, 99):>8.0f}")
        print(f"{'':>8} ratio cluster(R3)/single(R1) = {three.rate / one.rate:.2f}")
    return 0


def main() -> None:
    ap = arguments(__doc__, "keep servers' files and logs here (default: a temporary directory)")
    ap.add_argument("--rows", type=int, nargs="+", default=[20000, 60000], help="row changes per run")
    run_in_workdir(run, ap.parse_args(), "binlake-bench-cluster-")


if __name__ == "__main__":
    main()

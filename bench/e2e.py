#!/usr/bin/env python
"""End to end: how many row changes per second binlake carries from a commit into the lake.

The stack runs as `binlake up` runs it (bench/stack.py: a durable private MariaDB and
nats-server, every service a process as its own NATS user). First the writers (`--writers`
connections, transactions of 1-50 rows over 8 tables: inserts, updates, deletes) run unpaced
for `--step-s` seconds with binlake stopped: the highest rate the source takes from them, the
baseline. Then binlake starts and the writers hold increasing target rates, `--step-s`
seconds each. Every transaction's commit time is kept; two readers follow BINLAKE_RAW and
BINLAKE_CDC and the loader's `binlake_loader_committed_seq` metric (polled every 0.25 s) says
what the lake holds.

Per step it prints the achieved source rate, the lag of BINLAKE_RAW, BINLAKE_CDC and the lake
behind the source at the end of the step (the age of the oldest transaction not there yet:
RAW lag is the parser's, CDC minus RAW the sink's), CPU per process (with its children: the
loader's JVM), and whether the step is sustainable: the source reached 90% of its target and
neither lag grew over the step. It stops after the first step that is not (`--all` runs them
all). Then freshness commit -> CDC and commit -> lake (p50/p99) of every step, the highest
sustainable rate, and `steady ratio` = that rate / the writers' rate with binlake stopped.

`--catch-up N` measures a backlog instead: bench/catch_up.py.

    python3 -m bench.e2e [--rates 1000 2000 ...] [--step-s 30] [--writers 4] [--workdir DIR]
    python3 -m bench.e2e --catch-up 2000000
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.catch_up import catch_up
from bench.common import arguments, percentile, run_in_workdir
from bench.stack import (
    Followers,
    Stack,
    Table,
    Writers,
    create_tables,
    loader_seq,
    new_tables,
    oldest_missing,
    rows_at,
    tree_cpu,
    unpaced_rate,
)
from services.launcher.config import LauncherConfig

POLL_S = 0.25


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
    fresh_cdc: list[float] = field(default_factory=list)  # commit -> BINLAKE_CDC, ms, ascending
    fresh_lake: list[float] = field(default_factory=list)  # commit -> lake

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


async def measure(args: argparse.Namespace, stack: Stack, tables: dict[str, Table]) -> list[Step]:
    """Every step of `args.rates`, after an untimed warm-up; freshness of each step once all arrived."""
    nc = await stack.connect()
    writer = Writers(stack.mariadb, tables, args.writers)
    followers = Followers(nc, tables, writer.lock)
    loop = asyncio.get_running_loop()
    lake: list[tuple[int, float]] = []  # (committed CDC seq, first seen)
    pids = stack.pids()

    async def poll() -> tuple[float, float, float]:
        """How far RAW, CDC and the lake are behind the source (age of the oldest missing change, s)."""
        seq = await loop.run_in_executor(None, loader_seq, stack.loader_port)
        now = time.time()
        if seq and (not lake or seq > lake[-1][0]):
            lake.append((seq, now))
        with writer.lock:
            raw = max(oldest_missing(t, t.raw[-1][1] if t.raw else 0, now) for t in tables.values())
            cdc = max(oldest_missing(t, t.cdc[-1][1] if t.cdc else 0, now) for t in tables.values())
            lk = max(oldest_missing(t, rows_at(t.cdc, lake[-1][0]) if lake else 0, now) for t in tables.values())
        return raw, cdc, lk

    async def settle(timeout_s: float) -> None:
        """Until every table's changes so far are in BINLAKE_CDC and in the lake."""
        deadline = time.time() + timeout_s
        cdc = lk = 0.0
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
            cpu0 = {n: tree_cpu(p) for n, p in pids.items()}
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
            step.cpu = {n: (tree_cpu(p) - cpu0[n]) / (step.end - step.start) for n, p in pids.items()}
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
        await followers.close()
        await nc.close()
    cdc_arrival = {t.name: [(done, at) for _, done, at in t.cdc] for t in tables.values()}
    lake_arrival: dict[str, list[tuple[int, float]]] = {}
    for t in tables.values():
        arr: list[tuple[int, float]] = []
        for seq, at in lake:
            rows = rows_at(t.cdc, seq)
            if rows and (not arr or rows > arr[-1][0]):
                arr.append((rows, at))
        lake_arrival[t.name] = arr
    for step in steps:
        step.fresh_cdc = latencies(tables, step.start, step.end, cdc_arrival)
        step.fresh_lake = latencies(tables, step.start, step.end, lake_arrival)
    return steps


def report_line(s: Step) -> str:
    cpu = " ".join(f"{n} {v:.0%}" for n, v in sorted(s.cpu.items(), key=lambda kv: -kv[1]))
    return (f"target {s.target:>7,.0f} rows/s: achieved {s.achieved:>7,.0f}; lag at end RAW {s.raw_lag[-1][1]:5.1f} s, "
            f"CDC {s.cdc_lag[-1][1]:5.1f} s "
            f"(max {max(lag for _, lag in s.cdc_lag):5.1f}), lake {s.lake_lag[-1][1]:5.1f} s "
            f"(max {max(lag for _, lag in s.lake_lag):5.1f}); {'sustainable' if s.sustainable else 'NOT sustainable'}"
            f"\n    CPU (share of one core): {cpu}")


def freshness_line(s: Step) -> str:
    return (f"freshness at {s.target:>7,.0f} rows/s: commit -> BINLAKE_CDC p50 {percentile(s.fresh_cdc, 50):,.0f} ms "
            f"p99 {percentile(s.fresh_cdc, 99):,.0f} ms; commit -> lake p50 {percentile(s.fresh_lake, 50):,.0f} ms "
            f"p99 {percentile(s.fresh_lake, 99):,.0f} ms (n={len(s.fresh_lake)})")


def steady(args: argparse.Namespace, stack: Stack) -> int:
    """The writers' highest rate with binlake stopped, then the steps with binlake running."""
    alone = unpaced_rate(stack.mariadb, args.step_s, args.writers)
    print(f"writers' highest rate with binlake stopped: {alone:,.0f} rows/s ({args.writers} connections, "
          f"{args.step_s:.0f} s)", flush=True)
    create_tables(stack.mariadb)
    stack.start_services()
    steps = asyncio.run(measure(args, stack, new_tables()))
    for step in steps:
        print(freshness_line(step))
    best = max((s.target for s in steps if s.sustainable), default=0.0)
    print(f"highest sustainable rate: {best:,.0f} rows/s; writers alone {alone:,.0f} rows/s; "
          f"steady ratio {best / alone:.3f}")
    return 0


def run(args: argparse.Namespace, workdir: Path) -> int:
    stack = Stack(workdir, nats_sync=args.nats_sync)
    try:
        stack.init()
        if args.catch_up:
            return catch_up(args, stack)
        return steady(args, stack)
    finally:
        stack.close()


def main() -> None:
    ap = arguments(__doc__, "keep servers' files and logs here (default: a temporary directory)")
    ap.add_argument("--rates", type=int, nargs="+", default=[1000, 2000, 3000, 5000, 7500, 10000, 15000, 20000, 30000],
                    help="target source rates, rows/s, one step each")
    ap.add_argument("--step-s", type=float, default=30.0, help="seconds each rate is held")
    ap.add_argument("--drain-s", type=float, default=60.0, help="seconds to wait for the last changes")
    ap.add_argument("--writers", type=int, default=4, help="source connections writing at once (2 tables each)")
    ap.add_argument("--all", action="store_true", help="run every step, also after an unsustainable one")
    ap.add_argument("--nats-sync", default=LauncherConfig().nats_sync, metavar="INTERVAL",
                    help="nats-server's JetStream sync_interval: always (binlake up's default), 1s, 2m (nats-server's)")
    ap.add_argument("--catch-up", type=int, metavar="N", default=0,
                    help="instead of the steps: N changes written while binlake is stopped, then the time to "
                         "catch up (see bench/catch_up.py)")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_in_workdir(run, ap.parse_args(), "binlake-bench-e2e-")


if __name__ == "__main__":
    main()

"""Catch-up: how long binlake takes to bring the lake up to a backlog, against the bare binlog library.

`python3 -m bench.e2e --catch-up N`. The stack of bench/stack.py starts, creates the lake's
tables in an untimed warm-up and stops. With binlake stopped, the writers (`--writers`
connections, transactions of 1-50 rows over 8 tables: inserts, updates, deletes) write N
changes as fast as the source takes them (their rate is printed: the steady-state baseline
too). The baseline then reads that binlog range: the bare mysql-replication loop of
bench/parser.py (decode every event, touch every value) from the same position, alone on the
machine. Then every service starts again (Spark's start included) and the clock runs until
BINLAKE_RAW, BINLAKE_CDC and the lake hold all N.

Printed: rows/s per stage and end to end, each process's CPU-seconds per million changes (a
process with its children: the loader's JVM) and their total, and `catch-up ratio` = end-to-end
rows/s / the bare loop's rows/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from dataclasses import dataclass

from bench.common import proc_cpu, proc_peak_rss
from bench.parser import Workload, binlog_status, run_baseline
from bench.stack import UNPACED, Followers, Stack, Table, Writers, create_tables, loader_seq, new_tables, tree_cpu

POLL_S = 0.25
BASELINE_SERVER_ID = 4242


@dataclass
class Stages:
    """Seconds from the services' start until each stage held every change (0: not yet)."""

    loader_up: float = 0.0
    raw: float = 0.0
    cdc: float = 0.0
    lake: float = 0.0


def _all_in(log: list[tuple[int, int, float]], t: Table) -> bool:
    return bool(log) and log[-1][1] >= t.committed


async def _follow_until_held(stack: Stack, tables: dict[str, Table], started: float, stages: Stages,
                             timeout_s: float, lock: threading.Lock) -> None:
    nc = await stack.connect()
    followers = Followers(nc, tables, lock)
    loop = asyncio.get_running_loop()
    try:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            await asyncio.sleep(POLL_S)
            now = time.time() - started
            if not stages.raw and all(_all_in(t.raw, t) for t in tables.values()):
                stages.raw = now
            if not stages.cdc and all(_all_in(t.cdc, t) for t in tables.values()):
                stages.cdc = now
            if stages.cdc:
                last = max(t.cdc[-1][0] for t in tables.values())
                if await loop.run_in_executor(None, loader_seq, stack.loader_port) >= last:
                    stages.lake = time.time() - started
                    return
        raise SystemExit(f"the lake did not hold the backlog within {timeout_s:.0f} s: RAW "
                         f"{'done' if stages.raw else 'not done'}, CDC {'done' if stages.cdc else 'not done'}")
    finally:
        await followers.close()
        await nc.close()


def _warm_up(stack: Stack, tables: dict[str, Table], writers: int) -> None:
    """A few changes into every table, held by the lake: its tables exist before the clock runs."""
    w = Writers(stack.mariadb, tables, writers)
    try:
        w.set_rate(400.0)
        time.sleep(5)
        w.set_rate(0.0)
        time.sleep(0.5)
    finally:
        w.stop()
    asyncio.run(_follow_until_held(stack, tables, time.time(), Stages(), 600, w.lock))


def _write(stack: Stack, tables: dict[str, Table], n: int, writers: int) -> tuple[Workload, threading.Lock]:
    """N changes (a transaction more at most per writer) as fast as the source takes them."""
    wl = Workload(start=binlog_status(stack.mariadb))
    w = Writers(stack.mariadb, tables, writers)
    started = time.perf_counter()
    try:
        w.set_rate(UNPACED)
        while w.rows < n:
            if w.error is not None:
                raise w.error
            time.sleep(0.01)
        w.set_rate(0.0)
        time.sleep(0.2)
    finally:
        w.stop()
    wl.seconds = time.perf_counter() - started
    wl.rows = w.rows
    wl.end = binlog_status(stack.mariadb)
    return wl, w.lock


def catch_up(args: argparse.Namespace, stack: Stack) -> int:
    tables = new_tables()
    create_tables(stack.mariadb)
    stack.start_services()
    _warm_up(stack, tables, args.writers)
    stack.stop_services()

    wl, lock = _write(stack, tables, args.catch_up, args.writers)
    print(f"backlog: {wl.rows:,} changes in {sum(len(t.commits) for t in tables.values()):,} transactions, "
          f"written with binlake stopped at {wl.rows / wl.seconds:,.0f} rows/s ({args.writers} connections; "
          f"binlog {wl.start} .. {wl.end})", flush=True)
    bare = run_baseline(stack.mariadb, wl, BASELINE_SERVER_ID)
    print(f"bare mysql-replication loop over the same binlog: {bare.rows:,} rows in {bare.seconds:.1f} s, "
          f"{bare.rate:,.0f} rows/s", flush=True)
    if bare.rows < wl.rows:
        raise SystemExit(f"the bare loop read {bare.rows:,} rows of {wl.rows:,}")

    servers = {"nats-server": stack.pids()["nats-server"], "mariadbd": stack.pids()["mariadbd"]}
    cpu0 = {name: tree_cpu(pid) for name, pid in servers.items()}
    stages = Stages()
    started = time.time()
    stack.start_services()
    stages.loader_up = time.time() - started
    pids = stack.pids()
    asyncio.run(_follow_until_held(stack, tables, started, stages, args.drain_s + 3600, lock))
    cpu = {name: tree_cpu(pid) - cpu0.get(name, 0.0) for name, pid in pids.items() if name != "bench"}
    loader_python = proc_cpu(pids["loader"])
    peak = {name: proc_peak_rss(pids[name]) / 2**20 for name in ("parser", "loader")}

    n = wl.rows
    print(f"catch-up from the services' start (the loader's Spark was up after {stages.loader_up:.1f} s):")
    for stage, secs in (("BINLAKE_RAW", stages.raw), ("BINLAKE_CDC", stages.cdc), ("lake", stages.lake)):
        print(f"  {stage:<12} held all after {secs:6.1f} s: {n / secs:>9,.0f} rows/s")
    per_m = 1e6 / n
    print("CPU-seconds per million changes: " + ", ".join(
        f"{name} {secs * per_m:.1f}" for name, secs in sorted(cpu.items(), key=lambda kv: -kv[1]))
        + f"; total {sum(cpu.values()) * per_m:.1f} (over {stages.lake:.0f} s on "
          f"{len(os.sched_getaffinity(0))} cores); the loader's Python {loader_python * per_m:.1f}, its JVM "
          f"{(cpu['loader'] - loader_python) * per_m:.1f}")
    print(f"peak RSS: parser {peak['parser']:.0f} MiB, loader {peak['loader']:.0f} MiB (Python; its JVM apart)")
    e2e = n / stages.lake
    print(f"end to end {e2e:,.0f} rows/s; bare loop {bare.rate:,.0f} rows/s; catch-up ratio {e2e / bare.rate:.3f}")
    return 0


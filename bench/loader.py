#!/usr/bin/env python
"""Loader benchmark: rows/s from BINLAKE_CDC into the lake, and the ratio to a plain Parquet append.

Starts a private MariaDB and nats-server (tests/servers.py), runs parser + one sink while
bench/parser.py's workload writes N row changes (3 tables of mixed types, multi-row
inserts/updates/deletes), waits until BINLAKE_CDC holds all N and stops them, so the CDC
stream is fixed. Then, one after the other (never sharing the CPU):

  (loader) meta + store + `python -m services.loader` (BINLAKE_BATCH_ROWS=50000): the real
           process, timed from its logs: rows/s from its first `loader.committed` to the one
           that reaches the last row change of BINLAKE_CDC (the first batch, which pays for
           Spark's warm-up, is left out), and per batch the `seconds` it logged (group the
           events + write changelog and snapshot + commit) and the interval between commits
           (the whole cycle: store get, msgpack, write, commit, ack).
  (plain)  in this process: the same batches, read through `shared.store_client.StoreClient`
           (another client, from the earliest event, 50000 rows per get), the same Arrow
           tables (`frames.group(...).arrow_segments()`), written by a local Spark session
           of the same size as `spark.createDataFrame(arrow).write.mode("append").parquet(...)`,
           timed the same way (wall clock after the first batch; per batch the write alone).

The ratio is loader rows/s / plain rows/s: what the lake's changelog + snapshot merge + catalog
commit cost on top of just writing the rows once. Exits non-zero when the lake does not hold
exactly the N row changes (changelog rows at or below the commit pointer) or `verify` differs.

    python bench/loader.py [--rows 200000] [--batch-rows 50000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import nats  # noqa: E402
import nats.errors  # noqa: E402
import nats.js.errors  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: E402

from bench.parser import DB, TABLES, percentile, tail, write_workload  # noqa: E402
from tests.servers import MariaDB, start_mariadb, start_nats  # noqa: E402

PREFIX_ENV = {"BINLAKE_SOURCE": "main", "BINLAKE_METRICS_PORT": "-1"}


def env_for(nats_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BINLAKE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(PREFIX_ENV, BINLAKE_NATS_URL=nats_url, **extra)
    return env


class Procs:
    """Service processes with their logs; stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, module: str, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def stop(self, name: str, timeout: float = 60) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def check(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail(self.logs / f'{name}.log', 40)}")

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


@contextmanager
def processes(logs: Path) -> Iterator[Procs]:
    procs = Procs(logs)
    try:
        yield procs
    finally:
        procs.stop_all()


# ----------------------------------------------------------------------------- CDC


async def cdc_scan(nats_url: str) -> tuple[int, int, int]:
    """(row changes of the bench tables, messages holding them, CDC sequence of the last one)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info("BINLAKE_CDC")
        except nats.js.errors.NotFoundError:
            return 0, 0, 0
        if info.state.messages == 0:
            return 0, 0, 0
        sub = await js.pull_subscribe(">", stream="BINLAKE_CDC", config=ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30))
        rows = msgs = last = 0
        seen = 0
        while seen < info.state.last_seq:
            try:
                batch = await sub.fetch(2000, timeout=2)
            except nats.errors.TimeoutError:
                break
            for m in batch:
                seen = m.metadata.sequence.stream
                env = msgpack.unpackb(m.data, raw=False, strict_map_key=False)
                if env.get("db") == DB and env.get("op") in ("i", "u", "d"):
                    rows += len(env["rows"])
                    msgs += 1
                    last = seen
        await sub.unsubscribe()
        return rows, msgs, last
    finally:
        await nc.close()


def wait(pred: Any, limit_s: float, what: str, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {limit_s:.0f}s waiting for {what}")
        time.sleep(interval)


def prefill(db: MariaDB, nats_url: str, procs: Procs, rows: int) -> int:
    """parser + sink over a written workload; returns the CDC sequence of the last row change."""
    procs.start("services.parser", "parser", env_for(nats_url, BINLAKE_SOURCE_URL=db.dsn(), BINLAKE_START="current"))
    procs.start("services.sink", "sink", env_for(nats_url, BINLAKE_INSTANCE="sink-1"))

    async def raw_started() -> bool:
        nc = await nats.connect(nats_url)
        try:
            return bool((await nc.jetstream().stream_info("BINLAKE_RAW")).state.messages)
        except nats.js.errors.NotFoundError:
            return False
        finally:
            await nc.close()

    def started() -> bool:
        procs.check("parser")
        return asyncio.run(raw_started())

    wait(started, 120, "the parser's first message")
    t0 = time.monotonic()
    wl = write_workload(db, rows)
    print(f"workload             : {wl.rows} row changes ({dict(wl.by_op)}), {wl.transactions} transactions, "
          f"written in {wl.seconds:.1f} s")
    state: dict[str, tuple[int, int, int]] = {}

    def filled() -> bool:
        procs.check("parser")
        procs.check("sink")
        state["scan"] = asyncio.run(cdc_scan(nats_url))
        return state["scan"][0] >= wl.rows

    wait(filled, 900, f"{wl.rows} row changes in BINLAKE_CDC", interval=3)
    got, msgs, last = state["scan"]
    if got != wl.rows:
        raise RuntimeError(f"BINLAKE_CDC holds {got} row changes, {wl.rows} were written")
    print(f"BINLAKE_CDC          : {got} row changes in {msgs} messages, last at seq {last} "
          f"(parser+sink caught up {time.monotonic() - t0:.1f} s after the workload began)")
    procs.stop("sink")
    procs.stop("parser")
    return last


# ----------------------------------------------------------------------------- (loader)


def committed_lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if '"loader.committed"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def run_loader(nats_url: str, procs: Procs, data_dir: Path, last: int, batch_rows: int) -> dict[str, Any]:
    procs.start("services.meta", "meta", env_for(nats_url))
    procs.start("services.store", "store", env_for(nats_url))
    log = procs.logs / "loader.log"
    t0 = time.monotonic()
    procs.start("services.loader", "loader", env_for(
        nats_url, BINLAKE_DATA_DIR=str(data_dir), BINLAKE_BATCH_ROWS=str(batch_rows), BINLAKE_FLUSH_S="1"))

    def done() -> bool:
        procs.check("loader")
        lines = committed_lines(log)
        return bool(lines) and int(lines[-1]["seq"]) >= last

    wait(done, 3600, f"the loader to commit CDC sequence {last}", interval=2)
    wall = time.monotonic() - t0
    procs.stop("loader")
    lines = committed_lines(log)
    stamps = [dt.datetime.fromisoformat(x["timestamp"].replace("Z", "+00:00")).timestamp() for x in lines]
    steady_rows = sum(int(x["rows"]) for x in lines[1:])
    steady_s = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
    return {"batches": len(lines), "rows": sum(int(x["rows"]) for x in lines), "steady_rows": steady_rows,
            "steady_s": steady_s, "wall_s": wall, "first_s": float(lines[0]["seconds"]),
            "seconds": [float(x["seconds"]) for x in lines[1:]],
            "cycles": [b - a for a, b in itertools.pairwise(stamps)]}


# ----------------------------------------------------------------------------- (plain)


async def run_plain(nats_url: str, out_dir: Path, last: int, batch_rows: int) -> dict[str, Any]:
    from services.loader import frames
    from services.loader.spark import session
    from shared.store_client import StoreClient

    spark = session("bench-plain", "local[*]", str(out_dir / "data"), str(out_dir / "warehouse"), hive=False)
    loop = asyncio.get_running_loop()
    client = await StoreClient.connect(nats_url, "bench-plain", timeout_s=60.0)
    try:
        await client.subscribe(filter=rf"{DB}\..*", start="earliest", reset=True)
        times: list[float] = []  # per batch: createDataFrame + write of its Arrow tables
        group_s: list[float] = []  # per batch: msgpack + frames.group + Arrow
        ends: list[float] = []
        rows = []
        while True:
            batch = await client.get(batch_rows, 1.0)
            if batch.id is None:
                continue
            t = time.monotonic()
            events = [(s, msgpack.unpackb(r, raw=False, strict_map_key=False))
                      for s, r in zip(batch.seqs, batch.raw, strict=True)]
            tables = frames.group(events)
            arrows = [(lake, a) for lake, changes in tables.items() for a in changes.arrow_segments()]
            t_write = time.monotonic()
            group_s.append(t_write - t)

            def write(arrows: list[tuple[tuple[str, str], Any]] = arrows) -> None:
                for (_db, table), arrow in arrows:
                    spark.createDataFrame(arrow).write.mode("append").parquet(str(out_dir / "parquet" / table))

            await loop.run_in_executor(None, write)
            times.append(time.monotonic() - t_write)
            ends.append(time.monotonic())
            rows.append(sum(c.rows for c in tables.values()))
            await client.ack(batch.id)
            if batch.id >= last:
                break
        written = sum(spark.read.parquet(str(out_dir / "parquet" / t)).count() for t in TABLES)
    finally:
        await client.close()
        spark.stop()
    return {"batches": len(rows), "rows": sum(rows), "steady_rows": sum(rows[1:]),
            "steady_s": ends[-1] - ends[0] if len(ends) > 1 else float("nan"), "first_s": times[0],
            "seconds": times[1:], "group": group_s, "written": written,
            "cycles": [b - a for a, b in itertools.pairwise(ends)]}


# ----------------------------------------------------------------------------- checks & report


def check_lake(db: MariaDB, data_dir: Path, rows: int) -> list[str]:
    """The lake's changelog holds exactly `rows` changes; verify equal for every bench table."""
    from services.loader.lake import COMMIT_FILE, lake_name
    from services.loader.spark import session
    from services.loader.verify import verify

    warehouse = data_dir / "warehouse"
    committed = int(json.loads((warehouse / COMMIT_FILE).read_text())["seq"])
    spark = session("bench-check", "local[*]", str(data_dir / "check"), str(warehouse), hive=False)
    problems = []
    try:
        total = 0
        for t in TABLES:
            base = warehouse / lake_name(DB, t) / "changelog"
            dirs = [str(p) for p in base.iterdir()
                    if p.name.startswith("_batch=") and int(p.name.split("=", 1)[1]) <= committed]
            df = spark.read.option("basePath", str(base)).parquet(*dirs).select("_seq", "_row")
            n, distinct = df.count(), df.distinct().count()
            if n != distinct:
                problems.append(f"{t}: {n - distinct} duplicate changes in the changelog")
            total += n
        if total != rows:
            problems.append(f"the changelog holds {total} changes, BINLAKE_CDC {rows}")
        for r in verify(spark, db.dsn(), str(warehouse), [f"{DB}.{t}" for t in TABLES]):
            print(f"verify               : {r.line()}")
            if not r.equal:
                problems.append(r.line())
    finally:
        spark.stop()
    return problems


def pct(values: list[float]) -> str:
    s = sorted(values)
    return f"p50 {percentile(s, 50):.2f} s, p95 {percentile(s, 95):.2f} s, max {max(s) if s else float('nan'):.2f} s"


def report(loader: dict[str, Any], plain: dict[str, Any], batch_rows: int) -> None:
    lr = loader["steady_rows"] / loader["steady_s"]
    pr = plain["steady_rows"] / plain["steady_s"]
    print(f"---- loader process ({loader['batches']} batches of <= {batch_rows} rows, {loader['rows']} rows)")
    print(f"start to caught up   : {loader['wall_s']:.1f} s (Spark start-up and first batch {loader['first_s']:.1f} s "
          "write time included)")
    print(f"steady               : {loader['steady_rows']} rows in {loader['steady_s']:.1f} s = {lr:,.0f} rows/s "
          "(first committed -> last committed)")
    print(f"batch write+commit   : {pct(loader['seconds'])}  (the `seconds` the loader logs)")
    print(f"batch cycle          : {pct(loader['cycles'])}  (commit to commit: get, decode, write, commit, ack)")
    print(f"---- plain Parquet append, same batches and Arrow tables ({plain['batches']} batches, "
          f"{plain['rows']} rows, {plain['written']} rows written)")
    print(f"steady               : {plain['steady_rows']} rows in {plain['steady_s']:.1f} s = {pr:,.0f} rows/s")
    print(f"batch write          : {pct(plain['seconds'])}  (first batch {plain['first_s']:.2f} s)")
    print(f"batch cycle          : {pct(plain['cycles'])}")
    print(f"batch group (Arrow)  : {pct(plain['group'])}  (msgpack + frames.group + to Arrow)")
    print("---- summary")
    print(f"loader {lr:,.0f} rows/s, plain Parquet append {pr:,.0f} rows/s, ratio loader/plain = {lr / pr:.2f}")
    print(f"loader batch latency (write+commit): p50 {percentile(sorted(loader['seconds']), 50):.2f} s, "
          f"p95 {percentile(sorted(loader['seconds']), 95):.2f} s")


def run(args: argparse.Namespace, workdir: Path) -> int:
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    db = start_mariadb(workdir / "mariadb")
    ns = None
    try:
        ns = start_nats(workdir / "nats")
        print(f"MariaDB              : {db.query('SELECT VERSION()')[0][0]}; python {sys.version.split()[0]}, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        with processes(logs) as procs:
            last = prefill(db, ns.url, procs, args.rows)
            loader = run_loader(ns.url, procs, workdir / "lake", last, args.batch_rows)
            print(f"load average         : {os.getloadavg()[0]:.1f} after the loader run")
            plain = asyncio.run(run_plain(ns.url, workdir / "plain", last, args.batch_rows))
        report(loader, plain, args.batch_rows)
        problems = check_lake(db, workdir / "lake", args.rows)
        for p in problems:
            print(f"CORRECTNESS: {p}")
        return 1 if problems else 0
    finally:
        if ns is not None:
            ns.stop()
        db.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000, help="row changes to write (default 200000)")
    ap.add_argument("--batch-rows", type=int, default=50_000, help="rows per batch (default 50000)")
    ap.add_argument("--workdir", type=Path, help="keep servers' files, lake and logs here (default: temp, removed)")
    args = ap.parse_args()
    if args.workdir is not None:
        sys.exit(run(args, args.workdir.resolve()))
    workdir = Path(tempfile.mkdtemp(prefix="binlake-bench-loader-"))
    try:
        code = run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Snapshot benchmark: `binlake snapshot` into BINLAKE_CDC vs. a plain `SELECT *` through asyncmy.

Starts a private MariaDB and nats-server (tests/servers.py) and fills a table of mixed
types with N rows that are not in the binlog (sql_log_bin=0, as data that existed before
binlake). Then, alternately, `--runs` times:

  (a) baseline: `SELECT *` of the whole table streamed through an asyncmy unbuffered
      cursor (default conversions), every value touched;
  (b) binlake: parser + one sink worker as subprocesses on a fresh prefix; the time from
      filing the snapshot request until BINLAKE_CDC holds all N rows as `op = "r"`.

Prints rows/s of both, their ratio, the chunk cycle time percentiles (time between the
arrivals of consecutive chunks' last messages in BINLAKE_CDC), the CPU the parser and the
sink spent per row (steadier than times on a noisy machine) and the parser's peak RSS. Exits
non-zero when the CDC rows are not exactly the table's rows. `--keyless`: the same table
without a key (one consistent read, in pages); run it at two sizes to see the parser's
memory stay flat.

    python3 -m bench.snapshot [--rows 300000] [--runs 2] [--chunk-rows 4096] [--keyless] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncmy
import nats
from asyncmy.cursors import SSCursor
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench.common import arguments, proc_cpu, proc_peak_rss, run_in_workdir
from services.launcher.processes import clean_env, spawn, stop_all
from services.launcher.servers import MariaDB, start_mariadb, start_nats
from shared import envelope, keys
from shared import snapshots as snap
from shared.subjects import Names

DB, TABLE, SOURCE = "bench", "t_snap", "main"
DDL = (
    f"CREATE DATABASE {DB} CHARACTER SET utf8mb4",
    f"""CREATE TABLE {DB}.{TABLE} (id INT PRIMARY KEY, a BIGINT NOT NULL, d DECIMAL(14,4), s VARCHAR(64),
        dt DATETIME(6), ts TIMESTAMP(3) NULL, doc TEXT, bl VARBINARY(32), e ENUM('red','green','blue'))""",
)


@dataclass
class Run:
    name: str
    rows: int
    seconds: float
    cycles_ms: list[float] = field(default_factory=list)
    first_ms: float = 0.0  # from the request to the first chunk in BINLAKE_CDC
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds per service during the snapshot
    parser_peak: int = 0  # the parser's peak RSS, bytes

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def fill(db: MariaDB, rows: int, keyless: bool) -> None:
    db.execute(*(d.replace("id INT PRIMARY KEY", "id INT") if keyless else d for d in DDL))
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(
                f"INSERT INTO {DB}.{TABLE} SELECT seq, seq * 7919, seq / 7, "
                f"CONCAT('name-', seq, '-', REPEAT('x', seq % 40)), "
                f"'2020-01-01 00:00:00' + INTERVAL seq SECOND + INTERVAL seq % 999999 MICROSECOND, "
                f"IF(seq % 5 = 0, NULL, '2001-01-01 00:00:00.001' + INTERVAL seq SECOND), "
                f"CONCAT('{{\"id\": ', seq, ', \"note\": \"', REPEAT('n', seq % 60), '\"}}'), "
                f"UNHEX(SHA1(seq)), ELT(1 + seq % 3, 'red', 'green', 'blue') FROM {DB}.seq_1_to_{rows}"
            )
    finally:
        conn.close()


async def baseline(db: MariaDB) -> Run:
    conn = await asyncmy.connect(host=db.host, port=db.port, user="root", password="", autocommit=True)
    try:
        started = time.perf_counter()
        n = values = 0
        async with conn.cursor(SSCursor) as cur:
            await cur.execute(f"SELECT * FROM {DB}.{TABLE}")
            async for row in cur:
                n += 1
                values += sum(1 for v in row if v is not None)
        return Run("SELECT * (asyncmy SSCursor)", n, time.perf_counter() - started)
    finally:
        conn.close()


def service(module: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return spawn(module, env, log)


async def binlake(db: MariaDB, nats_url: str, rows: int, prefix: str, chunk_rows: int, logs: Path) -> Run:
    env = clean_env()
    env.update(BINLAKE_NATS_URL=nats_url, BINLAKE_SOURCE_URL=db.dsn(), BINLAKE_PREFIX=prefix,
               BINLAKE_METRICS_PORT="-1", BINLAKE_SNAPSHOT_CHUNK_ROWS=str(chunk_rows),
               BINLAKE_SNAPSHOT_POLL_S="0.1", BINLAKE_LOG_LEVEL="warning")
    procs = [service("services.parser", env, logs / f"{prefix}-parser.log"),
             service("services.sink", env, logs / f"{prefix}-sink.log")]
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        cdc = f"{prefix.upper()}_CDC"
        while True:  # both services up: the streams and the cursor bucket exist
            try:
                await js.stream_info(cdc)
                kv = await js.key_value(f"{prefix}_cursors")
                break
            except Exception:
                await asyncio.sleep(0.2)
        got, arrivals = 0, {}
        done = asyncio.Event()

        async def on_msg(msg: Msg) -> None:
            # Headers only (the sink keeps the parser's): the follower must not cost the pipeline it measures.
            nonlocal got
            h = msg.headers or {}
            if h.get(envelope.OP_HEADER) == "r" and h.get(envelope.TABLE_HEADER) == f"{DB}.{TABLE}":
                got += int(h["Binlake-Rows"])
                arrivals[h[envelope.SCN_HEADER]] = time.perf_counter()
                if got >= rows:
                    done.set()

        sub = await js.subscribe(Names(prefix).cdc(SOURCE, DB, TABLE), cb=on_msg, stream=cdc, config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, headers_only=True), ordered_consumer=True)
        req = snap.SnapshotRequest(id=f"bench-{prefix}", patterns=[f"{DB}.{TABLE}"], created_ms=int(time.time() * 1000))
        cpu0 = [proc_cpu(p.pid) for p in procs]
        started = time.perf_counter()
        await kv.create(keys.snapshot_request(SOURCE, req.id), req.to_json())
        await asyncio.wait_for(done.wait(), 1800)
        seconds = time.perf_counter() - started
        cpu = {name: proc_cpu(p.pid) - c0 for name, p, c0 in zip(("parser", "sink"), procs, cpu0, strict=True)}
        peak = proc_peak_rss(procs[0].pid)
        await sub.unsubscribe()
        ends = sorted(arrivals.values())
        cycles = [(b - a) * 1000 for a, b in itertools.pairwise(ends)]
        if got != rows:
            raise SystemExit(f"BINLAKE_CDC holds {got} snapshot rows, the table {rows}")
        return Run(f"binlake snapshot -> BINLAKE_CDC (chunk {chunk_rows})", got, seconds, cycles,
                   (ends[0] - started) * 1000, cpu, peak)
    finally:
        await nc.close()
        stop_all(procs)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace, workdir: Path) -> int:
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    db = start_mariadb(workdir / "mariadb")
    try:
        ns = start_nats(workdir / "nats")
        try:
            t0 = time.perf_counter()
            fill(db, args.rows, args.keyless)
            print(f"table {DB}.{TABLE}: {args.rows:,} rows of 9 mixed columns{', no key' if args.keyless else ''}, "
                  f"filled in {time.perf_counter() - t0:.1f}s")
            base: list[Run] = []
            ours: list[Run] = []
            for i in range(args.runs):
                base.append(asyncio.run(baseline(db)))
                ours.append(asyncio.run(binlake(db, ns.url, args.rows, f"bench{i}", args.chunk_rows, logs)))
                cpu = "  ".join(f"{k} {v * 1e6 / args.rows:.2f}" for k, v in ours[-1].cpu_s.items())
                print(f"run {i + 1}: baseline {base[-1].rate:>10,.0f} rows/s   binlake {ours[-1].rate:>10,.0f} rows/s"
                      f"   CPU us/row: {cpu}   parser peak RSS {ours[-1].parser_peak / 2**20:.0f} MiB")
        finally:
            ns.stop()
    finally:
        db.stop()
    b = max(base, key=lambda r: r.rate)
    o = max(ours, key=lambda r: r.rate)
    cycles = [c for r in ours for c in r.cycles_ms]
    print()
    print(f"{b.name:<45} {b.rate:>12,.0f} rows/s  ({b.rows:,} rows in {b.seconds:.2f}s, best of {len(base)})")
    print(f"{o.name:<45} {o.rate:>12,.0f} rows/s  ({o.rows:,} rows in {o.seconds:.2f}s, best of {len(ours)})")
    pairs = [x.rate / y.rate for x, y in zip(ours, base, strict=True)]
    print(f"ratio binlake / SELECT *: {o.rate / b.rate:.3f}  (median of runs "
          f"{statistics.median(x.rate for x in ours) / statistics.median(x.rate for x in base):.3f}; "
          f"each run against the baseline read just before it: {' '.join(f'{r:.3f}' for r in pairs)}, "
          f"median {statistics.median(pairs):.3f})")
    print(f"chunk cycle in BINLAKE_CDC: p50 {pct(cycles, 0.5):.0f} ms  p95 {pct(cycles, 0.95):.0f} ms  "
          f"p99 {pct(cycles, 0.99):.0f} ms  ({len(cycles)} chunks)")
    print(f"request -> first chunk in BINLAKE_CDC: {statistics.median(r.first_ms for r in ours):.0f} ms (median)")
    for name in ("parser", "sink"):
        per_row = statistics.median(r.cpu_s[name] for r in ours) * 1e6 / args.rows
        print(f"{name} CPU during the snapshot: {per_row:.2f} us/row (median)")
    print(f"parser peak RSS: {max(r.parser_peak for r in ours) / 2**20:.0f} MiB (largest of the runs)")
    return 0


def main() -> None:
    ap = arguments(__doc__, "keep servers' files and service logs here (default: temp, removed)")
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--chunk-rows", type=int, default=4096)
    ap.add_argument("--keyless", action="store_true", help="the table has no key (pages of one consistent read)")
    run_in_workdir(run, ap.parse_args(), "binlake-bench-")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Loader benchmark: the lake's ingest rate against a plain Parquet append, and how it holds up as a table grows.

What is measured is the loader's lake (`services.loader.lake.Lake`), not NATS or MariaDB: the
CDC envelopes are generated here, in the format the parser publishes (DESIGN §4, msgpack with
the schema spliced in), so no MariaDB or nats-server is started. One keyed table of 8 mixed
columns (bigint key, varchar, decimal, datetime, timestamp(6), double, text, int) gets batches
of `--batch` row changes: ~75% inserts of new keys (multi-row events of 50 rows), ~20%
updates and ~5% deletes of random live keys (events of 1-10 rows, full before images), so the
table grows by ~35,000 rows a batch: 100k -> 2M rows is 55 batches, 2.75M changes (~8 minutes
on 2 cores). The table is preloaded with `--preload` rows and a small mixed warm-up batch (not
timed, then merged). For every batch, in one Spark session (local[2], 4g driver) and
interleaved (the order alternates per batch):

  (a) plain  the batch's CDC messages -> `envelope.decode` -> the changelog rows as Arrow
             (`frames.group(...).arrow_segments()`) -> `tables.arrow_to_spark` (pyspark
             3.5's createDataFrame(arrow)) -> `.write.mode("append").parquet(dir)`: the cost
             of writing the rows once, from the same CDC data, one step after the other
             (as the issue's first loader benchmark timed its plain writer). `write-only`
             is the last two steps alone (the Arrow built untimed): a stricter baseline,
             printed beside it.
  (b) loader what `services.loader.loader.Loader` does per batch minus the store round trip:
             `Lake.apply(seq, prepared)` (the Iceberg changelog append with its marker, the
             commits table, and a MERGE of the changelog tail into the current-state table
             whenever the loader's default `MergePolicy` (LoaderConfig merge_rows / merge_s)
             says it is due) while the next batch is read ahead in a worker thread
             (`read_ahead.decode` + `frames.prepare`: msgpack, grouping, Arrow), as
             `ReadAhead` does in the loader; the batch's time ends when both are done.

The merge policy's age clock runs only while (b) works, so (a) and the workload generator do
not make merges come earlier than they would in a loader running batches back to back. The
loader's hourly maintenance (compaction) is not run: a full run is shorter than an hour.

Printed: rows/s of (a) and (b) (row changes / the sum of their per-batch seconds), `ratio` =
b/a (target >= 0.5) and b/write-only, per-batch latency percentiles, the batches that included a merge and the
merge cost at the start vs the end, and `growth` = median seconds per batch of (b) over the
last quarter of batches / the first quarter (target <= 1.5). Then, outside the timing, the
lake's live view (`live.live_frame`: current table + un-merged tail) must hold exactly the rows
the generator left (count, sum of keys, sum of update counters) and the Parquet directory every
row appended; exits 1 if not.

    python3 -m bench.loader [--rows-to 2000000] [--batch 50000] [--preload 100000] [--workdir DIR]
    python3 -m bench.loader --rows-to 300000      # a quick run
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark
import structlog
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import arguments, percentile, run_in_workdir
from services.loader import frames, read_ahead
from services.loader.config import LoaderConfig
from services.loader.lake import Lake, MergePolicy
from services.loader.live import live_frame
from services.loader.spark import CatalogConfig, iceberg_jars, session
from services.loader.tables import LakeTable, arrow_to_spark, book_columns, data_types
from shared import envelope
from shared.store_client import Batch as StoreBatch

DB, TABLE = "bench", "orders"
COLUMNS: list[dict[str, Any]] = [
    {"name": "id", "type": "bigint", "nullable": False},
    {"name": "name", "type": "varchar", "nullable": False, "length": 256, "charset": "utf8mb4"},
    {"name": "amount", "type": "decimal", "nullable": False, "precision": 12, "scale": 2},
    {"name": "created", "type": "datetime", "nullable": False, "fsp": 0},
    {"name": "updated", "type": "timestamp", "nullable": False, "fsp": 6},
    {"name": "score", "type": "double", "nullable": True},
    {"name": "note", "type": "text", "nullable": True, "length": 2, "charset": "utf8mb4"},
    {"name": "rev", "type": "int", "nullable": False},
]
PK = ["id"]
SCHEMA = {"id": "bench-orders-v1", "columns": COLUMNS}
INSERT_EVENT_ROWS = 50  # a multi-row INSERT: as many rows as fit one 8 KiB binlog rows event
SMALL_EVENT_ROWS = (1, 10)  # OLTP UPDATE / DELETE statements
_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


# ----------------------------------------------------------------------------- the workload


class Workload:
    """CDC envelopes of one keyed table, and the table they leave (every key's update counter)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.rev: list[int] = [-1]  # by id: updates so far, -1 = not live
        self.slot: list[int] = [-1]  # by id: index in `live`
        self.live: list[int] = []
        self.seq = 0  # CDC sequence of the last message
        self.scn = (1 << 32) | 4
        self.txn = 0
        self.packed = envelope.pack_schema(SCHEMA)
        words = [f"{w}{i}" for i, w in enumerate(_WORDS * 40)]
        self.names = [" ".join(self.rng.sample(words, 3)) for _ in range(997)]
        self.notes = [" ".join(self.rng.choices(words, k=self.rng.randint(0, 30))) for _ in range(1009)]

    def row(self, key: int) -> dict[str, Any]:
        """Key `key` at its current update counter (every value follows from the two)."""
        rev = self.rev[key]
        h = (key * 0x9E3779B1 + rev * 0x85EBCA77) & 0xFFFFFFFF
        c = time.gmtime(1_500_000_000 + key * 7)
        u = time.gmtime(1_600_000_000 + key * 3 + rev * 86_400)
        return {"id": key, "name": self.names[h % 997], "amount": f"{h % 10**8}.{h % 100:02d}",
                "created": f"{c.tm_year:04d}-{c.tm_mon:02d}-{c.tm_mday:02d}T{c.tm_hour:02d}:{c.tm_min:02d}:"
                           f"{c.tm_sec:02d}",
                "updated": f"{u.tm_year:04d}-{u.tm_mon:02d}-{u.tm_mday:02d}T{u.tm_hour:02d}:{u.tm_min:02d}:"
                           f"{u.tm_sec:02d}.{h % 1_000_000:06d}Z",
                "score": None if h % 13 == 0 else (h % 1_000_000) / 997.0,
                "note": None if h % 17 == 0 else self.notes[(h >> 7) % 1009], "rev": rev}

    def _message(self, op: str, rows: list[dict[str, Any]]) -> tuple[int, bytes]:
        self.seq += 1
        self.scn += 64 + 8 * len(rows)
        self.txn += 1
        gtid = f"0-1-{self.txn}"
        pos = {"file": "mysql-bin.000001", "offset": self.scn & 0xFFFFFFFF, "gtid": gtid}
        fields = {"v": envelope.VERSION, "source": "bench", "db": DB, "table": TABLE, "op": op,
                  "ts": 1_700_000_000_000 + self.seq, "pos": pos, "scn": self.scn,
                  "txn": {"id": gtid, "i": 0, "last": True}, "pk": PK, "rows": rows, "resume": pos}
        return self.seq, envelope.encode(fields, self.packed)

    def _insert(self, n: int) -> tuple[int, bytes]:
        rows = []
        for _ in range(n):
            key = len(self.rev)
            self.rev.append(0)
            self.slot.append(len(self.live))
            self.live.append(key)
            rows.append({"after": self.row(key)})
        return self._message("i", rows)

    def _update(self, n: int) -> tuple[int, bytes]:
        rows = []
        for i in self.rng.sample(range(len(self.live)), n):
            key = self.live[i]
            before = self.row(key)
            self.rev[key] += 1
            rows.append({"before": before, "after": self.row(key)})
        return self._message("u", rows)

    def _delete(self, n: int) -> tuple[int, bytes]:
        keys = [self.live[i] for i in self.rng.sample(range(len(self.live)), n)]
        rows = []
        for key in keys:
            rows.append({"before": self.row(key)})
            i, last = self.slot[key], self.live[-1]
            self.live[i], self.slot[last] = last, i  # swap-remove
            self.live.pop()
            self.rev[key], self.slot[key] = -1, -1
        return self._message("d", rows)

    def batch(self, rows: int, inserts_only: bool = False) -> list[tuple[int, bytes]]:
        """`rows` row changes: 75% inserts, 20% updates, 5% deletes, events shuffled."""
        ins = rows if inserts_only else round(rows * 0.75)
        upd = 0 if inserts_only else round(rows * 0.20)
        plan = _chunks(ins, INSERT_EVENT_ROWS, "i") + self._small(upd, "u") + self._small(rows - ins - upd, "d")
        self.rng.shuffle(plan)
        make = {"i": self._insert, "u": self._update, "d": self._delete}
        return [make[op](n) for op, n in plan]

    def _small(self, rows: int, op: str) -> list[tuple[str, int]]:
        out = []
        while rows > 0:
            n = min(rows, self.rng.randint(*SMALL_EVENT_ROWS))
            out.append((op, n))
            rows -= n
        return out

    def expected(self) -> tuple[int, int, int]:
        """(rows, sum of keys, sum of update counters) of the live table."""
        return len(self.live), sum(self.live), sum(self.rev[k] for k in self.live)


def _chunks(rows: int, size: int, op: str) -> list[tuple[str, int]]:
    return [(op, min(size, rows - i)) for i in range(0, rows, size)]


# ----------------------------------------------------------------------------- the two writers


class LoaderClock:
    """Monotonic time that runs only while the loader works: the merge policy's age clock."""

    def __init__(self) -> None:
        self._spent = 0.0
        self._since: float | None = None

    def __call__(self) -> float:
        return self._spent + (0.0 if self._since is None else time.monotonic() - self._since)

    @contextmanager
    def running(self) -> Iterator[None]:
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._spent += time.monotonic() - self._since
            self._since = None


@dataclass
class TimedLake(Lake):
    """The loader's Lake, recording the seconds of every merge of a changelog tail."""

    merges: list[float] = field(default_factory=list)

    def flush(self, table: LakeTable, batch: int) -> None:
        if not table.tail_rows:
            return
        started = time.perf_counter()
        super().flush(table, batch)
        self.merges.append(time.perf_counter() - started)


@dataclass
class Batch:
    rows: int  # row changes
    live: int  # rows of the table after the batch
    plain_s: float  # (a): decode + group + Arrow + write
    write_s: float  # (a)'s write alone (the Arrow built before)
    loader_s: float  # (b): Lake.apply (merges included) + waiting for the next batch's read-ahead
    ahead_s: float  # (b)'s read-ahead of the next batch (decode + group + Arrow), overlapped with Lake.apply
    group_s: float  # (a)'s envelope.decode + frames.group + Arrow
    merges: list[float]


class Bench:
    """The two writers of the same batches: (a) plain Parquet, (b) the loader's lake."""

    def __init__(self, spark: SparkSession, lake: TimedLake, clock: LoaderClock, plain_dir: Path) -> None:
        self.spark, self.lake, self.clock, self.plain_dir = spark, lake, clock, plain_dir
        self.plain_columns = book_columns(data_types(COLUMNS), PK)
        self.plain_rows = 0
        self.ready: frames.Prepared | None = None  # (b)'s read-ahead of the batch it writes next
        self.pool = ThreadPoolExecutor(1)

    def plain(self, raw: list[tuple[int, bytes]]) -> tuple[float, float, int]:
        """(a): (seconds to write, seconds of envelope.decode + frames.group + Arrow before it, rows)."""
        started = time.perf_counter()
        events = read_ahead.decode(_batch(raw))
        arrows = [a for changes in frames.group(events).values()
                  for step in changes.steps if isinstance(step, frames.Rows) for a in step.arrow_segments()]
        built = time.perf_counter()
        for arrow in arrows:
            arrow_to_spark(self.spark, arrow, self.plain_columns).write.mode("append").parquet(str(self.plain_dir))
        rows = sum(a.num_rows for a in arrows)
        self.plain_rows += rows
        return time.perf_counter() - built, built - started, rows

    def loader(self, raw: list[tuple[int, bytes]], following: list[tuple[int, bytes]] | None
               ) -> tuple[float, float, int, list[float]]:
        """(b) as `Loader` runs it: Lake.apply of this batch while the next one is read ahead (decoded,
        grouped, in Arrow) in a worker thread. Returns (seconds, read-ahead seconds, rows, merge seconds)."""
        before = len(self.lake.merges)
        with self.clock.running():
            started = time.perf_counter()
            prepared = self.ready or frames.prepare(read_ahead.decode(_batch(raw)))  # the first: nothing ran ahead
            ahead = self.pool.submit(_timed_prepare, following) if following else None
            rows = self.lake.apply(raw[-1][0], prepared)
            self.ready, ahead_s = ahead.result() if ahead else (None, 0.0)
            done = time.perf_counter()
        return done - started, ahead_s, rows, self.lake.merges[before:]

    def batch(self, raw: list[tuple[int, bytes]], following: list[tuple[int, bytes]] | None, live: int,
              plain_first: bool) -> Batch:
        if plain_first:
            write_s, group_s, n = self.plain(raw)
            loader_s, ahead_s, written, merges = self.loader(raw, following)
        else:
            loader_s, ahead_s, written, merges = self.loader(raw, following)
            write_s, group_s, n = self.plain(raw)
        if n != written:
            raise RuntimeError(f"the lake wrote {written} rows of a batch, the plain append {n}")
        return Batch(written, live, group_s + write_s, write_s, loader_s, ahead_s, group_s, merges)


def _batch(raw: list[tuple[int, bytes]]) -> StoreBatch:
    return StoreBatch(raw[-1][0], [r for _, r in raw], 0, [s for s, _ in raw])


def _timed_prepare(raw: list[tuple[int, bytes]]) -> tuple[frames.Prepared, float]:
    started = time.perf_counter()
    prepared = frames.prepare(read_ahead.decode(_batch(raw)))
    return prepared, time.perf_counter() - started


# ----------------------------------------------------------------------------- report


def pct(values: list[float]) -> str:
    s = sorted(values)
    return (f"p50 {percentile(s, 50):.2f} s, p95 {percentile(s, 95):.2f} s, p99 {percentile(s, 99):.2f} s, "
            f"max {s[-1]:.2f} s" if s else "-")


def report(batches: list[Batch], start: int, merge_rows: list[int]) -> None:
    rows = sum(b.rows for b in batches)
    plain_s = sum(b.plain_s for b in batches)
    loader_s = sum(b.loader_s for b in batches)
    write_s = sum(b.write_s for b in batches)
    a, b, w = rows / plain_s, rows / loader_s, rows / write_s
    print(f"---- {len(batches)} timed batches, {rows:,} row changes, table {start:,} -> "
          f"{batches[-1].live:,} rows (live)")
    print(f"(a) plain Parquet    : {a:>9,.0f} rows/s ({plain_s:.1f} s); batch {pct([x.plain_s for x in batches])}")
    print(f"    of which decode  : {pct([x.group_s for x in batches])}  (envelope.decode + frames.group + Arrow)")
    print(f"    write-only       : {w:>9,.0f} rows/s ({write_s:.1f} s); batch {pct([x.write_s for x in batches])}")
    print(f"(b) loader           : {b:>9,.0f} rows/s ({loader_s:.1f} s); batch {pct([x.loader_s for x in batches])}")
    print(f"    read-ahead       : {pct([x.ahead_s for x in batches])}  (the next batch's envelope.decode + "
          "frames.group + Arrow, in a worker thread while Lake.apply runs)")
    merged = [x for x in batches if x.merges]
    plain = [x for x in batches if not x.merges]
    print(f"    without a merge  : {len(plain)} batches, {pct([x.loader_s for x in plain])}")
    print(f"    with a merge     : {len(merged)} batches, {pct([x.loader_s for x in merged])}")
    timed = [m for x in batches for m in x.merges]
    if timed:
        shown = ", ".join(f"{s:.1f} s @ {r / 1e6:.2f}M" for s, r in zip(timed, merge_rows, strict=True))
        print(f"merges (s @ table)   : {shown}")
        print(f"merge cost           : first {timed[0]:.1f} s (table {merge_rows[0]:,} rows) -> last {timed[-1]:.1f} s "
              f"(table {merge_rows[-1]:,} rows), x{timed[-1] / timed[0]:.2f}; {sum(timed):.1f} s in all = "
              f"{sum(timed) / loader_s:.0%} of (b)")
    q = max(1, len(batches) // 4)
    first, last = [x.loader_s for x in batches[:q]], [x.loader_s for x in batches[-q:]]
    growth = statistics.median(last) / statistics.median(first)
    mean_growth = statistics.fmean(last) / statistics.fmean(first)
    print(f"quarters ({q} batches) : median {statistics.median(first):.2f} s -> {statistics.median(last):.2f} s; "
          f"mean (merges spread in) {statistics.fmean(first):.2f} s -> {statistics.fmean(last):.2f} s "
          f"(x{mean_growth:.2f}, informational)")
    print("---- summary")
    print(f"rows/s               : loader {b:,.0f}, plain Parquet append {a:,.0f} (write-only {w:,.0f})")
    print(f"ratio                : {b / a:.2f}  (b/a, target >= 0.5: {'met' if b / a >= 0.5 else 'MISSED'}); "
          f"b/write-only {b / w:.2f}")
    print(f"growth               : {growth:.2f}  (median s/batch last quarter / first quarter, target <= 1.5: "
          f"{'met' if growth <= 1.5 else 'MISSED'})")
    print(f"loader batch latency : {pct([x.loader_s for x in batches])}")


def check(spark: SparkSession, wl: Workload, plain_dir: Path, plain_rows: int) -> list[str]:
    """The lake's live view holds the generator's table; the Parquet directory every appended row."""
    problems = []
    df = live_frame(spark, "lake", DB, TABLE)
    if df is None:
        return [f"no lake table {DB}.{TABLE}"]
    got = df.agg(F.count(F.lit(1)), F.sum("id"), F.sum("rev")).collect()[0]
    have = (int(got[0]), int(got[1] or 0), int(got[2] or 0))
    want = wl.expected()
    print(f"check                : live view {have[0]:,} rows (sum id {have[1]}, sum rev {have[2]}), "
          f"expected {want[0]:,} ({want[1]}, {want[2]})")
    if have != want:
        problems.append(f"the live view holds (rows, sum id, sum rev) {have}, expected {want}")
    written = spark.read.parquet(str(plain_dir)).count()
    print(f"check                : plain Parquet {written:,} rows, appended {plain_rows:,}")
    if written != plain_rows:
        problems.append(f"the Parquet directory holds {written} rows, {plain_rows} were appended")
    return problems


# ----------------------------------------------------------------------------- main


def stop(spark: SparkSession) -> None:
    """Stop Spark and the py4j callback server MERGE commits start (a non-daemon thread: exit would hang)."""
    gateway = spark.sparkContext._gateway
    if gateway is not None:
        gateway.shutdown_callback_server()
    spark.stop()


def preload(bench: Bench, wl: Workload, rows: int, batch: int) -> None:
    """Not timed: the table the timed batches start from, merged. A small mixed batch at the end warms
    the update and delete paths (MERGE with position deletes) that inserts alone do not reach."""
    started = time.monotonic()
    while len(wl.live) < rows:
        raw = wl.batch(min(batch, rows - len(wl.live)), inserts_only=True)
        bench.plain(raw)
        bench.loader(raw, None)
    warm = max(1, batch // 10)
    raw = wl.batch(warm)
    bench.plain(raw)
    bench.loader(raw, None)
    bench.lake.merge_all()
    bench.lake.merges.clear()
    print(f"preload              : {len(wl.live):,} rows ({rows:,} inserted, then a warm-up batch of {warm:,} mixed "
          f"changes), loaded and merged in {time.monotonic() - started:.1f} s (not timed)")


def measure(bench: Bench, wl: Workload, rows_to: int, batch: int) -> tuple[list[Batch], list[int]]:
    """The timed batches until the table holds `rows_to` rows; and the table's rows at each merge.

    Each batch is generated one ahead (untimed), so that (b) can read it ahead as the loader
    does; the extra batch generated last is written untimed at the end."""
    batches: list[Batch] = []
    merge_rows: list[int] = []
    raw, live = wl.batch(batch), len(wl.live)
    while True:
        following, next_live = wl.batch(batch), len(wl.live)
        b = bench.batch(raw, following, live, plain_first=len(batches) % 2 == 0)
        batches.append(b)
        merge_rows += [b.live] * len(b.merges)
        print(f"batch {len(batches):>3}            : table {b.live:>9,}  (a) {b.plain_s:5.2f} s  "
              f"(b) {b.loader_s:5.2f} s" + (f"  merge {b.merges[0]:.1f} s" if b.merges else ""))
        raw, live = following, next_live
        if b.live >= rows_to:
            break
    bench.plain(raw)  # the batch generated one ahead, not timed
    bench.loader(raw, None)
    return batches, merge_rows


def run(args: argparse.Namespace, workdir: Path) -> int:
    t0 = time.monotonic()
    cfg = LoaderConfig()
    policy = MergePolicy(args.merge_rows or cfg.merge_rows, args.merge_s or cfg.merge_s)
    spark = session("bench-loader", "local[2]", CatalogConfig(warehouse=str(workdir / "lake")),
                    {"spark.driver.memory": args.driver_memory, "spark.local.dir": str(workdir / "spark")})
    try:
        print(f"setup                : pyspark {pyspark.__version__}, {Path(iceberg_jars()[0]).name}, local[2], "
              f"driver {args.driver_memory}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
              f"Spark up in {time.monotonic() - t0:.1f} s")
        print(f"workload             : {DB}.{TABLE}, 8 columns, key id; batches of {args.batch:,} changes "
              f"(75% inserts, 20% updates, 5% deletes); MergePolicy(rows={policy.rows:,}, age_s={policy.age_s:g})")
        clock = LoaderClock()
        lake = TimedLake(spark, "lake", policy, clock=clock)
        lake.open()
        bench = Bench(spark, lake, clock, workdir / "plain")
        wl = Workload(args.seed)
        preload(bench, wl, args.preload, args.batch)
        start = len(wl.live)
        batches, merge_rows = measure(bench, wl, args.rows_to, args.batch)
        report(batches, start, merge_rows)
        problems = check(spark, wl, bench.plain_dir, bench.plain_rows)
    finally:
        stop(spark)
    for p in problems:
        print(f"CORRECTNESS: {p}")
    print(f"wall time            : {time.monotonic() - t0:.0f} s (load average {os.getloadavg()[0]:.1f} at the end)")
    return 1 if problems else 0


def main() -> None:
    ap = arguments(__doc__, "keep the lake and the Parquet files here (default: temp, removed)")
    ap.add_argument("--rows-to", type=int, default=2_000_000, help="grow the table to this many rows (default 2M)")
    ap.add_argument("--batch", type=int, default=50_000, help="row changes per batch (default 50000)")
    ap.add_argument("--preload", type=int, default=100_000, help="rows loaded before timing (default 100000)")
    ap.add_argument("--merge-rows", type=int, default=0, help="MergePolicy rows (default: LoaderConfig's)")
    ap.add_argument("--merge-s", type=float, default=0.0, help="MergePolicy age_s (default: LoaderConfig's)")
    ap.add_argument("--driver-memory", default="4g", help="spark.driver.memory (default 4g)")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    if args.preload < max(10, args.batch // 10):
        ap.error("--preload must be at least --batch / 10 (updates and deletes need live keys)")
    if args.rows_to <= args.preload:
        ap.error("--rows-to must be above --preload")
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # progress lines show up when piped
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    run_in_workdir(run, args, "binlake-bench-loader-")


if __name__ == "__main__":
    main()

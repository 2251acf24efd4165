#!/usr/bin/env python
"""Sink benchmark: bare pull consumer vs. `python -m services.sink` with 1 and 2 workers.

Starts a private nats-server (tests/servers.py) and fills BINLAKE_RAW with N synthetic row
changes in the parser's envelope format, without MySQL: 8 tables in 2 databases, half of
the rows in single-row transactions and half in bulk transactions of 1-4 statements of 50
rows, published like the parser does (msg ids, `Nats-Expected-Last-Msg-Id` chain). Then

  (base) a bare ephemeral pull consumer (AckNone, fetch 500) reads the whole raw stream,
  (w1)   one sink worker process routes everything into a fresh BINLAKE_CDC,
  (w2)   two sink worker processes do the same, after BINLAKE_CDC and the sink's KV buckets
         (cursors, members) were deleted; once caught up, paced single-row messages
         measure the live raw->CDC latency,

and reports rows/s and msgs/s, the ratios worker/baseline, CPU per process and the
raw->CDC latency from the stored timestamps. Exits non-zero unless, after each worker run,
every raw message id is in BINLAKE_CDC exactly once, with the raw payload, on its table's
CDC subject, and in strictly increasing scn order per subject.

    python3 -m bench.sink [--changes 200000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, PubAck

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
from services.launcher.processes import clean_env, spawn
from services.launcher.servers import NatsServer, start_nats
from shared import envelope
from shared.jetstream import ensure_stream, raw_stream_config
from shared.subjects import Names

SOURCE = "main"
PARTITIONS = 16
NAMES = Names()
BULK_ROWS = 50  # rows per bulk statement (one rows event = one message)
SINGLE_SHARE = 0.5  # share of the rows that travel in single-row transactions
FETCH = 500
PUBLISH_WINDOW = 2000  # publish_async futures awaited together
BINLOG_MAX = 1 << 30  # the source rotates its binlog after 1 GiB
STOP_TIMEOUT_S = 40.0  # longer than nats-py's drain_timeout (30 s), so a slow stop is measured, not cut
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
RAW_SEQ = "Binlake-Raw-Seq"

# Column kinds: how each travels in the envelope's `schema` (as services/parser/columns.py
# describes it) and a value generator in the envelope's value mapping (DESIGN §4).
ValueMaker = Callable[[random.Random], Any]
STATUSES = ("new", "paid", "shipped", "cancelled", "refunded")
WORDS = ("alpha", "beta", "gamma", "delta", "über", "naïve", "漢字", "lorem", "ipsum", "dolor", "sit", "amet")


def _dt(rng: random.Random) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1.6e9 + rng.randrange(10**8)))


def _ts(rng: random.Random) -> str | None:
    return None if rng.random() < 0.1 else f"{_dt(rng)}.{rng.randrange(1000):03d}Z"


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


KINDS: dict[str, tuple[dict[str, Any], ValueMaker]] = {
    "ref": ({"type": "bigint", "nullable": False, "unsigned": True}, lambda r: r.randrange(1, 10**7)),
    "int": ({"type": "int", "nullable": True}, lambda r: None if r.random() < 0.05 else r.randrange(1000)),
    "flag": ({"type": "tinyint", "nullable": False}, lambda r: r.randint(0, 1)),
    "money": ({"type": "decimal", "nullable": False, "precision": 12, "scale": 2},
              lambda r: f"{r.randrange(10**6)}.{r.randrange(100):02d}"),
    "name": ({"type": "varchar", "nullable": True, "length": 1020, "charset": "utf8mb4"}, lambda r: _text(r, 1, 3)),
    "email": ({"type": "varchar", "nullable": False, "length": 1020, "charset": "utf8mb4"},
              lambda r: f"user{r.randrange(10**7)}@example.com"),
    "code": ({"type": "char", "nullable": False, "length": 12, "charset": "utf8mb4"},
             lambda r: r.choice(("EUR", "USD", "GBP", "CHF", "JPY"))),
    "text": ({"type": "text", "nullable": True, "charset": "utf8mb4"}, lambda r: _text(r, 0, 40)),
    "json": ({"type": "json", "nullable": True},
             lambda r: json.dumps({"v": r.random(), "tags": r.sample(WORDS, 2)}, ensure_ascii=False)),
    "dt": ({"type": "datetime", "nullable": True, "fsp": 0}, _dt),
    "ts": ({"type": "timestamp", "nullable": True, "fsp": 3}, _ts),
    "status": ({"type": "enum", "nullable": False, "values": list(STATUSES), "charset": "utf8mb4"},
               lambda r: r.choice(STATUSES)),
}


@dataclass(frozen=True)
class Table:
    """One source table: its columns (`id` first, the primary key) and its packed schema."""

    db: str
    name: str
    columns: tuple[tuple[str, str], ...]  # (column, kind)
    packed: bytes = field(init=False)

    def __post_init__(self) -> None:
        cols = [{"name": "id", "type": "bigint", "nullable": False, "unsigned": True}]
        cols += [{"name": col, **KINDS[kind][0]} for col, kind in self.columns]
        sid = hashlib.blake2b(envelope.pack_schema({"c": cols, "pk": ["id"]}), digest_size=8).hexdigest()
        object.__setattr__(self, "packed", envelope.pack_schema({"id": sid, "columns": cols}))

    @property
    def key(self) -> str:
        return f"{self.db}.{self.name}"

    @property
    def partition(self) -> int:
        return int(NAMES.raw_stored(SOURCE, self.db, self.name, PARTITIONS).split(".")[3])

    def row(self, rng: random.Random, pk: int) -> dict[str, Any]:
        out: dict[str, Any] = {"id": pk}
        for col, kind in self.columns:
            out[col] = KINDS[kind][1](rng)
        return out


TABLES = (
    Table("shop", "orders", (("customer_id", "ref"), ("status", "status"), ("total", "money"), ("currency", "code"),
                             ("created_at", "dt"), ("updated_at", "ts"), ("note", "text"))),
    Table("shop", "order_items", (("order_id", "ref"), ("sku", "name"), ("qty", "int"), ("price", "money"))),
    Table("shop", "customers", (("email", "email"), ("name", "name"), ("country", "code"), ("created_at", "dt"),
                                ("profile", "json"))),
    Table("shop", "payments", (("order_id", "ref"), ("amount", "money"), ("method", "code"), ("status", "status"),
                               ("paid_at", "ts"))),
    Table("crm", "contacts", (("email", "email"), ("name", "name"), ("company", "name"), ("vip", "flag"),
                              ("updated_at", "ts"))),
    Table("crm", "events", (("contact_id", "ref"), ("kind", "status"), ("payload", "json"), ("at", "ts"))),
    Table("crm", "notes", (("contact_id", "ref"), ("body", "text"), ("created_at", "dt"))),
    Table("crm", "tasks", (("owner_id", "int"), ("title", "name"), ("due", "dt"), ("done", "flag"))),
)


# ----------------------------------------------------------------------------- synthetic binlog


@dataclass(slots=True)
class RawMessage:
    """One envelope ready for BINLAKE_RAW, as the parser's Outgoing."""

    subject: str
    data: bytes
    headers: dict[str, str]
    op: str
    rows: int
    table: str


@dataclass
class Mix:
    """What was published to BINLAKE_RAW."""

    rows: int = 0
    messages: int = 0
    transactions: int = 0
    rows_per_message: Counter[int] = field(default_factory=Counter)
    rows_by_op: Counter[str] = field(default_factory=Counter)
    messages_by_table: Counter[str] = field(default_factory=Counter)
    bytes: int = 0
    seconds: float = 0.0

    def add(self, msgs: list[RawMessage]) -> None:
        self.transactions += 1
        for m in msgs:
            self.messages += 1
            self.rows += m.rows
            self.rows_per_message[m.rows] += 1
            self.rows_by_op[m.op] += m.rows
            self.messages_by_table[m.table] += 1
            self.bytes += len(m.data)


class ChangeLog:
    """Binlog transactions turned into envelopes with the shape services/parser/transactions.py gives.

    MariaDB-style GTIDs `0-1-N`, one binlog file until it reaches 1 GiB, positions growing with
    plausible event sizes; `scn`, `Nats-Msg-Id` and `resume` are derived as the parser does.
    """

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.file_no = 1
        self.offset = 256
        self.gtid_no = 0
        self.ts_ms = int(time.time() * 1000) - 3_600_000
        self.ids = {t.key: TableState() for t in TABLES}
        self.last_mid: str | None = None

    @property
    def file(self) -> str:
        return f"mysql-bin.{self.file_no:06d}"

    def _op(self, table: Table, weights: tuple[int, int, int], k: int) -> str:
        op = self.rng.choices("iud", weights)[0]
        state = self.ids[table.key]
        return op if op == "i" or state.next_id - state.live_lo >= k else "i"

    def _rows(self, table: Table, op: str, k: int) -> list[dict[str, Any]]:
        lo, hi = self.ids[table.key].take(op, k)
        if op == "i":
            return [{"after": table.row(self.rng, i)} for i in range(lo, hi + 1)]
        if op == "u":
            return [{"before": table.row(self.rng, i), "after": table.row(self.rng, i)} for i in range(lo, hi + 1)]
        return [{"before": table.row(self.rng, i)} for i in range(lo, hi + 1)]

    def single(self) -> list[RawMessage]:
        """A one-row transaction (OLTP): 50% insert, 40% update, 10% delete."""
        table = self.rng.choice(TABLES)
        return self.transaction([(table, self._op(table, (5, 4, 1), 1), 1)])

    def bulk(self, rows: int) -> list[RawMessage]:
        """A batch transaction of `rows` rows in statements of BULK_ROWS: 60% i, 30% u, 10% d."""
        statements: list[tuple[Table, str, int]] = []
        while rows > 0:
            k = min(BULK_ROWS, rows)
            table = self.rng.choice(TABLES)
            statements.append((table, self._op(table, (6, 3, 1), k), k))
            rows -= k
        return self.transaction(statements)

    def transaction(self, statements: list[tuple[Table, str, int]]) -> list[RawMessage]:
        if self.offset > BINLOG_MAX:
            self.file_no, self.offset = self.file_no + 1, 256
        self.gtid_no += 1
        gtid = f"0-1-{self.gtid_no}"
        start = {"file": self.file, "offset": self.offset, "gtid": f"0-1-{self.gtid_no - 1}" if self.gtid_no > 1
                 else None}
        self.offset += 42  # GTID event
        self.ts_ms += self.rng.randint(0, 3)
        envs: list[tuple[Table, dict[str, Any]]] = []
        for i, (table, op, k) in enumerate(statements):
            rows = self._rows(table, op, k)
            self.offset += 60  # table map
            pos = {"file": self.file, "offset": self.offset, "gtid": gtid}
            envs.append((table, {"v": envelope.VERSION, "source": SOURCE, "db": table.db, "table": table.name,
                                 "op": op, "ts": self.ts_ms, "pos": pos, "scn": envelope.scn(self.file, self.offset),
                                 "chunk": 0, "txn": {"id": gtid, "i": i, "last": False}, "pk": ["id"],
                                 "rows": rows}))
            self.offset += 40 + 110 * len(rows)  # rows event
        self.offset += 31  # XID
        end = {"file": self.file, "offset": self.offset, "gtid": gtid}
        out = []
        for n, (table, env) in enumerate(envs):
            last = n == len(envs) - 1
            env["txn"]["last"] = last
            env["resume"] = end if last else start
            mid = envelope.msg_id(SOURCE, env["scn"], env["chunk"])
            headers = envelope.headers(env, mid)
            if self.last_mid is not None:
                headers[EXPECTED_LAST_MSG_ID] = self.last_mid
            self.last_mid = mid
            out.append(RawMessage(NAMES.raw(SOURCE, table.db, table.name), envelope.encode(env, table.packed),
                                  headers, env["op"], len(env["rows"]), table.key))
        return out


def workload(log: ChangeLog, changes: int) -> Iterator[list[RawMessage]]:
    """Transactions holding exactly `changes` rows, single-row and bulk ones evenly interleaved."""
    single_left = round(changes * SINGLE_SHARE)
    bulk_left = changes - single_left
    mean_bulk = 2.5 * BULK_ROWS  # 1-4 statements per bulk transaction
    while single_left or bulk_left:
        if log.rng.random() < single_left / (single_left + bulk_left / mean_bulk):
            single_left -= 1
            yield log.single()
        else:
            rows = min(bulk_left, log.rng.randint(1, 4) * BULK_ROWS)
            bulk_left -= rows
            yield log.bulk(rows)


async def settle(futures: list[asyncio.Future[PubAck]], limit_s: float = 60.0) -> None:
    """Wait for publish_async acks (bounded: nats.py #985 futures may hang); no duplicates allowed."""
    try:
        acks = await asyncio.wait_for(asyncio.gather(*futures), limit_s)
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    dups = sum(1 for a in acks if a.duplicate)
    if dups:
        raise RuntimeError(f"{dups} raw messages were duplicates; the stream was not fresh")
    futures.clear()


async def prefill(js: JetStreamContext, log: ChangeLog, changes: int) -> Mix:
    """Create BINLAKE_RAW and publish the workload with publish_async + msg ids."""
    await ensure_stream(js, raw_stream_config(NAMES, PARTITIONS))
    mix, futures = Mix(), []
    t0 = time.perf_counter()
    for txn in workload(log, changes):
        mix.add(txn)
        for m in txn:
            futures.append(await js.publish_async(m.subject, m.data, headers=m.headers))
        if len(futures) >= PUBLISH_WINDOW:
            await settle(futures)
    await settle(futures)
    mix.seconds = time.perf_counter() - t0
    state = (await js.stream_info(NAMES.raw_stream)).state
    if state.messages != mix.messages:
        raise RuntimeError(f"{NAMES.raw_stream} holds {state.messages} messages, published {mix.messages}")
    return mix


# ----------------------------------------------------------------------------- reading streams


@dataclass(frozen=True, slots=True)
class Stored:
    """One stored message, reduced to what the checks need."""

    seq: int
    subject: str
    msg_id: str
    stored: float  # server timestamp, epoch seconds
    scn: int
    chunk: int
    rows: int
    digest: int  # hash of the payload
    raw_seq: int  # Binlake-Raw-Seq header (CDC only)
    chained: bool  # carries Nats-Expected-Last-Msg-Id


def stored(m: Msg) -> Stored:
    env = envelope.as_dict(envelope.decode(m.data))
    hdrs = m.headers or {}
    return Stored(m.metadata.sequence.stream, m.subject, hdrs.get("Nats-Msg-Id", ""),
                  m.metadata.timestamp.timestamp(), env["scn"], env.get("chunk", 0), len(env.get("rows") or ()),
                  hash(m.data), int(hdrs.get(RAW_SEQ, 0)), EXPECTED_LAST_MSG_ID in hdrs)


async def drop_consumer(js: JetStreamContext, stream: str, sub: JetStreamContext.PullSubscription) -> None:
    """Unsubscribe and delete an ephemeral consumer now (not after its inactive threshold), so that
    BINLAKE_RAW's consumer count shows the sink's consumers only."""
    with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
        name = (await sub.consumer_info()).name
        await sub.unsubscribe()
        await js.delete_consumer(stream, name)


async def read_all(js: JetStreamContext, stream: str) -> list[Stored]:
    """Every message of `stream` in order (ephemeral AckNone pull consumer, gap-checked)."""
    info = await js.stream_info(stream)
    last_seq = info.state.last_seq
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, mem_storage=True,
                            inactive_threshold=60.0)
    sub = await js.pull_subscribe((info.config.subjects or [">"])[0], stream=stream, config=config)
    out: list[Stored] = []
    try:
        expected = 1
        while expected <= last_seq:
            for m in await sub.fetch(FETCH, timeout=10):
                if m.metadata.sequence.stream != expected:
                    raise RuntimeError(f"read of {stream} got seq {m.metadata.sequence.stream}, expected {expected}")
                out.append(stored(m))
                expected += 1
    finally:
        await drop_consumer(js, stream, sub)
    return out


# ----------------------------------------------------------------------------- CPU accounting


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _machine_busy() -> float:
    """CPU seconds all processes of the machine spent busy since boot (/proc/stat, idle and iowait excluded)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuMeter:
    """CPU seconds of this benchmark, nats-server and the whole machine over one measured interval."""

    nats_pid: int
    t0: float = field(default_factory=time.perf_counter)
    self0: float = field(default_factory=_self_cpu)
    machine0: float = field(default_factory=_machine_busy)
    nats0: float = 0.0

    def __post_init__(self) -> None:
        self.nats0 = proc_cpu(self.nats_pid)

    def read(self, workers: dict[str, float]) -> dict[str, float]:
        """Per process CPU seconds (sink workers given, all CPU they used since their start), plus the rest."""
        out = {**workers, "nats-server": proc_cpu(self.nats_pid) - self.nats0, "bench": _self_cpu() - self.self0}
        out["other processes"] = max(0.0, _machine_busy() - self.machine0 - sum(out.values()))
        return out


# ----------------------------------------------------------------------------- (base) bare consumer


@dataclass
class Run:
    """One measured run."""

    name: str
    messages: int
    rows: int
    seconds: float  # the rate's interval
    wall_s: float = 0.0  # from process start until everything is in BINLAKE_CDC
    startup_s: float = 0.0  # from process start until the first CDC message was stored
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds during the run
    rss_mb: dict[str, float] = field(default_factory=dict)
    backlog_ms: list[float] = field(default_factory=list)
    live_ms: list[float] = field(default_factory=list)
    raw_consumers: int = 0  # consumers on BINLAKE_RAW when caught up (the workers own 16 partitions)
    stops: list[tuple[int | None, float]] = field(default_factory=list)  # (exit code, seconds) after SIGTERM

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def msg_rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


async def run_baseline(js: JetStreamContext, ns: NatsServer) -> Run:
    """Read all of BINLAKE_RAW with one ephemeral pull consumer, AckNone, fetch(500); rows from headers."""
    total = (await js.stream_info(NAMES.raw_stream)).state.messages
    meter = CpuMeter(ns.proc.pid if ns.proc else 0)
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, mem_storage=True,
                            inactive_threshold=60.0)
    t0 = time.perf_counter()
    sub = await js.pull_subscribe(NAMES.raw_source_filter(SOURCE), stream=NAMES.raw_stream, config=config)
    messages = rows = 0
    try:
        while messages < total:
            for m in await sub.fetch(FETCH, timeout=10):
                messages += 1
                rows += int((m.headers or {}).get("Binlake-Rows", 0))
    finally:
        seconds = time.perf_counter() - t0
        await drop_consumer(js, NAMES.raw_stream, sub)
    return Run("baseline", messages, rows, seconds, wall_s=seconds, cpu=meter.read({}))


# ----------------------------------------------------------------------------- sink workers


def sink_env(nats_url: str, instance: str) -> dict[str, str]:
    """Environment of one sink worker (no inherited BINLAKE_* settings, default prefix)."""
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(BINLAKE_NATS_URL=nats_url, BINLAKE_METRICS_PORT="-1", BINLAKE_INSTANCE=instance,
               BINLAKE_SOURCE=SOURCE)
    return env


def stop_all(procs: list[subprocess.Popen[bytes]]) -> list[tuple[int | None, float]]:
    """SIGTERM every process at once; (exit code, seconds until it exited), SIGKILL after STOP_TIMEOUT_S."""
    t0 = time.monotonic()
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    out: list[tuple[int | None, float]] = []
    for p in procs:
        try:
            p.wait(timeout=max(0.1, t0 + STOP_TIMEOUT_S - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        out.append((p.returncode, time.monotonic() - t0))
    return out


@contextlib.contextmanager
def sink_processes(nats_url: str, logs: list[Path]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start one `python -m services.sink` per log file (instances w1, w2, ...); stopped on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for k, log in enumerate(logs, 1):
            procs.append(spawn("services.sink", sink_env(nats_url, f"w{k}"), log))
        yield procs
    finally:
        stop_all(procs)


def rss_mb(pid: int) -> float:
    """Peak resident set size (VmHWM) of a live process in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def wipe_sink_state(js: JetStreamContext) -> None:
    """Delete BINLAKE_CDC, the DLQ and the sink's KV buckets, as if no sink had ever run."""
    for stream in (NAMES.cdc_stream, NAMES.dlq_stream):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)
    for bucket in (NAMES.cursors_bucket, NAMES.members_bucket):
        with contextlib.suppress(nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
            await js.delete_key_value(bucket)


async def cdc_messages(js: JetStreamContext) -> int:
    try:
        return (await js.stream_info(NAMES.cdc_stream)).state.messages
    except nats.js.errors.NotFoundError:
        return 0


async def wait_cdc(js: JetStreamContext, target: int, procs: list[subprocess.Popen[bytes]], logs: list[Path],
                   limit_s: float, on_first: Callable[[], None] | None = None) -> float:
    """Poll BINLAKE_CDC every POLL_S until it holds `target` messages; return that wall time."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for p, log in zip(procs, logs, strict=True):
            if p.poll() is not None:
                raise RuntimeError(f"sink {log.stem} exited with code {p.returncode}; log tail:\n{tail(log)}")
        n = await cdc_messages(js)
        if n and on_first is not None:
            on_first()
            on_first = None
        if n >= target:
            return time.time()
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"BINLAKE_CDC holds {await cdc_messages(js)} of {target} messages after {limit_s:.0f}s")


async def live_latency(js: JetStreamContext, log: ChangeLog, count: int, rate: float) -> set[str]:
    """Publish `count` single-row transactions at `rate`/s (awaited publishes); return their msg ids."""
    ids: set[str] = set()
    t0 = time.monotonic()
    for n in range(count):
        delay = t0 + n / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        for m in log.single():
            ack = await js.publish(m.subject, m.data, headers=m.headers, timeout=5)
            if ack.duplicate:
                raise RuntimeError(f"latency message {m.headers['Nats-Msg-Id']} was a duplicate")
            ids.add(m.headers["Nats-Msg-Id"])
    return ids


async def run_sinks(js: JetStreamContext, ns: NatsServer, workers: int, logdir: Path, args: argparse.Namespace,
                    log: ChangeLog | None) -> tuple[Run, list[str]]:
    """Fresh CDC state, start `workers` sink processes, wait for all raw messages in CDC, verify.

    With `log`, paced single-row messages follow once caught up, for the live latency.
    """
    await wipe_sink_state(js)
    raw_before = await read_all(js, NAMES.raw_stream)
    target = len(raw_before)
    logs = [logdir / f"sink-{workers}w-w{k}.log" for k in range(1, workers + 1)]
    first_poll: list[float] = []
    live_ids: set[str] = set()
    meter = CpuMeter(ns.proc.pid if ns.proc else 0)
    t0 = time.time()
    with sink_processes(ns.url, logs) as procs:
        done = await wait_cdc(js, target, procs, logs, max(300.0, target / 100),
                              on_first=lambda: first_poll.append(time.time()))
        cpu = meter.read({f"sink w{k}": proc_cpu(p.pid) for k, p in enumerate(procs, 1)})
        rss = {f"sink w{k}": rss_mb(p.pid) for k, p in enumerate(procs, 1)}
        raw_consumers = (await js.stream_info(NAMES.raw_stream)).state.consumer_count
        if log is not None:
            live_ids = await live_latency(js, log, args.lat_count, args.lat_rate)
            await wait_cdc(js, target + len(live_ids), procs, logs, 60)
        await asyncio.sleep(1.0)  # anything still in flight would show up as a duplicate now
        stops = stop_all(procs)
    raw = await read_all(js, NAMES.raw_stream)
    cdc = await read_all(js, NAMES.cdc_stream)
    problems = verify(raw, cdc)
    problems += await dlq_problems(js)

    raw_ts = {m.msg_id: m.stored for m in raw}
    first_cdc = cdc[0].stored if cdc else t0
    bulk = [m for m in cdc if m.msg_id not in live_ids]
    last_cdc = max((m.stored for m in bulk), default=first_cdc)
    run = Run(f"{workers} worker{'s' if workers > 1 else ''}", target, sum(m.rows for m in raw_before),
              seconds=done - t0, wall_s=done - t0, startup_s=first_cdc - t0, cpu=cpu, rss_mb=rss,
              raw_consumers=raw_consumers, stops=stops)
    run.backlog_ms = sorted((m.stored - raw_ts[m.msg_id]) * 1000 for m in bulk if m.msg_id in raw_ts)
    run.live_ms = sorted((m.stored - raw_ts[m.msg_id]) * 1000 for m in cdc if m.msg_id in live_ids)
    steady = last_cdc - first_cdc
    print_run(run, steady, first_poll[0] - t0 if first_poll else float("nan"))
    print_assignment(logs, raw_before)
    for lg in logs:
        lines = log_summary(lg)
        print(f"    log {lg.name}: {'no warnings/errors' if not lines else ''}")
        for line in lines:
            print(f"        {line}")
    return run, [f"{run.name}: {p}" for p in problems]


def rebalances(log: Path) -> list[list[int]]:
    """The partition sets a worker logged (`sink.rebalance` lines), in order."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("event") == "sink.rebalance":
                out.append(sorted(entry.get("owned") or []))
    return out


def print_assignment(logs: list[Path], raw: list[Stored]) -> None:
    """The partitions, tables and raw messages each worker owned at the end (from its rebalance log lines)."""
    per_partition = Counter(int(m.subject.split(".")[3]) for m in raw)
    for k, log in enumerate(logs, 1):
        history = rebalances(log)
        mine = set(history[-1]) if history else set()
        tables = [t.key for t in TABLES if t.partition in mine]
        msgs = sum(n for p, n in per_partition.items() if p in mine)
        print(f"    w{k}: {len(history)} rebalance(s), finally partitions {sorted(mine)} -> {len(tables)} tables, "
              f"{msgs} msgs ({msgs / max(1, len(raw)):.0%}): {', '.join(tables) or '-'}")


async def dlq_problems(js: JetStreamContext) -> list[str]:
    try:
        n = (await js.stream_info(NAMES.dlq_stream)).state.messages
    except nats.js.errors.NotFoundError:
        return []
    return [f"{n} dead letters in {NAMES.dlq_stream}"] if n else []


# ----------------------------------------------------------------------------- correctness


def verify(raw: list[Stored], cdc: list[Stored]) -> list[str]:
    """Every raw id exactly once in CDC, same payload, right subject, scn order per subject."""
    problems: list[str] = []
    by_id = {m.msg_id: m for m in raw}
    if len(by_id) != len(raw):
        problems.append(f"BINLAKE_RAW holds {len(raw) - len(by_id)} repeated msg ids")
    counts = Counter(m.msg_id for m in cdc)
    missing = [i for i in by_id if i not in counts]
    dups = {i: n for i, n in counts.items() if n > 1}
    extra = [i for i in counts if i not in by_id]
    if missing:
        problems.append(f"{len(missing)} raw messages missing from CDC, e.g. {missing[:5]}")
    if dups:
        problems.append(f"{len(dups)} ids more than once in CDC, e.g. {list(dups.items())[:5]}")
    if extra:
        problems.append(f"{len(extra)} CDC ids not in RAW, e.g. {extra[:5]}")
    wrong_subject, wrong_body, wrong_seq, chained = [], [], [], []
    for m in cdc:
        r = by_id.get(m.msg_id)
        if r is None:
            continue
        if m.subject != NAMES.cdc_from_raw_stored(r.subject):
            wrong_subject.append((m.msg_id, m.subject, r.subject))
        if (m.digest, m.scn, m.chunk, m.rows) != (r.digest, r.scn, r.chunk, r.rows):
            wrong_body.append(m.msg_id)
        if m.raw_seq != r.seq:
            wrong_seq.append((m.msg_id, m.raw_seq, r.seq))
        if m.chained:
            chained.append(m.msg_id)
    for what, bad in (("on the wrong subject", wrong_subject), ("with a payload differing from RAW", wrong_body),
                      (f"with a wrong {RAW_SEQ}", wrong_seq), (f"still carrying {EXPECTED_LAST_MSG_ID}", chained)):
        if bad:
            problems.append(f"{len(bad)} CDC messages {what}, e.g. {bad[:3]}")
    for name, msgs in (("RAW", raw), ("CDC", cdc)):
        last: dict[str, tuple[int, int]] = defaultdict(lambda: (-1, -1))
        broken = []
        for m in msgs:
            key = (m.scn, m.chunk)
            if key <= last[m.subject]:
                broken.append((m.subject, m.seq, key, last[m.subject]))
            last[m.subject] = key
        if broken:
            problems.append(f"{name}: scn order broken {len(broken)} times, e.g. {broken[:3]}")
    return problems


# ----------------------------------------------------------------------------- report & main


def print_mix(mix: Mix, publish_rate: float) -> None:
    """What BINLAKE_RAW holds."""
    single = mix.rows_per_message[1]
    bulk = {k: n for k, n in sorted(mix.rows_per_message.items()) if k != 1}
    print(f"workload             : {mix.rows} row changes in {mix.messages} messages, {mix.transactions} transactions, "
          f"{mix.bytes / 2**20:.1f} MiB payload")
    print(f"rows per message     : 1 row x {single} msgs ({single} rows, {single / mix.rows:.0%} of rows, "
          f"{single / mix.messages:.1%} of msgs); "
          + ", ".join(f"{k} rows x {n} msgs" for k, n in bulk.items())
          + f"; mean {mix.rows / mix.messages:.2f} rows/msg")
    print("ops (rows)           : " + ", ".join(f"{op}={mix.rows_by_op[op]}" for op in "iud"))
    print("tables (partition)   : " + ", ".join(f"{t.key} (p{t.partition}): {mix.messages_by_table[t.key]} msgs"
                                               for t in TABLES))
    print(f"distinct partitions  : {len({t.partition for t in TABLES})} of {PARTITIONS}")
    print(f"prefill              : {mix.seconds:.1f}s, {publish_rate:,.0f} msgs/s (publish_async, msg ids, "
          f"Expected-Last-Msg-Id chain)")


def fmt_cpu(run: Run) -> str:
    """CPU seconds per process and as a share of one core over the run's wall time."""
    wall = run.wall_s or run.seconds
    return ", ".join(f"{k} {v:.1f}s ({v / wall:.0%})" for k, v in run.cpu.items())


def print_run(run: Run, steady_s: float = 0.0, first_poll_s: float = float("nan")) -> None:
    if run.name == "baseline":
        print(f"  baseline (1 ephemeral pull consumer, AckNone, fetch {FETCH}): {run.messages} msgs, {run.rows} rows "
              f"in {run.seconds:.2f}s = {run.rate:,.0f} rows/s, {run.msg_rate:,.0f} msgs/s; CPU {fmt_cpu(run)}")
        return
    steady = f"{run.rows / steady_s:,.0f} rows/s, {run.messages / steady_s:,.0f} msgs/s" if steady_s > 0 else "n/a"
    print(f"  {run.name}: {run.messages} msgs, {run.rows} rows; process start -> all in CDC {run.wall_s:.2f}s = "
          f"{run.rate:,.0f} rows/s, {run.msg_rate:,.0f} msgs/s")
    print(f"    start-up: first CDC msg stored {run.startup_s:.2f}s after start (seen by the poll at "
          f"{first_poll_s:.2f}s); first -> last CDC msg {steady_s:.2f}s = {steady}")
    print(f"    CPU {fmt_cpu(run)}; peak RSS " + ", ".join(f"{k} {v:.0f} MiB" for k, v in run.rss_mb.items()))
    print(f"    consumers on {NAMES.raw_stream} when caught up: {run.raw_consumers} (the workers read "
          f"{PARTITIONS} partitions, one consumer each)")
    print("    stop (SIGTERM): " + ", ".join(f"w{k} exit {code} after {secs:.1f}s"
                                           for k, (code, secs) in enumerate(run.stops, 1)))


def pcts(values: list[float]) -> str:
    if not values:
        return "n=0"
    p = [percentile(values, q) for q in (50, 95, 99)]
    return f"n={len(values)} p50={p[0]:.1f} ms p95={p[1]:.1f} ms p99={p[2]:.1f} ms max={values[-1]:.1f} ms"


def print_summary(base: Run, runs: list[Run], args: argparse.Namespace) -> None:
    print("---- summary")
    print(f"rows                 : {base.rows} in {base.messages} messages")
    print(f"baseline rows/s      : {base.rate:,.0f}  ({base.msg_rate:,.0f} msgs/s; ephemeral pull consumer, AckNone, "
          f"fetch {FETCH}, one consumer over all partitions)")
    for r in runs:
        print(f"{r.name + ' rows/s':<21}: {r.rate:,.0f}  ({r.msg_rate:,.0f} msgs/s; from process start, "
              f"start-up {r.startup_s:.2f}s)")
    for r in runs:
        print(f"ratio {r.name}/baseline: {r.rate / base.rate:.3f}")
    if len(runs) == 2:
        print(f"ratio 2 workers/1 worker: {runs[1].rate / runs[0].rate:.3f}")
    for r in runs:
        print(f"backlog latency {r.name} (CDC stored - RAW stored; the prefill's age dominates): "
              f"{pcts(r.backlog_ms)}")
    for r in [base, *runs]:
        print(f"CPU {r.name:<15}: {fmt_cpu(r)} over {r.wall_s or r.seconds:.1f}s wall")
    for r in runs:
        slow = [(k, code, secs) for k, (code, secs) in enumerate(r.stops, 1) if code != 0 or secs > 10]
        for k, code, secs in slow:
            print(f"WARNING: {r.name}: sink w{k} needed {secs:.1f}s to stop after SIGTERM (exit {code}); "
                  "an orchestrator's grace period (docker: 10 s) would SIGKILL it")
    for r in runs:
        if r.live_ms:
            print(f"live latency {r.name} (caught up, {args.lat_count} single-row msgs at {args.lat_rate:g}/s, "
                  f"CDC stored - RAW stored): {pcts(r.live_ms)}")


async def measure(ns: NatsServer, args: argparse.Namespace, logdir: Path) -> tuple[int, list[str]]:
    nc, js = await connect_js(ns.url)
    try:
        pub_js = nc.jetstream(publish_async_max_pending=4000)
        log = ChangeLog()
        mix = await prefill(pub_js, log, args.changes)
        print_mix(mix, mix.messages / mix.seconds)
        problems: list[str] = []
        raw = await read_all(js, NAMES.raw_stream)
        if sum(m.rows for m in raw) != args.changes:
            problems.append(f"BINLAKE_RAW holds {sum(m.rows for m in raw)} rows, wanted {args.changes}")
        print("---- runs")
        base = await run_baseline(js, ns)
        print_run(base)
        runs = []
        for workers in (1, 2):
            run, found = await run_sinks(js, ns, workers, logdir, args, log if workers == 2 else None)
            runs.append(run)
            problems += found
        print_summary(base, runs, args)
        return 1 if problems else 0, problems
    finally:
        await nc.close()


def run(args: argparse.Namespace, workdir: Path) -> int:
    """Start nats-server, measure, report; stop the server always."""
    logdir = workdir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    ns = start_nats(workdir / "nats")
    try:
        version = subprocess.run([ns.args[0], "--version"], capture_output=True, text=True).stdout.strip()
        print(f"nats-server version  : {version}")
        print(f"python               : {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        code, problems = asyncio.run(measure(ns, args, logdir))
        for p in problems:
            print(f"CORRECTNESS: {p}")
        if not problems:
            print("correctness          : OK (each run: every raw id exactly once in CDC, same payload, right "
                  "subject, Binlake-Raw-Seq, scn strictly increasing per subject, no dead letters)")
        return code
    finally:
        ns.stop()


def main() -> None:
    ap = arguments(__doc__, "keep nats-server files and sink logs here (default: temp, removed)")
    ap.add_argument("--changes", type=int, default=200_000, help="row changes in BINLAKE_RAW (default 200000)")
    ap.add_argument("--lat-count", type=int, default=500, help="paced single-row messages for the live latency")
    ap.add_argument("--lat-rate", type=float, default=200.0, help="their rate per second")
    run_in_workdir(run, ap.parse_args(), "binlake-bench-sink-")


if __name__ == "__main__":
    main()

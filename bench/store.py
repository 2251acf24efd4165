#!/usr/bin/env python
"""Store benchmark: one client through the batch protocol vs. a bare JetStream pull consumer.

Starts a private nats-server, fills BINLAKE_CDC with N row changes in the envelope format
(half the rows in single-row messages, half in 50-row messages, over 8 tables), starts the
meta and store services as processes, then measures in the same run

  (base)  a bare ephemeral pull consumer (AckNone, fetch 500) reading every message, and
  (store) one StoreClient doing subscribe, get(max_rows) and ack until every row is acked,

and prints rows/s of both, their ratio, and get/ack latency percentiles. Exits non-zero
unless the client received every message exactly once, in stream order.

    python3 -m bench.store [--changes 200000] [--max-rows 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import tempfile
import time
from pathlib import Path

import nats
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench.common import arguments, percentile
from services.launcher.processes import clean_env, spawn
from services.launcher.servers import start_nats
from shared import envelope
from shared.jetstream import cdc_stream_config, ensure_stream
from shared.store_client import StoreClient
from shared.subjects import Names

TABLES = [("shop", "orders"), ("shop", "items"), ("shop", "customers"), ("shop", "payments"),
          ("crm", "contacts"), ("crm", "events"), ("crm", "notes"), ("crm", "tasks")]
SCHEMA = {"id": "bench", "columns": [{"name": "id", "type": "bigint", "nullable": False},
                                     {"name": "name", "type": "varchar", "nullable": True},
                                     {"name": "amount", "type": "decimal", "precision": 12, "scale": 2,
                                      "nullable": True}]}


async def prefill(js: JetStreamContext, changes: int) -> tuple[int, int]:
    """Publish `changes` rows as CDC messages; returns (messages, rows)."""
    rng = random.Random(7)
    names = Names()
    packed = envelope.pack_schema(SCHEMA)
    messages = rows = 0
    pending = []
    offset = 4
    while rows < changes:
        n = 1 if rows < changes // 2 else min(50, changes - rows)
        db, table = rng.choice(TABLES)
        offset += 100
        env = {"v": 1, "source": "main", "db": db, "table": table, "op": "i", "ts": int(time.time() * 1000),
               "pos": {"file": "mysql-bin.000001", "offset": offset, "gtid": None},
               "scn": envelope.scn("mysql-bin.000001", offset), "chunk": 0,
               "txn": {"id": f"t{offset}", "i": 0, "last": True}, "pk": ["id"],
               "rows": [{"after": {"id": rows + k, "name": f"n{rows + k}", "amount": f"{rng.randint(0, 10**6)}.25"}}
                        for k in range(n)]}
        mid = envelope.msg_id("main", int(str(env["scn"])))
        pending.append(await js.publish_async(names.cdc("main", db, table), envelope.encode(env, packed),
                                              headers=envelope.headers(env, mid)))
        messages += 1
        rows += n
        if len(pending) >= 2000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return messages, rows


async def baseline(js: JetStreamContext, messages: int) -> tuple[float, int]:
    cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, mem_storage=True,
                         inactive_threshold=30.0)
    sub = await js.pull_subscribe("binlake.cdc.>", stream="BINLAKE_CDC", config=cfg)
    started, seen, rows = time.perf_counter(), 0, 0
    while seen < messages:
        try:
            batch = await sub.fetch(500, timeout=2)
        except nats.errors.TimeoutError:
            break
        seen += len(batch)
        rows += sum(int((m.headers or {}).get("Binlake-Rows", 0)) for m in batch)
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    return elapsed, rows


async def through_store(url: str, rows_total: int, max_rows: int) -> tuple[float, int, list[float], list[float], bool]:
    client = await StoreClient.connect(url, "bench")
    try:
        await client.subscribe(start="earliest")
        started = time.perf_counter()
        rows, gets, acks, seqs = 0, [], [], []
        while rows < rows_total:
            t = time.perf_counter()
            batch = await client.get(max_rows=max_rows, max_wait=1.0)
            gets.append((time.perf_counter() - t) * 1000)
            if batch.id is None:
                if time.perf_counter() - started > 300:
                    break
                continue
            rows += batch.rows
            seqs += batch.seqs
            t = time.perf_counter()
            await client.ack(batch.id)
            acks.append((time.perf_counter() - t) * 1000)
        elapsed = time.perf_counter() - started
        in_order = seqs == sorted(set(seqs))
        return elapsed, rows, gets, acks, in_order
    finally:
        await client.close()


def service(module: str, url: str, log: Path) -> subprocess.Popen[bytes]:
    return spawn(module, clean_env(BINLAKE_NATS_URL=url, BINLAKE_METRICS_PORT="-1"), log)


async def measure(url: str, args: argparse.Namespace, logs: Path) -> int:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=4000)
    await ensure_stream(js, cdc_stream_config(Names(), limits=(0.0, -1)))
    t = time.perf_counter()
    messages, rows = await prefill(js, args.changes)
    print(f"workload             : {rows} rows in {messages} messages over {len(TABLES)} tables "
          f"(prefill {time.perf_counter() - t:.1f}s)")
    base_s, base_rows = await baseline(js, messages)
    await nc.close()
    procs = [service("services.meta", url, logs / "meta.log"), service("services.store", url, logs / "store.log")]
    try:
        await asyncio.sleep(3)
        store_s, store_rows, gets, acks, in_order = await through_store(url, rows, args.max_rows)
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)
    base_rate, store_rate = base_rows / base_s, store_rows / store_s
    print(f"baseline             : {base_rows} rows in {base_s:.2f}s = {base_rate:,.0f} rows/s "
          f"(ephemeral pull consumer, AckNone, fetch 500)")
    print(f"store client         : {store_rows} rows in {store_s:.2f}s = {store_rate:,.0f} rows/s "
          f"(get max_rows={args.max_rows} + ack, {len(acks)} batches)")
    print(f"ratio store/baseline : {store_rate / base_rate:.3f}")
    print(f"get latency ms       : p50={percentile(sorted(gets), 50):.1f} p95={percentile(sorted(gets), 95):.1f} "
          f"p99={percentile(sorted(gets), 99):.1f}")
    print(f"ack latency ms       : p50={percentile(sorted(acks), 50):.1f} p95={percentile(sorted(acks), 95):.1f} "
          f"p99={percentile(sorted(acks), 99):.1f}")
    ok = store_rows == rows and in_order
    print(f"correctness          : {'OK' if ok else 'FAILED'} (every row once, in stream order)")
    return 0 if ok else 1


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--max-rows", type=int, default=5000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="binlake-bench-store-") as tmp:
        server = start_nats(Path(tmp) / "nats")
        try:
            code = asyncio.run(measure(server.url, args, Path(tmp)))
        finally:
            server.stop()
    raise SystemExit(code)


if __name__ == "__main__":
    main()

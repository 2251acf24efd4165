"""Composition root of the loader: lease, store client, Spark lake, metrics.

Loop: get a batch from the store, drop the events the lake already holds (a crash between
commit and ack redelivers them), write and commit the rest in Spark (in a worker thread,
the event loop stays free for NATS), then ack. The lake's commit pointer and the store's
ack together make every change land exactly once.
"""

from __future__ import annotations

import asyncio
import time

import msgpack
import structlog
from pyspark.sql import SparkSession

from services.loader import frames
from services.loader.config import LoaderConfig
from services.loader.lake import Lake
from services.loader.spark import session
from shared import jetstream
from shared.actor import run_all, supervise_call
from shared.lease import Lease, bucket_ttl
from shared.metrics import Registry
from shared.service import runtime
from shared.store_client import Batch, StoreClient
from shared.subjects import Names

log = structlog.get_logger()


class Loader:
    def __init__(self, cfg: LoaderConfig, client: StoreClient, lake: Lake, registry: Registry) -> None:
        self._cfg = cfg
        self._client = client
        self._lake = lake
        self._rows = registry.counter("loader_rows_total", "Row changes committed to the lake")
        self._batches = registry.counter("loader_batches_total", "Batches committed to the lake")
        self._committed = registry.gauge("loader_committed_seq", "Last BINLAKE_CDC sequence in the lake")
        self._seconds = registry.gauge("loader_last_batch_seconds", "Time to write and commit the last batch")
        self.log = structlog.get_logger().bind(actor="loader")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        committed = await loop.run_in_executor(None, self._lake.open)
        acked = await self._client.subscribe(filter=self._cfg.filter, start="earliest")
        self.log.info("loader.start", committed=committed, acked=acked)
        while True:
            batch = await self._client.get(self._cfg.batch_rows, self._cfg.flush_s)
            if batch.id is None:
                continue
            await self._apply(batch)
            await self._client.ack(batch.id)

    async def _apply(self, batch: Batch) -> None:
        assert batch.id is not None
        committed = self._lake.committed
        fresh = [(seq, msgpack.unpackb(raw, raw=False, strict_map_key=False))
                 for seq, raw in zip(batch.seqs, batch.raw, strict=True) if seq > committed]
        if batch.id <= committed:
            return  # applied before a crash, not acked then
        started = time.monotonic()
        tables = frames.group(fresh)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._lake.apply, batch.id, list(tables.values()))
        rows = sum(t.rows for t in tables.values())
        self._rows.inc(rows)
        self._batches.inc()
        self._committed.set(batch.id)
        self._seconds.set(time.monotonic() - started)
        self.log.info("loader.committed", seq=batch.id, rows=rows, tables=len(tables),
                      seconds=round(time.monotonic() - started, 2))


async def main(cfg: LoaderConfig) -> None:
    registry = Registry()
    names = Names(cfg.prefix)
    async with runtime(cfg, "loader", registry) as nc:
        js = nc.jetstream()
        leases = await jetstream.ensure_kv(js, names.leases_bucket, ttl_s=cfg.lease_ttl_s)
        lease = Lease(leases, f"loader.{cfg.source}.{cfg.client}", cfg.instance,
                      await bucket_ttl(leases, cfg.lease_ttl_s))
        await lease.acquire()
        loop = asyncio.get_running_loop()
        spark: list[SparkSession] = []

        async def load() -> None:
            # Spark starts while the lease is being kept: starting takes longer than its TTL.
            spark.append(await loop.run_in_executor(None, lambda: session(
                "binlake-loader", cfg.master, cfg.data_dir, cfg.root, cfg.spark_conf)))
            lake = Lake(spark[0], cfg.database, cfg.root)
            client = StoreClient(nc, cfg.client, source=cfg.source, prefix=cfg.prefix, timeout_s=30.0)
            loader = Loader(cfg, client, lake, registry)
            await supervise_call(loader.run, cfg.restart, loader.log)

        try:
            await run_all([lease.keep, load])
        finally:
            await lease.release()
            if spark:
                await loop.run_in_executor(None, spark[0].stop)

"""Composition root of the loader: lease, store client, Spark and the lake, metrics."""

from __future__ import annotations

import asyncio
import re

from pyspark.sql import SparkSession

from services.loader.config import LoaderConfig
from services.loader.lake import Lake, MergePolicy
from services.loader.loader import Loader
from services.loader.maintenance import Maintenance
from services.loader.spark import session, stop
from shared import jetstream, keys
from shared.actor import run_all, supervise_call
from shared.lease import Lease, bucket_ttl
from shared.metrics import Registry
from shared.service import runtime
from shared.store_client import StoreClient
from shared.subjects import Names


async def main(cfg: LoaderConfig) -> None:
    registry = Registry()
    names = Names(cfg.prefix)
    async with runtime(cfg, "loader", registry) as nc:
        js = nc.jetstream()
        leases = await jetstream.ensure_kv(js, names.leases_bucket, ttl_s=cfg.lease_ttl_s, replicas=cfg.replicas)
        lease = Lease(leases, keys.loader_lease(cfg.source, cfg.client), cfg.instance,
                      await bucket_ttl(leases, cfg.lease_ttl_s))
        await lease.acquire()
        loop = asyncio.get_running_loop()
        spark: list[SparkSession] = []

        async def load() -> None:
            # Spark starts while the lease is being kept: starting takes longer than its TTL.
            spark.append(await loop.run_in_executor(None, lambda: session(
                "binlake-loader", cfg.master, cfg.lake_catalog, cfg.spark_conf)))
            pattern = re.compile(cfg.filter)
            lake = Lake(spark[0], cfg.catalog, MergePolicy(cfg.merge_rows, cfg.merge_s),
                        include=lambda db, table: pattern.fullmatch(f"{db}.{table}") is not None,
                        views=cfg.catalog_type != "hadoop")
            # An ack may wait behind the read-ahead's long poll: the store serves a client's verbs in turn.
            client = StoreClient(nc, cfg.client, source=cfg.source, prefix=cfg.prefix, timeout_s=30.0 + cfg.flush_s)
            maintenance = Maintenance(lake, cfg.maintenance_s, cfg.keep_snapshots_s)
            loader = Loader(cfg, client, lake, maintenance, registry, js)
            await supervise_call(loader.run, cfg.restart, loader.log)

        try:
            await run_all([lease.keep, load])
        finally:
            await lease.release()
            if spark:
                await loop.run_in_executor(None, stop, spark[0])

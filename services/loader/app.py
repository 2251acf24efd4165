"""Composition root of the loader: lease, store client, Spark and the lake, metrics."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor

import structlog
from pyspark.sql import SparkSession

from services.loader.config import LoaderConfig
from services.loader.lake import Lake, MergePolicy
from services.loader.loader import Loader
from services.loader.maintenance import Maintenance
from services.loader.spark import session, stop
from shared import jetstream, keys
from shared.actor import run_all, supervise_call
from shared.errors import LeaseLost
from shared.health import Conditions
from shared.lease import Lease, bucket_ttl
from shared.metrics import Registry
from shared.service import runtime
from shared.store_client import StoreClient
from shared.subjects import Names


async def main(cfg: LoaderConfig) -> None:
    registry = Registry()
    names = Names(cfg.prefix)
    log = structlog.get_logger()
    leader = registry.gauge("loader_leader", "1 while this instance holds the loader lease")
    conditions = Conditions()
    async with runtime(cfg, "loader", registry, problem=conditions.problem) as nc:
        js = nc.jetstream(prefix=cfg.nats_api_prefix)
        leases = await jetstream.ensure_kv(js, names.leases_bucket, ttl_s=cfg.lease_ttl_s, replicas=cfg.replicas)
        lease = Lease(leases, keys.loader_lease(cfg.source, cfg.client), cfg.instance,
                      await bucket_ttl(leases, cfg.lease_ttl_s))
        loop = asyncio.get_running_loop()
        # Every lake write runs on this one thread, so a term that ended can wait for the write it
        # left in flight before the next term starts writing.
        lake_thread = ThreadPoolExecutor(1, thread_name_prefix="lake")
        spark: list[SparkSession] = []

        async def load() -> None:
            def start() -> None:  # appended in the thread: a cancelled term still leaves it to stop
                if not spark:
                    spark.append(session("binlake-loader", cfg.master, cfg.lake_catalog, cfg.spark_conf,
                                         properties=cfg.spark_properties))

            # Started once, while the lease is kept: starting takes longer than its TTL.
            await loop.run_in_executor(lake_thread, start)
            pattern = re.compile(cfg.filter)
            lake = Lake(spark[0], cfg.catalog, MergePolicy(cfg.merge_rows, cfg.merge_s),
                        include=lambda db, table: pattern.fullmatch(f"{db}.{table}") is not None,
                        views=cfg.catalog_type != "hadoop", write_threads=cfg.write_threads)
            # An ack may wait behind the read-ahead's long poll: the store serves a client's verbs in turn.
            client = StoreClient(nc, cfg.client, source=cfg.source, prefix=cfg.prefix, timeout_s=30.0 + cfg.flush_s,
                                 api_prefix=cfg.nats_api_prefix)
            maintenance = Maintenance(lake, cfg.maintenance_s, cfg.keep_snapshots_s)
            loader = Loader(cfg, client, lake, maintenance, registry, js, lake_thread, conditions)
            try:
                await supervise_call(loader.run, cfg.restart, loader.log, conditions, "loader")
            finally:
                lake.close()

        async def drain() -> None:
            if spark:
                try:
                    spark[0].sparkContext.cancelAllJobs()
                except Exception as exc:  # a stopped context: nothing runs
                    log.warning("loader.cancel_failed", error=repr(exc))
            await loop.run_in_executor(lake_thread, lambda: None)

        async def lead() -> None:
            """Terms as the leader: a lost lease (NATS unreachable too long) sends us back to standby."""
            while True:
                await lease.acquire()
                leader.set(1)
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(lease.keep())
                        tg.create_task(load())
                except* LeaseLost as eg:
                    log.warning("lease.lost", reason=str(eg.exceptions[0]))
                finally:
                    leader.set(0)
                    # However the term ends (lost lease, SIGTERM, a failure), the lake write it left
                    # in flight ends before another loader may have the lease.
                    await asyncio.shield(drain())
                    await lease.release()

        try:
            await run_all([lead])
        finally:
            if spark:
                await loop.run_in_executor(None, stop, spark[0])
            lake_thread.shutdown(wait=False)

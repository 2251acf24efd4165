"""Composition root of meta: backend, request server, metrics.

Meta never reads BINLAKE_RAW (it holds every database unmasked): the parser records the schema
history through the `schema.add` verb.
"""

from __future__ import annotations

import asyncio

import structlog

from services.meta.backend import MetaBackend
from services.meta.config import MetaConfig
from services.meta.kv_backend import KvBackend
from services.meta.mysql_backend import MysqlBackend
from services.meta.rewind import Rewinder
from services.meta.server import MetaServer
from shared import jetstream
from shared.actor import run_all
from shared.health import Conditions
from shared.metrics import Registry
from shared.service import runtime
from shared.subjects import Names

log = structlog.get_logger()


async def main(cfg: MetaConfig) -> None:
    registry = Registry()
    names = Names(cfg.prefix)
    health = Conditions()
    async with runtime(cfg, "meta", registry, problem=health.problem) as nc:
        js = nc.jetstream(prefix=cfg.nats_api_prefix)
        backend: MetaBackend = (KvBackend(js, names.cursors_bucket, names.schema_bucket, cfg.replicas)
                                if cfg.backend == "kv" else MysqlBackend(cfg.meta_mysql_url))
        await backend.start()
        try:
            await jetstream.ensure_streams(js, names, cfg.partitions, cfg.replicas, streams=("cdc",),
                                           limits=cfg.limits)  # rewind reads it
            meta = MetaServer(nc, cfg.prefix, backend, Rewinder(js, names, backend), health)
            await meta.start()
            log.info("meta.start", backend=cfg.backend)

            async def forever() -> None:
                await asyncio.Event().wait()  # the subscriptions answer; this only waits for a signal

            try:
                await run_all([forever])
            finally:
                await meta.stop()
        finally:
            await backend.close()

"""Composition root of the store: stream retention, the batch protocol server, metrics."""

from __future__ import annotations

import asyncio

import structlog

from services.store.config import StoreConfig
from services.store.retention import apply_retention
from services.store.server import StoreServer
from shared.actor import run_all
from shared.health import Conditions
from shared.meta_client import MetaClient
from shared.metrics import Registry
from shared.service import runtime
from shared.subjects import Names

log = structlog.get_logger()


async def main(cfg: StoreConfig) -> None:
    registry = Registry()
    names = Names(cfg.prefix)
    health = Conditions()
    async with runtime(cfg, "store", registry, problem=health.problem) as nc:
        js = nc.jetstream(prefix=cfg.nats_api_prefix)
        await apply_retention(js, names, cfg.cdc_max_age_s, cfg.cdc_max_bytes, cfg.replicas, must_apply=False)
        store = StoreServer(nc, js, names, cfg.source, MetaClient(nc, cfg.prefix, cfg.meta_timeout_s), registry,
                            cfg.max_batch_rows, max_batch_bytes=cfg.max_batch_bytes,
                            prefetch_bytes=cfg.prefetch_bytes, health=health)
        await store.start()
        log.info("store.start", source=cfg.source)

        async def forever() -> None:
            await asyncio.Event().wait()

        try:
            await run_all([forever])
        finally:
            await store.stop()

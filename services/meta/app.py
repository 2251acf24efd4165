"""Composition root of meta: backend, request server, schema recorder, metrics."""

from __future__ import annotations

import asyncio

import structlog

from services.meta.backend import MetaBackend
from services.meta.config import MetaConfig
from services.meta.kv_backend import KvBackend
from services.meta.mysql_backend import MysqlBackend
from services.meta.recorder import SchemaRecorder
from services.meta.rewind import Rewinder
from services.meta.server import MetaServer
from shared import jetstream
from shared.actor import run_all, supervise_call
from shared.metrics import Registry
from shared.service import runtime
from shared.subjects import Names

log = structlog.get_logger()


async def main(cfg: MetaConfig) -> None:
    registry = Registry()
    names = Names(cfg.prefix)
    async with runtime(cfg, "meta", registry) as nc:
        js = nc.jetstream()
        backend: MetaBackend = (KvBackend(js, names.cursors_bucket, names.schema_bucket, cfg.replicas)
                                if cfg.backend == "kv" else MysqlBackend(cfg.meta_mysql_url))
        await backend.start()
        try:
            await jetstream.ensure_streams(js, names, cfg.partitions, cfg.replicas)
            meta = MetaServer(nc, cfg.prefix, backend, Rewinder(js, names, backend))
            await meta.start()
            recorder = SchemaRecorder(js, names, cfg.source, backend)
            recorded = registry.gauge("meta_schema_records", "Schema/DDL records written by this process")
            log.info("meta.start", backend=cfg.backend)

            async def report() -> None:
                while True:
                    recorded.set(recorder.recorded)
                    await asyncio.sleep(1)

            try:
                await run_all([lambda: supervise_call(recorder.run, cfg.restart, recorder.log), report])
            finally:
                await meta.stop()
        finally:
            await backend.close()

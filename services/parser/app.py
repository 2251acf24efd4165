"""Composition root of the parser: lease, pipeline (binlog thread -> publisher), reporter, schema recorder.

Only the lease holder runs the pipeline (`services/parser/pipeline.py`), supervised: it is
restarted as a unit on transient errors. The schema recorder (`schema_recorder.py`) runs beside
it with a restart budget of its own that never runs out, so a meta that does not answer only
delays the schema history, never the binlog.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys

import structlog

from services.parser.config import ParserConfig
from services.parser.pipeline import Pipeline
from services.parser.position import PositionReporter
from services.parser.schema_recorder import SchemaRecorder
from services.parser.source_watch import SourceWatch
from services.parser.transactions import Outgoing
from shared import bus, jetstream, keys
from shared.actor import Latest, run_all, supervise_call
from shared.errors import LeaseLost
from shared.health import Conditions
from shared.lease import Lease, bucket_ttl
from shared.meta_client import MetaClient
from shared.metrics import Registry
from shared.service import runtime
from shared.subjects import Names

log = structlog.get_logger()


async def main(cfg: ParserConfig) -> None:
    registry = Registry()
    leader = registry.gauge("parser_leader", "1 while this instance holds the parser lease")
    watch = SourceWatch(cfg.stall_s, registry)
    conditions = Conditions()
    async with runtime(cfg, "parser", registry, problem=lambda: watch.problem() or conditions.problem()) as nc:
        js = nc.jetstream(prefix=cfg.nats_api_prefix)
        names = Names(cfg.prefix)
        leases = await jetstream.ensure_kv(js, names.leases_bucket, ttl_s=cfg.lease_ttl_s, replicas=cfg.replicas)
        cursors = await jetstream.ensure_kv(js, names.cursors_bucket, history=bus.CURSOR_HISTORY, replicas=cfg.replicas)
        lease = Lease(leases, keys.parser_lease(cfg.source), cfg.instance, await bucket_ttl(leases, cfg.lease_ttl_s))
        recorder = SchemaRecorder(js, names, cfg.source, cursors, MetaClient(nc, cfg.prefix), registry)
        recorder_restart = dataclasses.replace(cfg.restart, max_restarts=sys.maxsize)

        async def lead() -> None:
            while True:
                await lease.acquire()
                leader.set(1)
                watch.start()
                progress: Latest[Outgoing] = Latest()
                pipeline = Pipeline(cfg, nc, js, progress, registry, cursors, watch, conditions)
                reporter = PositionReporter(cursors, cfg.source, progress, registry, cfg.report_interval_s)
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(lease.keep())
                        tg.create_task(supervise_call(pipeline.run, cfg.restart, pipeline.log, conditions, "pipeline"))
                        # Capture goes on while meta is away (the history waits): meta's /healthz says so.
                        tg.create_task(supervise_call(recorder.run, recorder_restart, recorder.log))
                        tg.create_task(reporter.run())
                        tg.create_task(watch.watch())
                except* LeaseLost as eg:
                    log.warning("lease.lost", reason=str(eg.exceptions[0]))
                finally:
                    # A stalled source (SourceStalled) ends the process after this: the lease is
                    # free at once for a standby, and the orchestrator restarts this instance.
                    leader.set(0)
                    watch.stop()
                    await lease.release()

        await run_all([lead])

"""Composition root of a sink worker: membership, coordinator, partition workers, metrics."""

from __future__ import annotations

import structlog

from services.sink.config import SinkConfig
from services.sink.coordinator import Coordinator
from services.sink.membership import Membership
from services.sink.partition import PartitionSettings, PartitionWorker
from services.sink.tables import PartitionTables
from shared import bus, jetstream, keys, objects
from shared.actor import Latest, run_all
from shared.health import Conditions
from shared.metrics import Registry
from shared.service import runtime
from shared.subjects import Names

log = structlog.get_logger()


async def main(cfg: SinkConfig) -> None:
    registry = Registry()
    rules = cfg.rules()
    names = Names(cfg.prefix)
    conditions = Conditions()
    async with runtime(cfg, "sink", registry, problem=conditions.problem) as nc:
        js = nc.jetstream(prefix=cfg.nats_api_prefix)
        await jetstream.ensure_streams(js, names, cfg.partitions, cfg.replicas, limits=cfg.limits)
        await objects.ensure_or_warn(js, names.cdc_objects_bucket, names.cdc_stream, replicas=cfg.replicas)
        await jetstream.ensure_kv(js, names.members_bucket, ttl_s=cfg.member_ttl_s, replicas=cfg.replicas)
        cursors = await jetstream.ensure_kv(js, names.cursors_bucket, history=bus.CURSOR_HISTORY, replicas=cfg.replicas)
        view: Latest[frozenset[str]] = Latest()
        membership = Membership(js, names.members_bucket, cfg.source, cfg.instance, cfg.member_ttl_s, view,
                                conditions)

        def make_worker(p: int) -> PartitionWorker:
            settings = PartitionSettings(cfg.source, p, cfg.batch, cfg.cursor_interval_s, cfg.publish_timeout_s,
                                         cfg.fetch_bytes)
            return PartitionWorker(js, names, cursors, rules, settings, registry, conditions)

        tables: Latest[dict[int, int]] = Latest()
        counter = PartitionTables(js, names, cfg.source, cfg.rebalance_s, tables)
        if (counts := await counter.count()) is not None:
            tables.set(counts)  # the first split already spreads the tables
        coordinator = Coordinator(view, tables, keys.member(cfg.source, cfg.instance), cfg.partitions, make_worker,
                                  cfg.restart, registry, conditions)
        log.info("sink.start", instance=membership.key, partitions=cfg.partitions)
        await run_all([membership.run, counter.run, coordinator.run])

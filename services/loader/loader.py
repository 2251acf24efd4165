"""The loader actor: batches from the store into the lake, acked only after the lake committed them.

Loop: get a batch, read ahead while a RENAME TABLE has only one half in it, write the unit
(every table's changelog append, merges that are due), ack its batches in order. Spark runs
in a worker thread so the event loop stays free for NATS; the next batch is decoded into
Arrow meanwhile (`ReadAhead`). A crash anywhere redelivers from
the last ack; the lake's per-table markers skip what it already holds.
"""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import Executor
from typing import Any

import nats.js.errors
import structlog

from services.loader import frames
from services.loader.config import LoaderConfig
from services.loader.lake import Lake
from services.loader.maintenance import Maintenance
from services.loader.read_ahead import Fetched, ReadAhead
from shared import bus, jetstream, keys
from shared import snapshots as snap
from shared.metrics import Registry
from shared.store_client import Batch, StoreClient
from shared.subjects import Names


class Loader:
    def __init__(self, cfg: LoaderConfig, client: StoreClient, lake: Lake, maintenance: Maintenance,
                 registry: Registry, js: Any = None, lake_thread: Executor | None = None) -> None:
        self._cfg = cfg
        self._thread = lake_thread
        self._client = client
        self._lake = lake
        self._maintenance = maintenance
        self._js = js
        self._rows = registry.counter("loader_rows_total", "Row changes committed to the lake")
        self._batches = registry.counter("loader_batches_total", "Batches committed to the lake")
        self._committed = registry.gauge("loader_committed_seq", "Last BINLAKE_CDC sequence in the lake")
        self._seconds = registry.gauge("loader_last_batch_seconds", "Time to write and commit the last batch")
        self.log = structlog.get_logger().bind(actor="loader")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        committed = await loop.run_in_executor(self._thread, self._lake.open)
        await self._file_resnapshots()  # recorded before a crash, not filed then
        acked = await self._client.subscribe(filter=self._cfg.filter, start="earliest")
        self.log.info("loader.start", committed=committed, acked=acked)
        reader = ReadAhead(self._client, self._cfg.batch_rows, self._cfg.flush_s, lambda: self._lake.committed,
                           max_bytes=self._cfg.batch_bytes)
        try:
            while True:
                fetched = await reader.next()
                if fetched.batch.id is None or not fetched.prepared.events:
                    if fetched.batch.id is not None:  # only what the lake holds already, or nothing for it
                        await self._client.ack(fetched.batch.id)
                    await loop.run_in_executor(self._thread, self._idle)
                    continue
                unit, prepared = await self._unit(reader, fetched)
                await self._apply(unit, prepared)
                for b in unit:
                    assert b.id is not None
                    await self._client.ack(b.id)
                await self._file_resnapshots()
        finally:
            await reader.close()

    def _idle(self) -> None:
        self._lake.merge_due(self._lake.committed)
        self._maintenance.maybe_run()

    async def _unit(self, reader: ReadAhead, first: Fetched) -> tuple[list[Batch], frames.Prepared]:
        """The batch, plus the next ones while a RENAME TABLE waits for its other half."""
        unit, prepared = [first.batch], first.prepared
        for _ in range(self._cfg.rename_wait_batches):  # reads, empty ones included: a bound in time too
            waiting = self._lake.pending_renames(prepared.events)
            if not waiting:
                break
            self.log.info("loader.rename_read_ahead", waiting=waiting, batches=len(unit))
            more = await reader.next()
            if more.batch.id is not None:
                unit.append(more.batch)
                prepared = frames.prepare([*prepared.events, *more.prepared.events])
        return unit, prepared

    async def _apply(self, unit: list[Batch], prepared: frames.Prepared) -> None:
        last = unit[-1].id
        assert last is not None
        if last <= self._lake.committed or not prepared.events:
            return  # applied before a crash, not acked then
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(self._thread, self._lake.apply, last, prepared)
        await loop.run_in_executor(self._thread, self._maintenance.maybe_run)
        seconds = time.monotonic() - started
        self._rows.inc(rows)
        self._batches.inc(len(unit))
        self._committed.set(last)
        self._seconds.set(seconds)
        self.log.info("loader.committed", seq=last, rows=rows, batches=len(unit), seconds=round(seconds, 2))

    async def _file_resnapshots(self) -> None:
        """Ask the parser to read tables again whose lake values a DDL made inexact (`services.loader.resnapshots`)."""
        if not self._lake.resnapshot or self._js is None:
            return
        names = Names(self._cfg.prefix)
        kv = await jetstream.ensure_kv(self._js, names.cursors_bucket, history=bus.CURSOR_HISTORY,
                                       replicas=self._cfg.replicas)
        loop = asyncio.get_running_loop()
        for req in list(self._lake.resnapshot):
            body = snap.SnapshotRequest(id=req.id, created_ms=int(time.time() * 1000),
                                        patterns=[f"^{re.escape(req.db)}\\.{re.escape(req.table)}$"])
            with jetstream.nats_errors("snapshot request"):
                try:
                    await kv.create(keys.snapshot_request(self._cfg.source, req.id), body.to_json())
                except nats.js.errors.KeyWrongLastSequenceError:
                    pass  # filed before a crash that came before it was marked filed
            await loop.run_in_executor(self._thread, self._lake.resnapshot_filed, req)
            self.log.info("loader.resnapshot_requested", table=f"{req.db}.{req.table}", why=req.why, request=req.id)

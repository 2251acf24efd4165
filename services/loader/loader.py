"""The loader actor: batches from the store into the lake, acked only after the lake committed them.

Loop: get a batch, read ahead while a RENAME TABLE has only one half in it, write the unit
(every table's changelog append, merges that are due), ack its batches in order. Spark runs
in a worker thread so the event loop stays free for NATS; the next batch is decoded into
Arrow meanwhile (`ReadAhead`). A crash anywhere redelivers from
the last ack, and `binlake rewind loader` delivers again from an earlier point; either way the
lake's per-table markers skip what each table already holds and apply what it lacks (a table
dropped or restored from an older copy is built up again). Lake sequences are
CDC sequences from a base per BINLAKE_CDC definition (`Lake.adopt_stream`); acks name CDC ones.
"""

from __future__ import annotations

import asyncio
import json
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
from shared.health import Conditions
from shared.metrics import Registry
from shared.store_client import StoreClient
from shared.subjects import Names

HELD = "tables_held"
"""`/healthz` condition: source tables set aside (`Lake.holds`), each with its reason."""


class Loader:
    def __init__(self, cfg: LoaderConfig, client: StoreClient, lake: Lake, maintenance: Maintenance,
                 registry: Registry, js: Any = None, lake_thread: Executor | None = None,
                 conditions: Conditions | None = None) -> None:
        self._cfg = cfg
        self._conditions = conditions or Conditions()
        self._reported: dict[str, Any] | None = None  # the held tables as last written to KV
        self._retried = time.monotonic()
        self._thread = lake_thread
        self._client = client
        self._lake = lake
        self._maintenance = maintenance
        self._js = js
        self._rows = registry.counter("loader_rows_total", "Row changes committed to the lake")
        self._batches = registry.counter("loader_batches_total", "Batches committed to the lake")
        self._committed = registry.gauge("loader_committed_seq",
                                         "Last lake sequence committed (BINLAKE_CDC sequence + its stream's base)")
        self._seconds = registry.gauge("loader_last_batch_seconds", "Time to write and commit the last batch")
        self._lag = registry.gauge("loader_lag_seconds", "Seconds from the source's commit of the newest change in "
                                   "the last batch to the lake's commit of it; 0 once nothing waits")
        self._held = registry.gauge("loader_tables_held", "Source tables set aside: their changes kept, not loaded")
        self.log = structlog.get_logger().bind(actor="loader")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        committed = await loop.run_in_executor(self._thread, self._lake.open)
        await self._file_resnapshots()  # recorded before a crash, not filed then
        acked = await self._client.subscribe(filter=self._cfg.filter, start="earliest")
        self.log.info("loader.start", committed=committed, acked=acked)
        await self._report_held()
        reader = ReadAhead(self._client, self._cfg.batch_rows, self._cfg.flush_s, self._lake.bases,
                           max_bytes=self._cfg.batch_bytes, catch_up_rows=self._cfg.catch_up_rows)
        try:
            while True:
                fetched = await self._next(reader)
                self._lake.behind = fetched.batch.full  # this batch's, not the read-ahead's next one
                if fetched.batch.id is None or not _prepared(fetched).events:
                    if fetched.batch.id is None:
                        if not fetched.batch.full:  # the store had nothing more: the lake is as fresh as the source
                            self._lag.set(0)
                    else:  # nothing for the lake (other sources' messages)
                        self._lake.reached(fetched.end)
                        await self._client.ack(fetched.batch.id)
                    await loop.run_in_executor(self._thread, self._idle)
                    await self._report_held()
                    continue
                unit, prepared = await self._unit(reader, fetched)
                await self._apply(unit, prepared)
                for f in unit:
                    assert f.batch.id is not None
                    await self._client.ack(f.batch.id)
                await self._file_resnapshots()
                await loop.run_in_executor(self._thread, self._retry_held)
                await self._report_held()
        finally:
            await reader.close()

    def _idle(self) -> None:
        self._retry_held()
        self._lake.merge_due(self._lake.committed)

    def _retry_held(self) -> None:
        """Tables set aside are tried again every `retry_held_s` (the operator may have fixed the cause)."""
        if self._lake.holds.tables and time.monotonic() - self._retried >= self._cfg.retry_held_s:
            self._retried = time.monotonic()
            self._lake.retry_held()
        self._maintenance.maybe_run()

    async def _next(self, reader: ReadAhead) -> Fetched:
        """The next batch, prepared; one of a BINLAKE_CDC new to the lake once the lake adopted it."""
        fetched = await reader.next()
        if fetched.prepared is None:
            base = await asyncio.get_running_loop().run_in_executor(self._thread, self._lake.adopt_stream,
                                                                    fetched.batch.stream)
            fetched = await reader.prepare(fetched.batch, base)
        return fetched

    async def _unit(self, reader: ReadAhead, first: Fetched) -> tuple[list[Fetched], frames.Prepared]:
        """The batch, plus the next ones while a RENAME TABLE waits for its other half."""
        unit, prepared = [first], _prepared(first)
        for _ in range(self._cfg.rename_wait_batches):  # reads, empty ones included: a bound in time too
            waiting = self._lake.pending_renames(prepared.events)
            if not waiting:
                break
            self.log.info("loader.rename_read_ahead", waiting=waiting, batches=len(unit))
            more = await self._next(reader)
            if more.batch.id is not None:
                unit.append(more)
                prepared = frames.prepare([*prepared.events, *_prepared(more).events])
        return unit, prepared

    async def _apply(self, unit: list[Fetched], prepared: frames.Prepared) -> None:
        last = unit[-1].end
        if not prepared.events:
            return
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(self._thread, self._lake.apply, last, prepared)
        await loop.run_in_executor(self._thread, self._maintenance.maybe_run)
        seconds = time.monotonic() - started
        self._rows.inc(rows)
        self._batches.inc(len(unit))
        self._committed.set(last)
        self._seconds.set(seconds)
        newest = max((ts for _, e in prepared.events if isinstance(ts := e.get("ts"), int)), default=None)
        if newest is not None:
            self._lag.set(max(0.0, time.time() - newest / 1000))
        self.log.info("loader.committed", seq=last, rows=rows, batches=len(unit), seconds=round(seconds, 2))

    async def _report_held(self) -> None:
        """Tables set aside: the metric, `/healthz` and (when they changed) the key `binlake status` reads."""
        held = {f"{db}.{t}": {"reason": h.reason, "since_batch": h.since}
                for (db, t), h in sorted(self._lake.holds.tables.items())}
        self._held.set(len(held))
        if held:
            self._conditions.set(HELD, "source tables set aside (binlake status): " + "; ".join(
                f"{name} since batch {h['since_batch']}: {h['reason']}" for name, h in held.items()))
        else:
            self._conditions.clear(HELD)
        if held == self._reported or self._js is None:
            return
        kv = await jetstream.ensure_kv(self._js, Names(self._cfg.prefix).cursors_bucket, history=bus.CURSOR_HISTORY,
                                       replicas=self._cfg.replicas)
        with jetstream.nats_errors("held tables"):
            await kv.put(keys.loader_held(self._cfg.source, self._cfg.client), json.dumps(held).encode())
        self._reported = held

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


def _prepared(fetched: Fetched) -> frames.Prepared:
    assert fetched.prepared is not None  # Loader._next prepares every batch
    return fetched.prepared

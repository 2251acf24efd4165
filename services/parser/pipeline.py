"""Pipeline: one run of binlog -> BINLAKE_RAW (binlog thread, assembler, publisher, snapshots).

The pipeline is restarted as a unit on transient errors: every run re-checks the source,
re-reads the stream tail and opens a fresh binlog connection, so nothing from a failed run
survives in memory.
"""

from __future__ import annotations

import asyncio
import threading
import time

import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from services.parser.binlog import BinlogReader
from services.parser.checks import SourceInfo, gtid_state_at, inspect_source
from services.parser.config import ParserConfig
from services.parser.failover import other_history, resume_on
from services.parser.order_guard import OrderGuard
from services.parser.position import Tail, last_order, read_tail, saved_position
from services.parser.publisher import Publisher
from services.parser.snapshot.snapshotter import AckedScn, Snapshotter
from services.parser.snapshot.windows import Windows
from services.parser.source_watch import SourceWatch
from services.parser.transactions import Assembler, Outgoing, Resume
from shared import envelope, jetstream, objects
from shared.actor import Latest
from shared.async_publisher import AsyncPublisher
from shared.bridge import ThreadBridge
from shared.errors import BinlogPurged, SourceUnavailable
from shared.health import Conditions
from shared.metrics import Registry
from shared.mysql import MysqlUrl
from shared.subjects import Names

log = structlog.get_logger()


class Pipeline:
    """One run of binlog -> BINLAKE_RAW, from the stream tail until an error or cancellation."""

    def __init__(self, cfg: ParserConfig, nc: NATS, js: JetStreamContext, progress: Latest[Outgoing],
                 registry: Registry, cursors: KeyValue, watch: SourceWatch | None = None,
                 conditions: Conditions | None = None) -> None:
        self.cfg = cfg
        self.conditions = conditions
        self.cursors = cursors
        self.watch = watch
        self.registry = registry
        self.acked = AckedScn()
        self.nc = nc
        self.js = js
        self.names = Names(cfg.prefix)
        self.dsn = MysqlUrl.parse(cfg.source_url)
        self.progress = progress
        self.runs = registry.counter("parser_pipeline_starts_total", "Pipeline (re)starts")
        self.published = registry.counter("parser_messages_total", "Messages acked by JetStream")
        self.events = registry.counter("parser_binlog_events_total", "Binlog events read")
        self.objects = registry.counter("parser_objects_total", "Messages larger than max_payload put in an object")
        self.zero_dates = registry.counter("parser_zero_dates_total", "Zero or invalid dates decoded as null")
        self.schemas_compiled = registry.counter("parser_table_schemas_compiled_total",
                                                 "TableMaps compiled into decoders (a new table or schema)")
        self.log = log.bind(actor="pipeline")

    async def run(self) -> None:
        self.runs.inc()
        cfg = self.cfg
        info = await inspect_source(self.dsn)
        await jetstream.ensure_streams(self.js, self.names, cfg.partitions, cfg.replicas, streams=("raw",),
                                       limits=cfg.limits)
        await objects.ensure_or_warn(self.js, self.names.raw_objects_bucket, self.names.raw_stream,
                                     replicas=cfg.replicas)
        tail = await read_tail(self.js, self.names, cfg.source)
        saved = None if tail else await saved_position(self.cursors, cfg.source)
        last = tail.resume if tail else saved
        if last is not None:
            start = await self._resume(info, last, tail.skip.txn_id if tail and tail.skip else None)
        else:
            fresh = info.current if cfg.start == "current" else info.earliest
            start = Resume(fresh.file, fresh.offset, fresh.gtid, info.server_id, uuid=info.server_uuid)
        origin = "stream" if tail else "saved position" if saved else f"BINLAKE_START={cfg.start}"
        if not start.gtid and start.file not in info.binlogs:
            raise BinlogPurged(f"binlog {start.file} ({origin} {start.file}:{start.offset}) is no longer on the "
                               f"source (oldest is {info.binlogs[0]}); the changes in between are lost to binlake: "
                               "take a new snapshot and reset the parser")
        acks = AsyncPublisher(self.nc)
        await acks.start()
        try:
            await self._run(info, start, origin, tail, Publisher(acks, tail.last_id if tail else None, self._acked,
                                                                 window=cfg.publish_window,
                                                                 window_bytes=cfg.publish_window_bytes,
                                                                 ack_timeout_s=cfg.ack_timeout_s,
                                                                 put_object=self._put_object,
                                                                 stream=self.names.raw_stream,
                                                                 conditions=self.conditions))
        finally:
            await acks.close()

    async def _resume(self, info: SourceInfo, last: Resume, unfinished: str | None) -> Resume:
        """Where to continue after `last` on the server `info` describes (`failover`)."""
        there = await gtid_state_at(self.dsn, last.file, last.offset) if info.mariadb and last.gtid else None
        moved = other_history(last, info.mariadb, there, info.server_uuid)
        start = resume_on(last, info.server_id, info.mariadb, info.current.gtid, unfinished, moved=moved)
        if start.epoch != last.epoch:
            self.log.warning("pipeline.server_switched", server_id=info.server_id, previous=last.server,
                             same_server_id=last.server == info.server_id, gtid=start.gtid, epoch=start.epoch)
        return start

    async def _run(self, info: SourceInfo, start: Resume, origin: str, tail: Tail | None,
                   publisher: Publisher) -> None:
        cfg = self.cfg
        # MariaDB resumes by GTID; MySQL by file and offset on the same server (exact, and it never
        # streams a file from its start, which fails on transactions logged before gtid_mode=ON),
        # by GTID set on another one.
        by_gtid = bool(start.gtid) and (info.mariadb or start.server != info.server_id
                                        or start.uuid not in (None, info.server_uuid))
        asm = Assembler(cfg.source, self.names, start, max_payload=self.nc.max_payload, server=info.server_id,
                        uuid=info.server_uuid,
                        epoch=start.epoch, skip=tail.skip if tail else None, mariadb=info.mariadb,
                        gtids=info.gtids, by_gtid=by_gtid, ignore=frozenset({cfg.watermark}),
                        lower_names=info.lower_case_table_names == 1)
        self.log.info("pipeline.start", origin=origin, resume_file=start.file, resume_offset=start.offset,
                      resume_gtid=start.gtid, by_gtid=by_gtid, skip=tail.skip if tail else None, server=info.version,
                      lower_case_table_names=info.lower_case_table_names,
                      fresh=tail is None)
        if tail is None:
            # Persist the starting point before reading, so a crash cannot move it forward.
            await publisher.publish(asm.heartbeat(int(time.time() * 1000)))
            await publisher.flush()
        self.acked = AckedScn()  # per run: after a failover the positions may start lower
        bridge: ThreadBridge[Outgoing] = ThreadBridge(asyncio.get_running_loop(), max_items=20_000,
                                                      max_bytes=cfg.buffer_bytes, size=Outgoing.size)
        windows = Windows(cfg.source, cfg.watermark)
        reader = BinlogReader(self.dsn, cfg.replica_server_id, asm, bridge, mariadb=info.mariadb,
                              heartbeat_s=cfg.heartbeat_s, windows=windows, read_timeout_s=cfg.stall_s,
                              seen=self.watch.seen if self.watch else None)
        snapshotter = Snapshotter(cfg, self.js, self.cursors, windows, self.acked, self.registry)
        thread = threading.Thread(target=reader.run, name="binlog-reader", daemon=True)
        thread.start()
        guard = OrderGuard(lambda subject: last_order(self.js, self.names, subject))
        pump = asyncio.create_task(self._pump(bridge, publisher, reader, guard))
        snapshots = asyncio.create_task(snapshotter.run())
        try:
            done, _ = await asyncio.wait({pump, snapshots}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
            raise SourceUnavailable("the snapshotter stopped")  # unreachable: both run until an error
        finally:
            # Stop the reader first: nothing a task still awaits may depend on it.
            bridge.cancel()
            reader.interrupt()
            for task in (pump, snapshots):
                task.cancel()
            _, stuck = await asyncio.wait({pump, snapshots}, timeout=15)
            if stuck:
                self.log.error("pipeline.stuck_tasks", tasks=len(stuck))
            for task in (pump, snapshots):
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: the first error was raised above
            publisher.abandon()
            self._export(reader)
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 10.0)

    async def _pump(self, bridge: ThreadBridge[Outgoing], publisher: Publisher, reader: BinlogReader,
                    guard: OrderGuard) -> None:
        """Binlog thread -> JetStream, every message checked by `guard`, until the reader fails."""
        counted = 0
        while True:
            batch = bridge.get_nowait()
            if not batch:
                await publisher.flush()
                self.events.inc(reader.events - counted)
                counted = reader.events
                self._export(reader)
                try:
                    batch = await bridge.get()
                except EOFError:
                    raise SourceUnavailable("the binlog reader stopped") from None
            for msg in batch:
                await guard.check(msg)
            await publisher.publish(batch)

    def _export(self, reader: BinlogReader) -> None:
        self.zero_dates.set(reader.stats.zero_dates)
        self.schemas_compiled.set(reader.stats.schemas_compiled)

    async def _put_object(self, msg: Outgoing) -> None:
        ref = msg.blob_ref
        assert ref is not None and msg.blob is not None
        await objects.put(self.js, ref, msg.blob)
        self.objects.inc()
        self.log.info("pipeline.object", name=ref.name, bytes=ref.size, bucket=ref.bucket)

    def _acked(self, complete: Outgoing | None, count: int) -> None:
        """`count` messages were acked since the last call; `complete` ends the newest whole transaction."""
        self.published.inc(count)
        if complete is not None:
            self.progress.set(complete)
            self.acked.advance(envelope.scn(complete.resume.file, complete.resume.offset, complete.resume.epoch))

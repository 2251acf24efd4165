"""Actor: runs the requested table snapshots, chunk by chunk, through watermark windows.

Requests (`binlake snapshot`) and, with BINLAKE_SNAPSHOT_TABLES, tables seen for the first
time become per-table progress entries in the cursor bucket. Up to `snapshot_parallel`
tables run at once, each on its own source connection. A chunk's progress is written only
after JetStream acknowledged its rows, so a parser killed at any point resumes every table
at its last finished chunks (at worst the two chunks in flight are emitted again; `r` rows
are idempotent).

A problem of one table (missing privilege, unsupported type, a row too large, an SQL error)
fails that table with the reason in its progress entry; change capture goes on. Only
outages (source, NATS) restart the pipeline, and the snapshot resumes with it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

import asyncmy.errors
import nats.js.errors
import structlog
from asyncmy.cursors import SSCursor
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from services.parser.columns import TableSchema
from services.parser.config import ParserConfig
from services.parser.snapshot.catalog import (
    TableShape,
    UnsupportedColumn,
    chunk_sql,
    describe,
    key_param,
    keyset_params,
    list_tables,
    placeholder,
)
from services.parser.snapshot.values import block_decoder, block_size, nbytes, reads_unicode, row_size_check
from services.parser.snapshot.watermarks import Watermarks, connect, read_unicode
from services.parser.snapshot.windows import BOTH, HIGH, LOW, Chunk, Outcome, Windows
from services.parser.values import DecodeStats
from shared import envelope, keys
from shared import snapshots as snap
from shared.actor import raise_if_cancelled
from shared.errors import BinlakeError, FatalError, ForeignValue, OversizeEvent, SnapshotConflict, SourceUnavailable
from shared.jetstream import kv_entries, nats_errors
from shared.metrics import Registry
from shared.mysql import MysqlUrl, map_mysql_error
from shared.patterns import cached
from shared.subjects import Names

MAX_ROW_BYTES = 1 << 30  # MariaDB's largest max_allowed_packet; a larger row goes to an object store
MAX_RETRIES = 20  # windows read again in a row before a table fails
RECONNECTS = 3  # lost snapshot connections in a row before the pipeline restarts
# lock wait timeout, deadlock, a consistent read begun before a DDL on its table: read the chunk again
_RETRY_CODES = frozenset({1205, 1213, 1412})
_GONE_CODES = frozenset({1146})  # the table was dropped under the SELECT
_DECODE_ERRORS = (UnicodeError, LookupError, ValueError)


_STALE = "the table changed since its columns were read"
_PAGE_WAIT_S = 86_400  # net_write_timeout of a keyless table's read: its pages wait for their windows


@dataclass(frozen=True)
class _Read:
    """A chunk read and handed to its window; the binlog thread settles `outcome` at its H."""

    wid: str
    outcome: asyncio.Future[Outcome]
    shape: TableShape
    known_mark: int | None  # the DDL mark its cached columns were confirmed at; None: described for it
    rows: int
    last_key: list[Any] | None
    done: bool  # the table's last chunk
    consistent: bool = False  # a page of a keyless table's consistent read


async def _binlog_in_commit_order(cur: Any) -> bool:
    """MySQL's `binlog_order_commits` (MariaDB has no such setting: it always is)."""
    try:
        await cur.execute("SELECT @@GLOBAL.binlog_order_commits")
    except asyncmy.errors.MySQLError as exc:
        if exc.args and exc.args[0] == 1193:  # unknown system variable
            return True
        raise
    (value,) = await cur.fetchone()
    return str(value.decode() if isinstance(value, bytes) else value) not in ("0", "OFF")


class _Pages:
    """A keyless table's consistent read (its own connection, one transaction), handed out in pages."""

    def __init__(self, conn: Any, cursor: Any, shape: TableShape) -> None:
        self.conn = conn
        self.cursor = cursor
        self.shape = shape
        self.exhausted = False

    def close(self) -> None:
        self.conn.close()  # without reading the rest: closing the socket ends the statement

    def hold(self, paused: bool) -> None:
        """Stop (or resume) reading the socket between pages. asyncmy (0.2) has no receive
        backpressure: an idle unbuffered result would stream into its buffer whole; paused, the
        kernel's socket buffer fills and the server waits (`net_write_timeout`)."""
        transport = getattr(self.conn, "_transport", None)
        if transport is not None and not transport.is_closing():
            (transport.pause_reading if paused else transport.resume_reading)()


@dataclass(frozen=True)
class _Stop:
    state: str
    reason: str


class TableFailed(Exception):
    """This table's snapshot cannot go on (the reason is recorded in its progress)."""


def now_ms() -> int:
    return int(time.time() * 1000)


class AckedScn:
    """The order key up to which JetStream has acknowledged whole transactions."""

    def __init__(self) -> None:
        self.value = 0
        self._moved = asyncio.Event()

    def advance(self, scn: int) -> None:
        if scn > self.value:
            self.value = scn
            self._moved.set()
            self._moved = asyncio.Event()

    async def wait_past(self, scn: int) -> None:
        while self.value <= scn:
            await self._moved.wait()


class RateLimiter:
    """At most `rate` rows per second over every table (0: unlimited)."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._next = 0.0

    async def spend(self, rows: int) -> None:
        if self._rate <= 0 or rows <= 0:
            return
        now = time.monotonic()
        start = max(self._next, now)
        self._next = start + rows / self._rate
        if self._next > now:
            await asyncio.sleep(self._next - now)


class Snapshotter:
    def __init__(self, cfg: ParserConfig, js: JetStreamContext, kv: KeyValue, windows: Windows, acked: AckedScn,
                 registry: Registry, *, max_row_bytes: int = MAX_ROW_BYTES) -> None:
        self.cfg = cfg
        self.js = js
        self.kv = kv
        self.bucket = Names(cfg.prefix).cursors_bucket
        self.windows = windows
        self.acked = acked
        self.max_row_bytes = max_row_bytes
        self.dsn = MysqlUrl.parse(cfg.source_url)
        self.marks = Watermarks(cfg.watermark, cfg.source)
        self._pages: dict[str, _Pages] = {}  # keyless tables being read, by name
        self._replacing: dict[str, TableShape] = {}  # keyless tables a `replace` may have gone out for
        self.limiter = RateLimiter(cfg.snapshot_max_rows_s)
        self.stats = DecodeStats()
        self._ensured = False
        # Per table being snapshotted: its shape and the DDL mark it was confirmed at. Described
        # once, not per chunk; a DDL on the table seen by the binlog thread makes it stale.
        self._shapes: dict[str, tuple[TableShape, int]] = {}
        self._removed: dict[str, int] = {}  # table -> `Windows.removal_mark` its chunks were read after
        self._rows = registry.gauge("parser_snapshot_rows", "Rows a table's snapshot has emitted")
        self._estimate = registry.gauge("parser_snapshot_rows_estimated", "Estimated rows of a table being snapshotted")
        self._done = registry.gauge("parser_snapshot_done", "1 when a table's snapshot has finished")
        self._chunks = registry.counter("parser_snapshot_chunks_total", "Snapshot chunks emitted")
        self._retries = registry.counter("parser_snapshot_retries_total", "Snapshot chunks read again")
        self.log = structlog.get_logger().bind(actor="snapshot")

    async def run(self) -> None:
        tasks: dict[str, tuple[asyncio.Task[None], int]] = {}
        last_scan = -1e9
        try:
            while True:
                await self._accept_requests()
                raise_if_cancelled()
                if self.cfg.snapshot_tables and time.monotonic() - last_scan >= self.cfg.snapshot_scan_s:
                    await self._discover()
                    raise_if_cancelled()
                    last_scan = time.monotonic()
                for key, (task, _) in list(tasks.items()):
                    if task.done():
                        del tasks[key]
                        task.result()  # only outages come out of a table task
                entries = await self._load()
                raise_if_cancelled()
                for p, _ in entries.values():
                    self._export(p)
                waiting = sorted((p.requested_ms, key) for key, (p, _) in entries.items() if not p.finished)
                for _, key in waiting:
                    if key in tasks or len(tasks) >= self.cfg.snapshot_parallel:
                        continue
                    slot = min(set(range(self.cfg.snapshot_parallel)) - {s for _, s in tasks.values()})
                    p, rev = entries[key]
                    tasks[key] = (asyncio.create_task(self._table(key, p, rev, slot)), slot)
                await asyncio.sleep(self.cfg.snapshot_poll_s)
        finally:
            for task, _ in tasks.values():
                task.cancel()
            if tasks:
                await asyncio.wait([t for t, _ in tasks.values()], timeout=10)

    # -- progress in the cursor bucket --------------------------------------------------

    async def _load(self) -> dict[str, tuple[snap.TableProgress, int]]:
        out = {}
        for key, value, rev in await kv_entries(self.js, self.bucket, keys.snapshot_tables(self.cfg.source)):
            try:
                # ForeignValue (a server reply relayed into the key) is not caught: the parser halts.
                out[key] = (snap.TableProgress.from_json(value, key, self.bucket), rev)
            except (ValueError, TypeError, KeyError) as exc:
                self.log.error("snapshot.bad_progress_entry", key=key, error=repr(exc),
                               hint=f"delete it: nats kv del {self.bucket} {key}")
        return out

    async def _save(self, key: str, p: snap.TableProgress, rev: int | None) -> int:
        with nats_errors("snapshot progress"):
            try:
                if rev is None:
                    rev = await self.kv.create(key, p.to_json())
                else:
                    rev = await self.kv.update(key, p.to_json(), last=rev)
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyValueError) as exc:
                raise SnapshotConflict(f"snapshot progress of {p.name} changed under this parser ({exc})") from exc
        raise_if_cancelled()
        self._export(p)
        return rev

    def _export(self, p: snap.TableProgress) -> None:
        self._rows.set(p.rows, table=p.name)
        self._estimate.set(max(p.estimate, p.rows), table=p.name)
        self._done.set(1 if p.state == snap.DONE else 0, table=p.name)

    async def _tables(self) -> list[tuple[str, str]]:
        conn = await connect(self.dsn)
        try:
            return await list_tables(conn, frozenset({self.cfg.watermark}))
        except asyncmy.errors.MySQLError as exc:
            raise map_mysql_error(exc, "list of tables") from exc
        finally:
            conn.close()

    async def _accept_requests(self) -> None:
        entries = await kv_entries(self.js, self.bucket, keys.snapshot_requests(self.cfg.source))
        fresh = []
        for key, value, rev in entries:
            try:
                req = snap.SnapshotRequest.from_json(value, key, self.bucket)
                for pattern in req.patterns:
                    cached(pattern)  # compiled once: matching uses the same
            except (ValueError, TypeError, KeyError, ForeignValue) as exc:
                # Not written by `binlake snapshot`: answer it, never fail on it (a request is no
                # position: nothing is lost). Its history keeps what was there.
                self.log.error("snapshot.bad_request", key=key, error=str(exc))
                bad = snap.SnapshotRequest(id=key.rsplit(".", 1)[-1], patterns=[], created_ms=now_ms(),
                                           state="failed", error=f"malformed snapshot request: {exc}")
                await self._answer(key, bad, rev)
                continue
            if req.state == "new":
                fresh.append((key, req, rev))
            elif now_ms() - req.created_ms > 86_400_000:
                with nats_errors("snapshot request"):
                    await self.kv.delete(key)  # answered a day ago: nobody waits for it any more
        if not fresh:
            return
        tables = await self._tables()
        current = await self._load()
        for key, req, rev in fresh:
            chosen = [(db, t) for db, t in tables if snap.matches(req.patterns, db, t)]
            if not chosen:
                answer = replace(req, state="failed", error=f"no table of the source matches {' '.join(req.patterns)}")
            else:
                started = [await self._start(db, t, req.id, current) for db, t in chosen]
                answer = replace(req, state="accepted", tables=started)
            await self._answer(key, answer, rev)
            self.log.info("snapshot.request", request=req.id, patterns=req.patterns, tables=len(chosen),
                          error=answer.error)

    async def _answer(self, key: str, answer: snap.SnapshotRequest, rev: int) -> None:
        with nats_errors("snapshot request"):
            try:
                await self.kv.update(key, answer.to_json(), last=rev)
            except nats.js.errors.KeyWrongLastSequenceError:
                pass  # the requester changed it meanwhile; it is read again
        raise_if_cancelled()

    async def _start(self, db: str, table: str, run: str, current: dict[str, tuple[snap.TableProgress, int]]) -> str:
        """A progress entry for a (re-)requested table; a running snapshot is joined, not restarted."""
        key = keys.snapshot_table(self.cfg.source, db, table)
        found = current.get(key)
        if found is None or found[0].finished:
            p = snap.TableProgress(db=db, table=table, run=run, requested_ms=now_ms())
            current[key] = (p, await self._save(key, p, found[1] if found else None))
        return key

    async def _discover(self) -> None:
        """BINLAKE_SNAPSHOT_TABLES: snapshot every matching table that never had one."""
        tables = await self._tables()
        current = await self._load()
        for db, table in tables:
            key = keys.snapshot_table(self.cfg.source, db, table)
            if key not in current and snap.matches([self.cfg.snapshot_tables], db, table):
                await self._start(db, table, f"auto-{now_ms()}", current)
                self.log.info("snapshot.discovered", table=f"{db}.{table}")

    # -- one table ------------------------------------------------------------------------

    async def _table(self, key: str, p: snap.TableProgress, rev: int, slot: int) -> None:
        conn = await connect(self.dsn)
        commit: asyncio.Task[int] | None = None
        sealed: _Read | None = None  # a chunk the last watermark closed, its outcome not yet settled
        self.windows.snapshotting += 1
        self._removed[p.name] = self.windows.removal_mark(p.db, p.table)
        try:
            if p.state == snap.PENDING:
                t = now_ms()
                p = replace(p, state=snap.RUNNING, started_ms=t, updated_ms=t)
                rev = await self._save(key, p, rev)
            self.log.info("snapshot.table", table=p.name, run=p.run, resume_chunk=p.chunks, rows=p.rows)
            retries = reconnects = 0
            try:
                if not self._ensured:
                    await self.marks.ensure(conn)
                    self._ensured = True
                while not p.finished:
                    if commit is not None and commit.done():
                        commit.result()  # a failed progress write stops the table now, not at its end
                    before = p.retries
                    if (removed := self.windows.removal_mark(p.db, p.table)) != self._removed[p.name]:
                        # The lake empties the table at that statement, with the chunks emitted
                        # before it: read them all again.
                        self._removed[p.name] = removed
                        if sealed is not None:
                            self.windows.close(sealed.wid)
                            sealed = None
                        self._drop_pages(p.name)
                        p = replace(p, last_key=None)
                        self.log.warning("snapshot.restarted", table=p.name,
                                         reason="rows removed by a partition statement")
                    try:
                        # Chunk k+1 is read while the binlog thread releases chunk k; progress is
                        # written in chunk order, each only after its rows were acknowledged.
                        step: _Read | _Stop | str | None = await self._begin(conn, p, slot, sealed)
                        if sealed is not None:
                            p, scn, ok = await self._settle(sealed, p)
                            sealed = None
                            if ok:
                                commit = asyncio.create_task(self._commit(key, p, scn, commit, rev))
                            elif not isinstance(step, _Stop):  # chunk k is read again, and k+1 after it
                                if isinstance(step, _Read):
                                    self.windows.close(step.wid)
                                step = None
                        if isinstance(step, _Read) and step.done:
                            sealed = step  # so that a failed write below closes its window too
                            await self.marks.write(conn, slot, step.wid, HIGH)  # nothing follows to close it
                            sealed = None
                            p, scn, ok = await self._settle(step, p)
                            if ok:
                                commit = asyncio.create_task(self._commit(key, p, scn, commit, rev))
                        elif isinstance(step, _Read):
                            sealed = step
                        elif isinstance(step, _Stop):
                            p = self._stopped(p, step.state, step.reason)
                            commit = asyncio.create_task(self._commit(key, p, None, commit, rev))
                        elif isinstance(step, str):
                            p = self._retry(p, step)
                    except SourceUnavailable:
                        if sealed is not None:
                            self.windows.close(sealed.wid)  # its rows are read again on the new connection
                            sealed = None
                        self._drop_pages(p.name)
                        reconnects += 1
                        if reconnects > RECONNECTS:
                            raise
                        conn.close()
                        await asyncio.sleep(reconnects)
                        conn = await connect(self.dsn)
                        continue
                    reconnects = 0
                    retries = retries + 1 if p.retries > before else 0
                    if retries:
                        await asyncio.sleep(min(2.0, 0.05 * retries))  # let a burst of writes pass
                    if retries >= MAX_RETRIES:
                        raise TableFailed(f"read again {retries} times in a row ({p.error or 'see the parser log'}); "
                                          "the table changes too often for a snapshot without a primary key, "
                                          "or keeps being altered")
            except (FatalError, TableFailed) as exc:
                # This table cannot be snapshotted; change capture and the other tables go on.
                if sealed is not None:
                    self.windows.close(sealed.wid)
                    sealed = None
                if (shape := self._replacing.get(p.name)) is not None:
                    await self._abandon(conn, p, shape, slot)
                p = self._stopped(p, snap.FAILED, str(exc))
                commit = asyncio.create_task(self._commit(key, p, None, commit, rev, after_failure=True))
            if commit is not None:
                await commit
            self.log.info("snapshot.finished", table=p.name, state=p.state, rows=p.rows, chunks=p.chunks,
                          retries=p.retries, error=p.error)
        finally:
            if sealed is not None:
                self.windows.close(sealed.wid)  # else the window would hold its rows forever
            self._drop_pages(p.name)
            self._replacing.pop(p.name, None)
            self.windows.snapshotting -= 1
            self._shapes.pop(p.name, None)
            self._removed.pop(p.name, None)
            if commit is not None and not commit.done():
                commit.cancel()
                await asyncio.wait([commit], timeout=5)
            conn.close()

    async def _commit(self, key: str, p: snap.TableProgress, scn: int | None, before: asyncio.Task[int] | None,
                      rev: int, *, after_failure: bool = False) -> int:
        """Write `p` once the previous chunk's progress is written and this chunk's rows are acked."""
        if before is not None:
            try:
                rev = await before
            except BinlakeError:
                if not after_failure:
                    raise
                rev = (await self.kv.get(key)).revision or rev  # record the failure on top of whatever is there
        if scn is not None:
            await self.acked.wait_past(scn)
        return await self._save(key, p, rev)

    async def _begin(self, conn: Any, p: snap.TableProgress, slot: int, sealed: _Read | None) -> _Read | _Stop | str:
        """Open a window (its low watermark closes `sealed`'s) and read the chunk after `sealed`'s rows.

        Returns the chunk read (its window open, filled), a stop of the table, or why this read
        must be done again.
        """
        known = self._shapes.get(p.name)
        wid, outcome = self._window(p, slot, str(p.chunks))
        read: _Read | None = None
        try:
            await self.marks.write(conn, slot, wid, BOTH if sealed is not None else LOW)
            try:
                shape = known[0] if known is not None else await describe(conn, p.db, p.table, self.stats)
                if shape is None:
                    return _Stop(snap.DROPPED, "the table no longer exists")
                last, key, sig = (sealed.last_key, sealed.shape.key, sealed.shape.key_sig) if sealed is not None \
                    else (p.last_key, tuple(p.key), p.key_sig)
                if (shape.key != key or shape.key_sig != sig) and last is not None:
                    # The chunking key changed (ALTER TABLE): its order is another; start over.
                    self.log.warning("snapshot.key_changed", table=p.name, old=sig, new=shape.key_sig)
                    last = None
                if shape.key:
                    rows, last_key, done = await self._read(conn, shape, last)
                    chunk = Chunk(shape.schema, shape.key, rows)
                else:
                    chunk = await self._page(p.name, shape)
                    rows, last_key, done = chunk.rows, None, envelope.REPLACED in chunk.marks
            except UnsupportedColumn as exc:
                raise TableFailed(str(exc)) from None
            except _DECODE_ERRORS as exc:
                if known is not None:  # read with columns an ALTER changed: describe and read again
                    self._shapes.pop(p.name, None)
                    return _STALE
                raise TableFailed(f"cannot decode a value of {p.name}: {exc!r}") from None
            except asyncmy.errors.MySQLError as exc:
                code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
                if code in _RETRY_CODES:
                    return str(exc)
                if code in _GONE_CODES:
                    return _Stop(snap.DROPPED, "the table no longer exists")
                err = map_mysql_error(exc, f"snapshot of {p.name}")
                if isinstance(err, SourceUnavailable):
                    raise err from exc
                if known is not None:
                    self._shapes.pop(p.name, None)
                    return f"{_STALE} ({exc.args[-1] if exc.args else exc})"
                raise TableFailed(f"reading {p.name} failed: {exc.args[-1] if exc.args else exc}") from None
            self.windows.fill(wid, chunk)
            read = _Read(wid, outcome, shape, known[1] if known is not None else None, len(rows),
                         last_key if rows else last, done, chunk.consistent)
            return read
        finally:
            if read is None:
                self.windows.close(wid)
                self._drop_pages(p.name)  # a keyless table's read begins again

    async def _settle(self, read: _Read, p: snap.TableProgress) -> tuple[snap.TableProgress, int | None, bool]:
        """Wait for the binlog thread to close `read`'s window: the progress it leads to, the scn
        to wait for, and whether the chunk was accepted (else it is read again)."""
        try:
            outcome = await self._await(read.outcome, p)
        finally:
            self.windows.close(read.wid)
        if outcome.retry is None and read.known_mark is not None and outcome.ddl_mark != read.known_mark \
                and not read.consistent:  # a page: the table cannot change under its read (`Windows._close`)
            outcome = replace(outcome, retry=_STALE)  # a DDL between the describe and H: its rows may be off
        if outcome.retry:
            self._shapes.pop(p.name, None)
            self._drop_pages(p.name)  # a keyless table's read begins again, with a new `replace`
            self._retries.inc()
            self.log.info("snapshot.retry", table=p.name, chunk=p.chunks, reason=outcome.retry)
            return self._retry(p, outcome.retry), None, False
        if read.known_mark is None:
            self._shapes[p.name] = (read.shape, outcome.ddl_mark)
        shape = read.shape
        p = replace(p, key=list(shape.key), key_kind=shape.key_kind, key_sig=shape.key_sig,
                    estimate=max(p.estimate, shape.estimate))
        if not shape.key and not read.consistent:  # a keyless read began (`replace`): it replaces earlier pages
            p = replace(p, rows=0)
        p = p.advanced(last_key=read.last_key, rows=outcome.emitted, now_ms=now_ms(), done=read.done)
        p = replace(p, error=None)
        self._chunks.inc()
        await self.limiter.spend(read.rows)
        return p, outcome.scn, True

    async def _read(self, conn: Any, shape: TableShape,
                    last_key: list[Any] | None) -> tuple[list[dict[str, Any]], list[Any] | None, bool]:
        """One chunk of a table with a key, in key order after `last_key`: its rows as `r` changes,
        the key of the last one, and whether it was the table's last (not cut short at the bytes)."""
        schema = shape.schema
        names = tuple(c.name for c in schema.columns)
        by_name = {c.name: (i, c) for i, c in enumerate(schema.columns)}
        key_cols = [by_name[k] for k in shape.key]
        sql = chunk_sql(schema.db, schema.table, names, shape.key, after=last_key is not None,
                        limit=self.cfg.snapshot_chunk_rows, placeholders=tuple(placeholder(c) for _, c in key_cols))
        params = keyset_params(tuple(last_key)) if last_key is not None else []
        read_unicode(conn, reads_unicode(schema.columns))
        try:
            async with conn.cursor(SSCursor) as cur:
                await cur.execute(sql, params)
                # Cut short at the bytes, the rest of the chunk is read and dropped as the cursor closes.
                rows, raw, last = await self._fetch(cur, schema)
        finally:
            read_unicode(conn, False)
        if raw is None:
            return rows, None, last
        return rows, [key_param(c, raw[i]) for i, c in key_cols], last

    async def _page(self, name: str, shape: TableShape) -> Chunk:
        """A keyless table's next window: the one that begins its consistent read (`replace`), a page
        of at most `snapshot_chunk_rows` rows and `snapshot_chunk_bytes`, or the end (`replaced`).
        Only a page is in memory, whatever the table's size."""
        pages = self._pages.get(name)
        if pages is not None and pages.shape.schema != shape.schema:
            self._drop_pages(name)  # described again with other columns: begin again
            pages = None
        if pages is None:
            self._pages[name] = await self._begin_read(shape)
            self._replacing[name] = shape
            return Chunk(shape.schema, (), [], marks=(envelope.REPLACE,))
        rows: list[dict[str, Any]] = []
        if not pages.exhausted:
            pages.hold(False)
            rows, _, pages.exhausted = await self._fetch(pages.cursor, shape.schema)
            pages.hold(True)
        if not rows:
            return Chunk(shape.schema, (), [], marks=(envelope.REPLACED,), consistent=True)
        return Chunk(shape.schema, (), rows, consistent=True)

    async def _fetch(self, cur: Any, schema: TableSchema) -> tuple[list[dict[str, Any]], tuple[Any, ...] | None, bool]:
        """Rows of an unbuffered cursor as `r` changes, block by block: at most `snapshot_chunk_rows`,
        ending early at `snapshot_chunk_bytes`. Returns them, the last raw row, and whether the
        cursor ran out."""
        columns = schema.columns
        decode = block_decoder(columns, self.stats, unicode=reads_unicode(columns), wrap="after")
        bound = row_size_check(columns, self.max_row_bytes)
        # Rows that could add up to more than the chunk's bytes are measured.
        per_row = row_size_check(columns, self.cfg.snapshot_chunk_bytes // self.cfg.snapshot_chunk_rows)
        measure = bound or per_row  # (fixed, long) depends on the columns only: one measurement serves both
        rows: list[dict[str, Any]] = []
        raw: tuple[Any, ...] | None = None
        size, step = 0, 1024 if per_row is None else 1
        limit, budget = self.cfg.snapshot_chunk_rows, self.cfg.snapshot_chunk_bytes
        while len(rows) < limit:
            many = await cur.fetchmany(min(step, limit - len(rows)))  # one await per block of rows, not per row
            if not many:
                return rows, raw, True
            if measure is not None:
                total, largest = block_size(many, *measure)
                if bound is not None and largest > self.max_row_bytes:
                    self._check_sizes(schema, many, *measure)
            rows.extend(decode(many))
            raw = many[-1]
            if per_row is not None:
                size += total
                if size >= budget:
                    break
                step = max(1, min(1024, (budget - size) // max(1, largest)))  # the next block fits the budget
        return rows, raw, False

    async def _begin_read(self, shape: TableShape) -> _Pages:
        """A connection in a consistent read of the table, its SELECT sent (rows are fetched page by page)."""
        schema = shape.schema
        conn = await connect(self.dsn)
        try:
            async with conn.cursor() as cur:
                if not await _binlog_in_commit_order(cur):
                    raise TableFailed(f"{schema.db}.{schema.table} has no key, and its snapshot needs the binlog "
                                      "in commit order: set binlog_order_commits=ON, or give the table a key")
                await cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                # Pages are fetched as their windows close: the server must wait that long for us.
                await cur.execute(f"SET SESSION net_write_timeout = {_PAGE_WAIT_S}")
                await cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            read_unicode(conn, reads_unicode(schema.columns))
            cursor = conn.cursor(SSCursor)
            names = tuple(c.name for c in schema.columns)
            await cursor.execute(chunk_sql(schema.db, schema.table, names, (), after=False, limit=0))
        except BaseException:
            conn.close()
            raise
        pages = _Pages(conn, cursor, shape)
        pages.hold(True)  # until its first page
        return pages

    def _window(self, p: snap.TableProgress, slot: int, tag: str) -> tuple[str, asyncio.Future[Outcome]]:
        """Open a window on `p`'s table: its id, and the outcome the binlog thread settles at its H."""
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[Outcome] = loop.create_future()

        def settle(result: Outcome) -> None:
            if not outcome.done():
                outcome.set_result(result)

        def resolve(result: Outcome) -> None:  # called from the binlog thread
            loop.call_soon_threadsafe(settle, result)

        wid = f"{p.run}.{tag}.{secrets.token_hex(4)}"
        self.windows.open(wid, p.db, p.table, resolve, slot)
        return wid, outcome

    async def _abandon(self, conn: Any, p: snap.TableProgress, shape: TableShape, slot: int) -> None:
        """Tell consumers that the keyless snapshot begun by the last `replace` will not complete
        (`abandoned`): they drop its rows, and binlake's loader merges the table again."""
        wid, outcome = self._window(p, slot, "abandoned")
        try:
            await self.marks.write(conn, slot, wid, LOW)
            self.windows.fill(wid, Chunk(shape.schema, (), [], marks=(envelope.ABANDONED,), consistent=True))
            await self.marks.write(conn, slot, wid, HIGH)
            result = await self._await(outcome, p)
        finally:
            self.windows.close(wid)
        if result.retry is not None:  # only when the binlog never showed its low watermark
            self.log.warning("snapshot.abandon_failed", table=p.name, reason=result.retry)
            return
        if result.scn is not None:
            await self.acked.wait_past(result.scn)
        self.log.info("snapshot.abandoned", table=p.name)

    def _drop_pages(self, name: str) -> None:
        pages = self._pages.pop(name, None)
        if pages is not None:
            pages.close()

    def _check_sizes(self, schema: TableSchema, rows: list[tuple[Any, ...]], fixed: int, long: tuple[int, ...]) -> None:
        """Fail the table at a row larger than a snapshot reads (`block_size` bounded the block above it)."""
        for raw in rows:
            if fixed + sum(nbytes(raw[i]) for i in long if raw[i]) > self.max_row_bytes:
                raise TableFailed(str(OversizeEvent(
                    f"a row of {schema.db}.{schema.table} holds more than {self.max_row_bytes} bytes, more than "
                    "a snapshot reads in one row")))

    async def _await(self, fut: asyncio.Future[Outcome], p: snap.TableProgress) -> Outcome:
        """The binlog thread closes the window when it reaches H; say so if that takes long."""
        waited = 0.0
        while not fut.done():
            # asyncio.wait, not wait_for: 3.11's wait_for can swallow a cancellation (gh-86296).
            await asyncio.wait([fut], timeout=30.0)
            if not fut.done():
                waited += 30.0
                self.log.warning("snapshot.waiting_for_binlog", table=p.name, waited_s=waited,
                                 hint="the binlog reader has not reached the high watermark yet: it is behind, "
                                      "or a binlog filter (binlog_ignore_db) hides the watermark table")
        return fut.result()

    @staticmethod
    def _retry(p: snap.TableProgress, reason: str) -> snap.TableProgress:
        return replace(p, retries=p.retries + 1, error=reason, updated_ms=now_ms())

    def _stopped(self, p: snap.TableProgress, state: str, error: str) -> snap.TableProgress:
        t = now_ms()
        self.log.warning("snapshot.stopped", table=p.name, state=state, error=error)
        return replace(p, state=state, error=error, updated_ms=t, finished_ms=t)

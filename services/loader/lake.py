"""The lake: per source table an Iceberg changelog and a current-state table.

```
<catalog>.<db>.<table>__changelog   append-only: every change (and DDL) with its bookkeeping columns
<catalog>.<db>.<table>              current rows; MERGE INTO from the changelog tail
<catalog>._binlake.commits          one row per batch every table it touched has committed
<catalog>._binlake.cuts             per consistent cut, each current table's snapshot (`cuts`)
<catalog>._binlake.resnapshots      re-snapshots DDL needs, until filed (`resnapshots`)
```
(names escaped by `naming.escape`). A batch costs one append per table it touches; tables whose
part of the unit is row changes only (no DDL, already in the lake) are appended `write_threads`
at a time (each Iceberg commit is mostly the driver waiting on files: two cores run four at once
in half the time of one after the other), everything else one step after the other. When
one table's tail is large or old enough (`MergePolicy`), every table with a tail is merged
at the same batch and that cut is published; a DDL that changes columns or data merges its
own table first. `merges.live_sql` overlays the un-merged tail for readers who need the
newest state.

Exactly once: every commit carries the table's `Marker` (source order key of its last
change, and the batch). A change delivered again (after a crash, or a `binlake rewind`) at or
below a table's changelog marker is skipped, one above it is applied: a rewind re-applies what
each table lacks, and a table dropped from the lake or restored from an older copy is built up
again. The current table's marker says where the tail starts. While units come below the
last committed batch (a rewind), the tables stand at different batches: no cut is published
until a unit reaches it again (`replay_until`).

RENAME TABLE travels on both tables' subjects, which are routed independently, so the two
halves may reach BINLAKE_CDC in either order: each named table stops at the statement
until all have reached it (`pending_renames` asks the loader for more batches), then the
lake tables are renamed and the streams go on.

A table whose change Spark or Iceberg refuses is set aside (`holds`): its changes are kept
in `_binlake.held` while every other table goes on, and it is tried again at every start
(and every `retry_held_s` by the loader).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import structlog
from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import SparkSession

from services.loader import frames, schema_change
from services.loader.cuts import Cuts
from services.loader.frames import Ddl, Replace, Rows
from services.loader.holds import Holds
from services.loader.iceberg import Iceberg, Marker
from services.loader.merges import Fold, live_sql, merge_sql
from services.loader.naming import (
    BOOK_NAMESPACE,
    COMMITS_TABLE,
    RENAMES_TABLE,
    STREAMS_TABLE,
    TableNames,
    quote,
    sql_string,
)
from services.loader.resnapshots import Request, Resnapshots, request_id
from services.loader.tables import LakeTable, ReservedColumn, arrow_to_spark, lake_source
from shared.envelope import REPLACE
from shared.errors import HeldTableRenamed

T = TypeVar("T")
# Spark's words for a job that a term's end (cancelAllJobs) or a stopping session cut short.
_CANCELLED = re.compile(r"(?:Job|Stage) \d+ cancelled|cancelled as part of|SparkContext was shut down")


@dataclass(frozen=True)
class MergePolicy:
    """When the current table is brought up to date from the changelog tail."""

    rows: int = 1_000_000  # tail rows
    age_s: float = 300.0  # seconds since the oldest un-merged change was appended


CATCH_UP_AGE_FACTOR = 4  # a loader always behind still merges by age, BINLAKE_MERGE_S times this


@dataclass
class Lake:
    spark: SparkSession
    catalog: str
    policy: MergePolicy = field(default_factory=MergePolicy)
    include: Callable[[str, str], bool] = lambda db, table: True  # the loader's filter
    views: bool = False  # publish `__live` views (catalogs that store views: REST, JDBC, Nessie)
    clock: Callable[[], float] = time.monotonic
    committed: int = 0  # the last batch every touched table committed (from the commits table)
    # BINLAKE_CDC identity -> what its sequences add up to lake sequences (the lake's own stay increasing)
    bases: dict[str, int] = field(default_factory=dict)
    resnapshot: list[Request] = field(default_factory=list)  # recorded, not filed with the parser yet
    replay_until: int = 0  # units come again below this batch (a rewind): no cut until one reaches it
    behind: bool = False  # the store had more waiting: merges by age wait until the lake caught up
    write_threads: int = 4  # tables appended at once (row changes only; 1: one after the other)

    def __post_init__(self) -> None:
        self.ice = Iceberg(self.spark, self.catalog)
        self.holds = Holds(self.spark, self.catalog)
        self._requests = Resnapshots(self.spark, self.catalog)
        self._tables: dict[tuple[str, str], LakeTable | None] = {}
        self._views = self.views
        self._renamed: dict[tuple[str, str], int] = {}  # (db, table) -> scn of its last RENAME away
        self._renames_done: set[tuple[str, str, str, str, int]] = set()  # (old, new, scn) pairs applied
        self.cuts = Cuts(self.spark, self.ice, self.catalog)
        self._cut_now = False  # a RENAME moved a table the newest cut names: publish one at the end of the unit
        self._replaying: tuple[str, str] | None = None  # the held table `_retry` applies the kept changes of
        self.log = structlog.get_logger().bind(actor="lake")
        self._holding = threading.Lock()  # tables set aside from the writer threads: one at a time
        self._writers = ThreadPoolExecutor(self.write_threads, "lake-append") if self.write_threads > 1 else None

    @property
    def renames(self) -> str:
        return f"{quote(self.catalog)}.{quote(BOOK_NAMESPACE)}.{quote(RENAMES_TABLE)}"

    @property
    def commits(self) -> str:
        return f"{quote(self.catalog)}.{quote(BOOK_NAMESPACE)}.{quote(COMMITS_TABLE)}"

    # -- start-up ------------------------------------------------------------------------------

    @property
    def streams(self) -> str:
        return f"{quote(self.catalog)}.{quote(BOOK_NAMESPACE)}.{quote(STREAMS_TABLE)}"

    def open(self) -> int:
        self.ice.create_namespace(BOOK_NAMESPACE)
        self.ice.create(self.streams, {"stream": "string", "base": "bigint"}, {})
        for r in self.spark.sql(f"SELECT stream, base FROM {self.streams}").collect():
            self.bases[str(r[0])] = int(r[1])
        self.ice.create(self.commits, {"seq": "bigint", "committed_at": "timestamp", "tables": "int",
                                       "rows": "bigint"}, {})
        self.ice.create(self.renames, {"old_db": "string", "old_table": "string", "new_db": "string",
                                       "new_table": "string", "scn": "bigint"}, {})
        self.resnapshot = self._requests.open(self.ice)
        row = self.spark.sql(f"SELECT max(seq) FROM {self.commits}").collect()[0][0]
        self.committed = int(row or 0)
        last = self.spark.sql(f"SELECT seq FROM {self.commits} ORDER BY committed_at DESC, seq DESC LIMIT 1").collect()
        if last and int(last[0][0]) < self.committed:  # stopped while re-applying after a rewind
            self.replay_until = self.committed
        self.ice.create(self.holds.ident, self.holds.columns, {})
        for r in self.spark.sql(f"SELECT old_db, old_table, new_db, new_table, scn FROM {self.renames}").collect():
            old, scn = (str(r[0]), str(r[1])), int(r[4])
            self._renamed[old] = max(scn, self._renamed.get(old, -1))
            self._renames_done.add((*old, str(r[2]), str(r[3]), scn))
        self.holds.load()
        self.retry_held()
        for ns in self.ice.namespaces():  # every table, so that un-merged tails are merged after a restart
            for ident in self.ice.tables(ns):
                found = lake_source(self.ice, ns, ident)
                if found is not None and found[2] == "changelog" and (found[0], found[1]) not in self.holds:
                    self._guarded((found[0], found[1]), self.committed, partial(self.table, found[0], found[1]))
        # A kill mid-cut leaves merged tables and no cut, or a cut whose tags did not all move.
        # Tails left are due at once (`LakeTable.load`) and their merge publishes the cut; with
        # none left, every table already holds every committed batch: publish that cut now.
        self.cuts.open()
        self.cuts.tag(self.cuts.newest_snapshots([t.names for t in self.loaded()]))
        if self.committed > self.cuts.newest and not any(t.tail_rows for t in self.loaded()):
            self.merge_all(self.committed)
        return self.committed

    def adopt_stream(self, stream: str) -> int:
        """The base of BINLAKE_CDC definition `stream`, the lake's last batch when it first loads from it.

        The store hands out batches of a stream defined again only after an operator resumed the
        loader on it (`binlake rewind ... --to-start`): its sequences restart at 1, and continue the
        lake's own sequence from where it stands."""
        if stream not in self.bases:
            self.spark.sql(f"INSERT INTO {self.streams} VALUES ({sql_string(stream)}, {self.committed})")
            self.bases[stream] = self.committed
            if self.committed:
                self.log.warning("lake.cdc_stream_changed", stream=stream, base=self.committed)
        return self.bases[stream]

    def table(self, db: str, name: str) -> LakeTable | None:
        """The lake table of a source table (None before its first change)."""
        key = (db, name)
        if key not in self._tables:
            self._tables[key] = LakeTable.load(self.ice, TableNames(self.catalog, db, name))
        return self._tables[key]

    def _create(self, db: str, name: str, columns: Sequence[Mapping[str, Any]], key: Sequence[str]) -> LakeTable:
        self.ice.create_namespace(TableNames(self.catalog, db, name).namespace)
        table = LakeTable.create(self.ice, TableNames(self.catalog, db, name), columns, key)
        self._tables[(db, name)] = table
        self.publish_view(table)
        return table

    # -- one unit of work (one batch, or several when a RENAME is split across them) ----------

    def pending_renames(self, events: Sequence[tuple[int, dict[str, Any]]]) -> list[str]:
        """RENAME statements not every named (loaded) table has reached yet."""
        seen: dict[int, set[tuple[str, str]]] = {}
        needed: dict[int, set[tuple[str, str]]] = {}
        for _, env in events:
            if env.get("op") != "ddl" or not (env.get("alter") or {}).get("renames"):
                continue
            scn = int(env["scn"])
            seen.setdefault(scn, set()).add((env.get("db") or "", env.get("table") or ""))
            needed[scn] = {(str(r[i]), str(r[i + 1])) for r in env["alter"]["renames"] for i in (0, 2)
                           if self.include(str(r[i]), str(r[i + 1]))}
        out = []
        for scn, names in needed.items():
            missing = names - seen[scn]
            if missing and not self._rename_applied(scn, needed[scn]):
                out.append(f"scn {scn}: waiting for {sorted(missing)}")
        return out

    def _gone(self, db: str, name: str, scn: int) -> bool:
        """A change of a table from before a RENAME that moved it away (the lake has it under the new name)."""
        return scn <= self._renamed.get((db, name), -1)

    def _rename_applied(self, scn: int, names: set[tuple[str, str]]) -> bool:
        if any(self._gone(db, name, scn) for db, name in names):
            return True
        for db, name in names:
            t = self.table(db, name)
            if t is not None and t.appended.scn >= scn:
                return True
        return False

    def apply(self, batch: int, events: Sequence[tuple[int, dict[str, Any]]] | frames.Prepared) -> int:
        """Write a unit ending at CDC sequence `batch`; returns the row changes written."""
        prepared = events if isinstance(events, frames.Prepared) else frames.prepare(events)
        self.reached(batch)
        renames = False
        for changes in prepared.tables.values():
            for step in changes.steps:
                if isinstance(step, Ddl) and step.alter.get("renames"):
                    self._check_rename(step)
                    renames = True
        queues = {k: list(v.steps) for k, v in prepared.tables.items()}
        touched = set[tuple[str, str]]()
        # A RENAME ties tables together (halves, names taken over): such a unit goes in order.
        written = 0 if renames else self._append_rows_only(queues, batch, touched)
        while True:
            progressed = False
            for key, steps in queues.items():
                while steps:
                    step = steps[0]
                    if key in self.holds:
                        steps.clear()  # kept below, with the rest of its changes
                        break
                    if isinstance(step, Ddl) and step.alter.get("renames"):
                        break  # a barrier: handled below once every named table has reached it
                    steps.pop(0)
                    written += self._guarded(key, batch, partial(self._step, key, step, batch, touched)) or 0
                    progressed = True
            progressed |= self._renames(queues, batch, touched)
            if not progressed:
                break
        stuck = {k: s for k, s in queues.items() if s}
        for key, steps in stuck.items():  # halves that never came: rename with what is here
            head = steps[0]
            self.log.warning("lake.rename_incomplete", db=key[0], table=key[1],
                             ddl=head.sql if isinstance(head, Ddl) else None)
            for step in steps:
                if key not in self.holds:
                    forced = partial(self._step, key, step, batch, touched, force=True)
                    written += self._guarded(key, batch, forced) or 0
        for key in prepared.tables:
            if key in self.holds:
                self.holds.keep(key, [(seq, env) for seq, env in prepared.events
                                      if (env.get("db") or "", env.get("table")) == key])
        # A unit the tables already held (a kill between their commits and this record) is
        # still recorded: the record, not the tables' markers, says how far the lake is.
        if touched or batch > self.committed:
            self._record(batch, len(touched), written)
        self.committed = max(self.committed, batch)
        self.merge_due(self.committed)  # after the record: a cut never names a batch the lake does not hold
        return written

    def _append_rows_only(self, queues: dict[tuple[str, str], list[frames.Step]], batch: int,
                          touched: set[tuple[str, str]]) -> int:
        """Append the tables whose steps are all row changes, `write_threads` at a time, and take
        them out of `queues`; a table's own steps stay in order. Tables new to the lake, set aside,
        or with a DDL or snapshot mark in the unit are left to `apply`'s ordered loop. A failure
        other than a refusal is raised once every table's append has ended (the redelivered unit
        finds each table's marker where its own append left it)."""
        if self._writers is None:
            return 0
        alone = [k for k, steps in queues.items()
                 if k not in self.holds and steps and all(isinstance(s, Rows) for s in steps)
                 and self._guarded(k, batch, partial(self.table, *k)) is not None]
        if len(alone) < 2:
            return 0

        def run(key: tuple[str, str]) -> int:
            return sum(self._guarded(key, batch, partial(self._step, key, step, batch, touched)) or 0
                       for step in queues[key])

        futures = {key: self._writers.submit(run, key) for key in alone}
        wait(futures.values())  # every one done before a failure is raised: nothing writes on behind it
        failed = {key: exc for key, f in futures.items() if (exc := f.exception()) is not None}
        for (db, name), exc in failed.items():
            self.log.error("lake.append_failed", table=f"{db}.{name}", batch=batch, error=str(exc)[:500])
        written = sum(f.result() for f in futures.values())
        for key in alone:
            queues[key] = []
        return written

    def close(self) -> None:
        """End the writer threads (a loader's term is over): appends not begun are cancelled (the
        unit then fails), one under way finishes or is cancelled with Spark's jobs."""
        if self._writers is not None:
            self._writers.shutdown(wait=False, cancel_futures=True)

    def reached(self, batch: int) -> None:
        """The loader is at `batch`: below the last committed one, units come again (a rewind, or a
        crash's redelivery) and tables stand at different batches until one reaches it."""
        if batch < self.committed:
            if not self.replay_until:
                self.log.info("lake.reapplying", batch=batch, until=self.committed)
            self.replay_until = max(self.replay_until, self.committed)
        elif self.replay_until and batch >= self.replay_until:
            self.log.info("lake.reapplied", batch=batch)
            self.replay_until = 0

    # -- tables set aside ------------------------------------------------------------------------

    def _guarded(self, key: tuple[str, str], batch: int, fn: Callable[[], T]) -> T | None:
        """Run one table's write; a refusal of that table's change sets the table aside (None)."""
        try:
            return fn()
        except Exception as exc:
            reason = refusal(self.spark, exc)
            if reason is None:
                raise
            self._set_aside(key, reason, batch)
            return None

    def _set_aside(self, key: tuple[str, str], reason: str, batch: int) -> None:
        with self._holding:
            first = key not in self.holds
            self.holds.hold(key, reason, batch)
            self._tables.pop(key, None)  # reloaded from the lake when it loads again
        if first:
            self.log.error("lake.table_held", table=f"{key[0]}.{key[1]}", batch=batch, reason=reason)

    def retry_held(self) -> list[str]:
        """Try every table set aside again; the names of those that load again."""
        return [f"{db}.{table}" for db, table in list(self.holds.tables) if self._retry((db, table))]

    def _retry(self, key: tuple[str, str]) -> bool:
        """Apply a held table's kept changes; release it when they all went in."""
        events = self.holds.events(key)
        changes = frames.prepare(events).tables.get(key)
        batch = self.committed
        self._replaying = key  # its own kept RENAME (the other half came later) may go through

        def replay() -> int:
            for step in changes.steps if changes is not None else []:
                self._step(key, step, batch, set(), force=True)
            table = self.table(*key)
            if table is not None and not table.replace_open:  # an incomplete snapshot merges once complete
                self.flush(table, batch)
            return 0

        try:
            replayed = self._guarded(key, batch, replay)
        finally:
            self._replaying = None
        if replayed is None:
            self.log.warning("lake.table_still_held", table=f"{key[0]}.{key[1]}",
                             reason=self.holds.tables[key].reason)
            return False
        self.holds.release(key)
        self.log.info("lake.table_resumed", table=f"{key[0]}.{key[1]}", changes=len(events))
        return True

    def _step(self, key: tuple[str, str], step: frames.Step, batch: int, touched: set[tuple[str, str]],
              force: bool = False) -> int:
        db, name = key
        if isinstance(step, Rows):
            return self._rows(db, name, step, batch, touched)
        if self._gone(db, name, int(step.env["scn"])):
            return 0
        if isinstance(step, Replace):
            found = self.table(db, name)
            if found is None and step.op == REPLACE and step.env.get("schema"):
                # Created here, not by the first page: the snapshot is open (not merged, no cut) from
                # the start, durably, whatever batch its pages come in.
                found = self._create(db, name, step.env["schema"]["columns"], list(step.env.get("pk") or []))
            if found is not None and (step.env["scn"], step.seq) > found.appended.order:
                found.record_replace(self.ice, step, batch, self.clock())
                touched.add(key)
            return 0
        if step.alter.get("renames") and force:
            self._rename_pairs(step, batch, touched)
            return 0
        table = self.table(db, name)
        if table is not None and (step.env["scn"], step.seq) <= table.appended.order:
            return 0
        table = schema_change.apply(self, db, name, table, step, batch)
        if table is not None:
            table.record_ddl(self.ice, step, batch)
            self.publish_view(table)
            touched.add((table.names.db, table.names.table))
        return 0

    def _rows(self, db: str, name: str, run: Rows, batch: int, touched: set[tuple[str, str]]) -> int:
        table = self.table(db, name)
        pieces = run.arrow_segments()
        if (db, name) in self._renamed:
            pieces = [_after(t, Marker(self._renamed[(db, name)], 1 << 62)) for t in pieces]
        if table is not None:
            pieces = [_after(t, table.appended) for t in pieces]
        pieces = [t for t in pieces if t.num_rows]
        if not pieces:
            return 0
        columns = run.columns
        if table is None:
            table = self._create(db, name, columns, run.pk)
        table.conform(self, columns, run.pk)
        rows = sum(t.num_rows for t in pieces)
        last = pieces[-1]
        marker = Marker(int(last["_binlake_scn"][-1].as_py()), int(last[frames.SEQ][-1].as_py()),
                        max(batch, table.appended.batch))
        frame = None
        for piece in pieces:
            df = arrow_to_spark(self.spark, piece, table.changelog_columns)
            frame = df if frame is None else frame.unionByName(df)
        assert frame is not None
        table.append(self.ice, frame, marker, rows, self.clock())
        touched.add((db, name))
        return int(rows)

    # -- renames ---------------------------------------------------------------------------------

    def _renames(self, queues: dict[tuple[str, str], list[frames.Step]], batch: int,
                 touched: set[tuple[str, str]]) -> bool:
        heads: dict[int, list[tuple[tuple[str, str], Ddl]]] = {}
        for key, steps in queues.items():
            if steps and isinstance(steps[0], Ddl) and steps[0].alter.get("renames"):
                heads.setdefault(int(steps[0].env["scn"]), []).append((key, steps[0]))
        progressed = False
        for _scn, members in sorted(heads.items()):
            step = members[0][1]
            needed = {(str(r[i]), str(r[i + 1])) for r in step.alter["renames"] for i in (0, 2)
                      if self.include(str(r[i]), str(r[i + 1]))}
            if not needed <= {k for k, _ in members} and not self._rename_applied(_scn, needed):
                continue
            latest = max((s for _, s in members), key=lambda s: s.seq)
            self._rename_pairs(latest, batch, touched)
            for key, _ in members:
                queues[key].pop(0)
            progressed = True
        return progressed

    def _check_rename(self, step: Ddl) -> None:
        """HeldTableRenamed when the RENAME names a table set aside (also one set aside in this unit)."""
        named = {(str(r[i]), str(r[i + 1])) for r in step.alter["renames"] for i in (0, 2)}
        for db, table in sorted(named & set(self.holds.tables) - {self._replaying}):
            raise HeldTableRenamed(
                f"{step.sql[:200]!r} renames {db}.{table}, which the loader set aside "
                f"({self.holds.tables[(db, table)].reason}); its kept changes would stay behind under the old "
                "name, so the loader stops before the rename. Fix that cause (binlake status shows it) and "
                "restart the loader: the table loads again, then the rename")

    def _rename_pairs(self, step: Ddl, batch: int, touched: set[tuple[str, str]]) -> None:
        self._check_rename(step)
        scn = int(step.env["scn"])
        for old_db, old, new_db, new in step.alter["renames"]:
            pair = (old_db, old, new_db, new, scn)
            if pair in self._renames_done:
                continue  # applied before (a redelivery, a rewind): a swap must not swap back
            source = self.table(old_db, old)
            target = self.table(new_db, new)
            order = (scn, step.seq)
            if source is not None and not (target is not None and target.appended.order >= order):
                self.flush(source, batch)
                if target is not None:  # what a dropped table of that name left behind
                    target.drop(self.ice)
                self.ice.create_namespace(TableNames(self.catalog, new_db, new).namespace)
                source.rename(self.ice, TableNames(self.catalog, new_db, new))
                self._tables[(old_db, old)] = None
                self._tables[(new_db, new)] = source
                source.record_ddl(self.ice, step, batch)
                self.publish_view(source)
                touched.add((new_db, new))
                self._cut_now = True
                self.log.info("lake.table_renamed", old=f"{old_db}.{old}", new=f"{new_db}.{new}")
            # After the rename (a kill before it redoes the pair; one after finds the source gone). With
            # nothing loaded under the old name the new name starts fresh, and the record still holds.
            self.spark.sql(f"INSERT INTO {self.renames} VALUES ({sql_string(old_db)}, {sql_string(old)}, "
                           f"{sql_string(new_db)}, {sql_string(new)}, {scn})")
            self._renamed[(old_db, old)] = max(scn, self._renamed.get((old_db, old), -1))
            self._renames_done.add(pair)

    # -- merges ------------------------------------------------------------------------------------

    def flush(self, table: LakeTable, batch: int) -> None:
        """Bring the current table up to date with the changelog."""
        if not table.tail_rows:
            return
        marker = Marker(*table.appended.order, table.appended.batch)
        fold = Fold(table.names.current, table.names.changelog, table.columns, table.key, table.merged.order,
                    replacing=table.replacing)
        started = self.clock()
        self.log.info("lake.merge_started", table=f"{table.names.db}.{table.names.table}", rows=table.tail_rows)
        self.ice.run_marked(marker, merge_sql(fold))
        self.log.info("lake.merged", table=f"{table.names.db}.{table.names.table}", rows=table.tail_rows,
                      seconds=round(self.clock() - started, 2))
        if table.replace_open:  # a DDL or RENAME merges now: the parser reads that table again after it
            self.log.info("lake.snapshot_abandoned", table=f"{table.names.db}.{table.names.table}")
        table.merged, table.tail_rows, table.tail_since = marker, 0, None
        table.replacing = table.replace_open = False
        self.publish_view(table)

    def publish_view(self, table: LakeTable) -> None:
        """`<db>.<table>__live`: the fold as a view, where the catalog stores views (REST, JDBC, Nessie)."""
        if not self._views:
            return
        fold = Fold(table.names.current, table.names.changelog, table.columns, table.key, table.merged.order)
        try:
            self.spark.sql(f"CREATE OR REPLACE VIEW {table.names.live} AS {live_sql(fold)}")
        except Exception as exc:  # e.g. a catalog without views: say so once, readers use live_frame
            self._views = False
            self.log.warning("lake.no_views", catalog=self.catalog, reason=str(exc).splitlines()[0][:300])

    def merge_due(self, batch: int) -> None:
        """When any table's tail is due (`MergePolicy`), merge every tail and publish cut `batch`."""
        if self._cut_now:
            self.merge_all(batch)
            return
        now = self.clock()
        for key, table in list(self._tables.items()):
            if table is None or not table.tail_rows or key in self.holds or table.replace_open:
                continue
            age = now - (now if table.tail_since is None else table.tail_since)
            # Behind, a merge by age waits until the lake caught up, or for CATCH_UP_AGE_FACTOR times as long.
            age_s = self.policy.age_s * (CATCH_UP_AGE_FACTOR if self.behind else 1)
            if table.tail_rows >= self.policy.rows or age >= age_s:
                self.merge_all(batch)
                return

    def loaded(self) -> list[LakeTable]:
        """The tables the lake writes (tables set aside are left as they are)."""
        return [t for k, t in self._tables.items() if t is not None and k not in self.holds]

    def merge_all(self, batch: int | None = None) -> None:
        """Merge every table's tail, then publish the cut at `batch` (default: the last committed).

        Every table then reflects every change up to the batch; the cut is recorded once all are
        merged, so a kill in between publishes nothing (the restarted lake finishes the cut). A table
        that cannot be merged is set aside and left out of the cut. A keyless table whose snapshot is
        not complete is not merged, and no cut is published until it is.
        """
        cut = self.committed if batch is None else batch
        waiting = [t for k, t in self._tables.items() if t is not None and k not in self.holds and t.replace_open]
        for key, table in list(self._tables.items()):
            if table is not None and key not in self.holds and not table.replace_open:
                self._guarded(key, cut, partial(self.flush, table, cut))
        if waiting:
            self.log.info("lake.cut_waits", cut=cut, snapshots=[f"{t.names.db}.{t.names.table}" for t in waiting])
        elif cut > self.cuts.newest and not self.replay_until:  # the same batch holds the same rows: one cut each
            self.cuts.publish(cut, [t.names for t in self.loaded()])
            self._cut_now = False
            self.log.info("lake.cut_published", cut=cut, tables=len(self.loaded()))

    def _record(self, batch: int, tables: int, rows: int) -> None:
        self.spark.sql(f"INSERT INTO {self.commits} VALUES ({batch}, current_timestamp(), {tables}, {rows})")

    def request_resnapshot(self, db: str, table: str, why: str, order: tuple[int, int]) -> None:
        """Record (durably, before the DDL at `order` commits) that `db.table` must be read again."""
        req = Request(request_id(db, table, order), db, table, why)
        if any(r.id == req.id for r in self.resnapshot):
            return
        self._requests.add(req)
        self.resnapshot.append(req)
        self.log.warning("lake.resnapshot", table=f"{db}.{table}", why=why, request=req.id)

    def resnapshot_filed(self, req: Request) -> None:
        """The parser has the request: it is not filed again."""
        self._requests.filed(req)
        self.resnapshot = [r for r in self.resnapshot if r.id != req.id]


def _after(table: pa.Table, marker: Marker) -> pa.Table:
    """The rows of an Arrow changelog piece after the marker's order key."""
    if marker.order == (0, 0):
        return table
    scn, seq = table["_binlake_scn"], table[frames.SEQ]
    keep = pc.or_(pc.greater(scn, marker.scn), pc.and_(pc.equal(scn, marker.scn), pc.greater(seq, marker.seq)))
    return table.filter(keep)


def refusal(spark: SparkSession, exc: Exception) -> str | None:
    """The reason when `exc` is Spark or Iceberg refusing one table's change; None for anything
    else (Spark stopped or cancelled, the JVM out of memory, a bug), which must stop the loader."""
    if isinstance(exc, ReservedColumn):
        return str(exc)
    if not isinstance(exc, CapturedException | Py4JJavaError):
        return None
    text = str(exc)
    if isinstance(exc, Py4JJavaError):
        java = exc.java_exception
        if java.getClass().getName().startswith("java.lang.") and "Error" in java.getClass().getName():
            return None  # OutOfMemoryError and the like: the JVM, not the table
        text = str(java.toString())
    jsc = spark.sparkContext._jsc
    if jsc is None or jsc.sc().isStopped() or _CANCELLED.search(str(exc)):
        return None  # a term that ended (cancelAllJobs) or a stopped session
    return text.strip().splitlines()[0][:500] if text.strip() else type(exc).__name__

"""DBLog watermark windows, shared by the snapshotter (event loop) and the binlog thread.

For every chunk the snapshotter opens a window, writes the low watermark L into the source,
SELECTs the chunk, hands it over (`fill`), and writes the high watermark H. Between two
chunks of a table one write does both (B: the H of the slot's open window, then the L of
the next), so a chunk costs one watermark write, and the next chunk is read while the
binlog thread releases the one before. The binlog thread
sees L, then every change in between, then H, in binlog order. At H it drops the chunk rows
whose key changed between L and H (the binlog already carries their newer state) and emits
the rest as `op = "r"` at H's position, inside the parser's own ordered, de-duplicated
chain. The result equals the source at H whatever was written meanwhile.

A table without a key is read in one consistent read instead, in pages: its first window
only begins the read (START TRANSACTION WITH CONSISTENT SNAPSHOT) and emits a `replace` at H
if nothing touched the table between L and H, so the read sees exactly the changes before the
`replace` in binlog order. Each later window releases one page of that read without looking at
changes (the lake counts rows as a multiset: the snapshot's rows and the changes after the
`replace` add up in any order), and the last one emits `replaced`.

Pure apart from a lock: the binlog thread and the event loop both call in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from services.parser.alter import describe
from services.parser.columns import TableSchema

LOW, HIGH, BOTH = "L", "H", "B"


@dataclass(frozen=True)
class Chunk:
    """What the snapshotter read between L and H."""

    schema: TableSchema
    key: tuple[str, ...]  # () = rows are matched by every column (tables without a key)
    rows: list[dict[str, Any]]  # as the `r` changes they become: {"after": row}
    marks: tuple[str, ...] = ()  # `replace` / `replaced` (a keyless table's snapshot), before the rows
    consistent: bool = False  # a page of a consistent read begun in an earlier window: emitted as read


@dataclass(frozen=True)
class Outcome:
    """How the binlog thread closed a window."""

    emitted: int = 0
    scn: int | None = None  # order key of the emitted messages; None when nothing was published
    retry: str | None = None  # why the chunk must be read again
    ddl_mark: int = 0  # DDL statements on the table seen up to H (see Windows.ddl_mark)


@dataclass
class Window:
    id: str
    db: str
    table: str
    resolve: Callable[[Outcome], None]
    slot: int = 0
    low_seen: bool = False
    chunk: Chunk | None = None
    changed: list[dict[str, Any]] = field(default_factory=list)
    spoiled: str | None = None


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def row_key(row: dict[str, Any], key: tuple[str, ...]) -> tuple[Any, ...]:
    if key:
        return tuple(_freeze(row.get(k)) for k in key)
    return tuple(sorted((k, _freeze(x)) for k, x in row.items()))


def surviving(chunk: Chunk, changed: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chunk rows whose key no change between the watermarks touched."""
    if not changed:
        return chunk.rows  # the usual case: no key to compute per row
    touched = {row_key(image, chunk.key) for image in changed}
    return [row for row in chunk.rows if row_key(row["after"], chunk.key) not in touched]


# (schema, rows, marks): the marks (`replace`, `replaced`) go first; emits even without rows.
Emit = Callable[[TableSchema, list[dict[str, Any]], tuple[str, ...]], int | None]


class Windows:
    """Open windows by id and by table; `active` is read without the lock on the hot path."""

    def __init__(self, source: str, watermark_table: tuple[str, str]) -> None:
        self.source = source
        self.watermark_table = watermark_table
        self._watermark = (watermark_table[0].casefold(), watermark_table[1].casefold())
        self._lock = threading.Lock()
        self._by_id: dict[str, Window] = {}
        self.active = False
        # DDL statements seen by the binlog thread per (db, table), casefolded; ("", "") counts
        # statements whose tables are unknown. Counted while `snapshotting` (table snapshots
        # running, set by the event loop), so a table's shape is described again only after a DDL.
        self._ddl: dict[tuple[str, str], int] = {}
        # Of those, the statements that removed rows without row events (DROP/TRUNCATE/EXCHANGE
        # PARTITION): the lake empties the table there, so a running snapshot starts over.
        self._removals: dict[tuple[str, str], int] = {}
        self.snapshotting = 0

    # -- event loop side ----------------------------------------------------------------

    def open(self, window_id: str, db: str, table: str, resolve: Callable[[Outcome], None], slot: int = 0) -> None:
        with self._lock:
            self._by_id[window_id] = Window(window_id, db, table, resolve, slot)
            self.active = True

    def fill(self, window_id: str, chunk: Chunk) -> None:
        with self._lock:
            w = self._by_id.get(window_id)
            if w is not None:
                w.chunk = chunk

    def close(self, window_id: str) -> None:
        with self._lock:
            self._by_id.pop(window_id, None)
            self.active = bool(self._by_id)

    # -- binlog thread side -------------------------------------------------------------

    def is_watermark(self, db: str, table: str) -> bool:
        # Case-insensitive: with lower_case_table_names the binlog names it in lower case.
        return (db.casefold(), table.casefold()) == self._watermark

    def on_rows(self, db: str, table: str, rows: list[dict[str, Any]]) -> None:
        """A rows event of a user table: remember the images of windows past their L."""
        with self._lock:
            for w in self._by_id.values():
                if w.low_seen and w.table == table and w.db == db:
                    for row in rows:
                        w.changed.extend(image for image in (row.get("before"), row.get("after")) if image)

    @property
    def watching(self) -> bool:
        """Whether the binlog thread must report DDL: a window is open or a table snapshot runs."""
        return self.active or self.snapshotting > 0

    def ddl_mark(self, db: str, table: str) -> int:
        """How many DDL statements that may touch `db.table` have been seen (call under the lock)."""
        db = db.casefold()
        return self._ddl.get((db, table.casefold()), 0) + self._ddl.get((db, ""), 0) + self._ddl.get(("", ""), 0)

    def removal_mark(self, db: str, table: str) -> int:
        """How many statements that removed rows of `db.table` without row events have been seen."""
        with self._lock:
            return self._removals.get((db.casefold(), table.casefold()), 0)

    def on_ddl(self, tables: list[tuple[str, str]] | None, sql: str) -> None:
        """DDL between L and H may have changed what SELECT saw: such windows read again."""
        named = None if tables is None else {(db.casefold(), t.casefold()) for db, t in tables}
        removes = any(op["op"] == "reload" and op["removes"] for op in describe(sql, "")["ops"])
        with self._lock:
            for name in named if named is not None else {("", "")}:
                self._ddl[name] = self._ddl.get(name, 0) + 1
                if removes:
                    self._removals[name] = self._removals.get(name, 0) + 1
            for w in self._by_id.values():
                db, table = w.db.casefold(), w.table.casefold()
                if w.low_seen and (named is None or (db, table) in named or (db, "") in named):
                    w.spoiled = f"DDL between the watermarks: {sql[:120]}"

    def on_watermark(self, rows: list[dict[str, Any]], emit: Emit) -> None:
        """A write to the watermark table; at H (or B), `emit` publishes the surviving rows."""
        for row in rows:
            image = row.get("after") or {}
            if image.get("src") != self.source:
                continue
            mark, wid = image.get("mark"), str(image.get("win"))
            closing: list[tuple[Window, int]] = []
            with self._lock:
                w = self._by_id.get(wid)
                if mark == BOTH:  # the high watermark of the slot's window that saw its low one
                    closing = [(x, 0) for x in self._by_id.values()
                               if x.slot == image.get("slot") and x.low_seen and x.id != wid]
                elif mark == HIGH and w is not None:
                    closing = [(w, 0)]
                if mark in (LOW, BOTH) and w is not None:
                    w.low_seen = True
                for x, _ in closing:
                    self._by_id.pop(x.id)
                closing = [(x, self.ddl_mark(x.db, x.table)) for x, _ in closing]
                self.active = bool(self._by_id)
            # No window: another run's (this one restarted since); nothing waits for it.
            for x, ddl in closing:
                x.resolve(replace(self._close(x, emit), ddl_mark=ddl))

    @staticmethod
    def _close(w: Window, emit: Emit) -> Outcome:
        if not w.low_seen:
            return Outcome(retry="the low watermark was not seen")
        if w.chunk is None:
            return Outcome(retry=w.spoiled or "the high watermark came before the chunk was read")
        chunk = w.chunk
        # A page of a consistent read is the table at its `replace`, whatever came since: the read
        # holds the table's metadata lock, so no DDL on it can run meanwhile, and a statement the
        # binlog names no table for (GRANT, ANALYZE ...) must not begin a long read again.
        if w.spoiled and not chunk.consistent:
            return Outcome(retry=w.spoiled)
        if not chunk.key:
            if w.changed and not chunk.consistent:
                # The consistent read began somewhere between L and H: whether it saw a change made
                # there is unknown, so the `replace` cannot be placed; begin it again.
                return Outcome(retry="the table changed while its consistent read began, and it has no key")
            return Outcome(emitted=len(chunk.rows), scn=emit(chunk.schema, chunk.rows, chunk.marks))
        rows = surviving(chunk, w.changed)
        if not rows:
            return Outcome()
        return Outcome(emitted=len(rows), scn=emit(chunk.schema, rows, chunk.marks))

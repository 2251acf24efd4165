"""DBLog watermark windows: which chunk rows survive between L and H, and when a chunk is read again (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from services.parser import values as v
from services.parser.columns import Column, TableSchema
from services.parser.snapshot.windows import BOTH, HIGH, LOW, Chunk, Outcome, Windows, row_key, surviving

SRC = "main"
WATERMARKS = ("binlake", "watermarks")
SCN = 4242

T = TableSchema(
    db="shop",
    table="orders",
    columns=(
        Column("id", "int", False, v.ColumnType(v.LONG)),
        Column("v", "varchar", True, v.ColumnType(v.VARCHAR, length=40, encoding="utf-8"), "utf8mb4"),
    ),
    pk=("id",),
)


def row(i: int, val: str = "x") -> dict[str, Any]:
    return {"id": i, "v": val}


def chunk(*ids: int, key: tuple[str, ...] = ("id",)) -> Chunk:
    return Chunk(T, key, [ins(row(i)) for i in ids])


def mark(win: str, m: str, src: str = SRC, slot: int = 0) -> dict[str, Any]:
    """A rows-event row of the watermark table, as the binlog thread decodes it."""
    return {"after": {"src": src, "slot": slot, "win": win, "mark": m}}


def ins(r: dict[str, Any]) -> dict[str, Any]:
    return {"after": r}


def upd(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {"before": before, "after": after}


def dele(r: dict[str, Any]) -> dict[str, Any]:
    return {"before": r}


class Harness:
    """A Windows with one recorder per window id and an `emit` that records what it publishes."""

    def __init__(self) -> None:
        self.w = Windows(SRC, WATERMARKS)
        self.outcomes: dict[str, list[Outcome]] = {}
        self.emitted: list[tuple[TableSchema, list[dict[str, Any]]]] = []
        self.marked: list[tuple[str, ...]] = []

    def emit(self, schema: TableSchema, rows: list[dict[str, Any]], marks: tuple[str, ...]) -> int | None:
        self.emitted.append((schema, rows))
        self.marked.append(marks)
        return SCN

    def open(self, wid: str = "w1", db: str = "shop", table: str = "orders") -> None:
        self.outcomes[wid] = []
        self.w.open(wid, db, table, self.outcomes[wid].append)

    def marks(self, *rows: dict[str, Any]) -> None:
        self.w.on_watermark(list(rows), self.emit)

    def outcome(self, wid: str = "w1") -> Outcome:
        (out,) = self.outcomes[wid]
        return out

    def run(self, fill: Chunk | None, between: list[dict[str, Any]],
            before: tuple[dict[str, Any], ...] | list[dict[str, Any]] = ()) -> Outcome:
        """Open w1, changes `before` L, L, changes `between`, fill, H."""
        self.open()
        if before:
            self.w.on_rows("shop", "orders", list(before))
        self.marks(mark("w1", LOW))
        if between:
            self.w.on_rows("shop", "orders", between)
        if fill is not None:
            self.w.fill("w1", fill)
        self.marks(mark("w1", HIGH))
        return self.outcome()


@pytest.fixture
def h() -> Harness:
    return Harness()


# -- row_key / surviving ---------------------------------------------------------------------------


def test_row_key_picks_the_key_columns_in_key_order() -> None:
    assert row_key({"a": 1, "b": "x", "c": 2.5}, ("c", "a")) == (2.5, 1)
    assert row_key({"a": 1}, ("a", "missing")) == (1, None)


def test_row_key_without_key_is_the_whole_row_image_independent_of_column_order() -> None:
    assert row_key({"a": 1, "b": 2}, ()) == row_key({"b": 2, "a": 1}, ())
    assert row_key({"a": 1, "b": 2}, ()) != row_key({"a": 1, "b": 3}, ())


def test_set_values_are_hashable_in_keys() -> None:
    key = row_key({"id": 1, "tags": ["x", "z"]}, ("tags", "id"))
    assert key == (("x", "z"), 1)
    assert hash(key) == hash((("x", "z"), 1))
    keyless = row_key({"id": 1, "tags": ["x"]}, ())
    assert hash(keyless) == hash(row_key({"tags": ["x"], "id": 1}, ()))


def test_surviving_drops_every_touched_key_and_keeps_chunk_order() -> None:
    c = chunk(5, 1, 3, 2)
    assert surviving(c, [row(3, "new"), row(9)]) == [ins(row(5)), ins(row(1)), ins(row(2))]
    assert surviving(c, []) == c.rows


def test_surviving_with_a_set_typed_key() -> None:
    c = Chunk(T, ("tags",), [ins({"id": 1, "tags": ["a"]}), ins({"id": 2, "tags": ["a", "b"]})])
    assert surviving(c, [{"id": 7, "tags": ["a", "b"]}]) == [ins({"id": 1, "tags": ["a"]})]


# -- what survives at H ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "dropped"),
    [
        (upd(row(2), row(2, "y")), {2}),
        (upd(row(2), row(7)), {2, 7}),  # a primary-key move touches both the old and the new key
        (upd(row(9), row(3)), {3}),  # a row moved onto a key the chunk holds
        (dele(row(4)), {4}),
        (ins(row(5)), {5}),  # SELECT saw the insert too; the binlog carries it already
        (ins(row(99)), set()),  # outside the chunk: nothing to drop
    ],
    ids=["update", "pk-move-out", "pk-move-in", "delete", "insert-in-chunk", "insert-elsewhere"],
)
def test_rows_changed_between_the_watermarks_are_dropped(h: Harness, change: dict[str, Any],
                                                         dropped: set[int]) -> None:
    ids = [1, 2, 3, 4, 5, 7]
    out = h.run(chunk(*ids), [change])
    kept = [i for i in ids if i not in dropped]
    assert out == Outcome(emitted=len(kept), scn=SCN)
    ((schema, rows),) = h.emitted
    assert schema is T
    assert rows == [ins(row(i)) for i in kept]


def test_several_events_and_rows_accumulate(h: Harness) -> None:
    h.open()
    h.marks(mark("w1", LOW))
    h.w.on_rows("shop", "orders", [dele(row(1)), dele(row(2))])
    h.w.on_rows("shop", "orders", [upd(row(3), row(3, "z"))])
    h.w.fill("w1", chunk(1, 2, 3, 4))
    h.marks(mark("w1", HIGH))
    assert h.outcome() == Outcome(emitted=1, scn=SCN)
    assert h.emitted[0][1] == [ins(row(4))]


def test_changes_before_the_low_watermark_are_ignored(h: Harness) -> None:
    out = h.run(chunk(1, 2, 3), [], before=[upd(row(1), row(1, "y")), dele(row(2)), ins(row(3))])
    assert out == Outcome(emitted=3, scn=SCN)
    assert h.emitted[0][1] == [ins(row(1)), ins(row(2)), ins(row(3))]


def test_changes_after_the_high_watermark_do_not_matter(h: Harness) -> None:
    h.run(chunk(1, 2), [])
    h.w.on_rows("shop", "orders", [dele(row(1))])  # window already closed: no error, no effect
    assert h.emitted[0][1] == [ins(row(1)), ins(row(2))]


@pytest.mark.parametrize(("db", "table"), [("shop", "other"), ("other", "orders")])
def test_changes_of_another_table_are_ignored(h: Harness, db: str, table: str) -> None:
    h.open()
    h.marks(mark("w1", LOW))
    h.w.on_rows(db, table, [dele(row(1))])
    h.w.fill("w1", chunk(1, 2))
    h.marks(mark("w1", HIGH))
    assert h.outcome() == Outcome(emitted=2, scn=SCN)


def test_windows_of_different_tables_only_see_their_own_changes(h: Harness) -> None:
    h.open("a", table="orders")
    h.open("b", table="items")
    h.marks(mark("a", LOW), mark("b", LOW))
    h.w.on_rows("shop", "orders", [dele(row(1))])
    h.w.on_rows("shop", "items", [dele(row(2))])
    h.w.fill("a", chunk(1, 2))
    h.w.fill("b", chunk(1, 2))
    h.marks(mark("a", HIGH), mark("b", HIGH))
    assert h.outcome("a") == h.outcome("b") == Outcome(emitted=1, scn=SCN)
    assert [rows for _, rows in h.emitted] == [[ins(row(2))], [ins(row(1))]]


# -- watermark rows ------------------------------------------------------------------------------


def test_watermarks_of_another_source_are_ignored(h: Harness) -> None:
    h.open()
    h.marks(mark("w1", LOW, src="east"))  # another parser's L does not open our window
    h.w.fill("w1", chunk(1))
    h.marks(mark("w1", HIGH, src="east"))
    assert h.outcomes["w1"] == [] and h.w.active
    h.marks(mark("w1", HIGH))
    assert h.outcome().retry == "the low watermark was not seen"
    assert h.emitted == []


def test_unknown_window_ids_are_ignored(h: Harness) -> None:
    h.open()
    h.marks(mark("gone", LOW), mark("gone", HIGH), mark("w1", LOW), mark("other-run", HIGH))
    assert h.outcomes["w1"] == [] and h.w.active
    h.w.fill("w1", chunk(1))
    h.marks(mark("w1", HIGH))
    assert h.outcome() == Outcome(emitted=1, scn=SCN)


def test_other_marks_and_rows_without_an_after_image_are_ignored(h: Harness) -> None:
    h.open()
    h.marks(mark("w1", LOW), mark("w1", "X"), {"before": {"src": SRC, "win": "w1", "mark": HIGH}}, {})
    assert h.outcomes["w1"] == [] and h.w.active


def test_low_and_high_in_one_rows_event(h: Harness) -> None:
    h.open()
    h.w.fill("w1", chunk(1, 2))
    h.marks(mark("w1", LOW), mark("w1", HIGH))
    assert h.outcome() == Outcome(emitted=2, scn=SCN)


def test_high_without_low_is_a_retry(h: Harness) -> None:
    h.open()
    h.w.on_rows("shop", "orders", [dele(row(1))])
    h.w.fill("w1", chunk(1))
    h.marks(mark("w1", HIGH))
    out = h.outcome()
    assert out.retry == "the low watermark was not seen"
    assert (out.emitted, out.scn) == (0, None)
    assert h.emitted == [] and not h.w.active


def test_high_before_the_chunk_was_filled_is_a_retry(h: Harness) -> None:
    out = h.run(None, [])
    assert out.retry is not None and "before the chunk was read" in out.retry
    assert (out.emitted, out.scn) == (0, None)
    assert h.emitted == []
    h.w.fill("w1", chunk(1))  # too late: the window is gone, nothing happens
    assert h.emitted == [] and h.outcomes["w1"] == [out]


def test_a_window_resolves_once(h: Harness) -> None:
    h.run(chunk(1), [])
    h.marks(mark("w1", HIGH))
    assert len(h.outcomes["w1"]) == 1 and len(h.emitted) == 1


# -- DDL -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tables",
    [[("shop", "orders")], [("shop", "x"), ("shop", "orders")], None, [("shop", "")]],
    ids=["the-table", "among-others", "naming-no-table", "its-database"],
)
def test_ddl_on_the_table_after_low_is_a_retry(h: Harness, tables: list[tuple[str, str]] | None) -> None:
    h.open()
    h.marks(mark("w1", LOW))
    h.w.on_ddl(tables, "ALTER TABLE orders ADD COLUMN c INT")
    h.w.fill("w1", chunk(1, 2))
    h.marks(mark("w1", HIGH))
    out = h.outcome()
    assert out.retry is not None and out.retry.startswith("DDL between the watermarks")
    assert "ALTER TABLE orders" in out.retry
    assert h.emitted == []


def test_ddl_reason_is_truncated() -> None:
    h = Harness()
    h.open()
    h.marks(mark("w1", LOW))
    h.w.on_ddl(None, "x" * 500)
    h.w.fill("w1", chunk(1))
    h.marks(mark("w1", HIGH))
    assert h.outcome().retry == "DDL between the watermarks: " + "x" * 120


@pytest.mark.parametrize("tables", [[("shop", "other")], [("other", "orders")], [("other", "")]])
def test_ddl_on_another_table_is_no_retry(h: Harness, tables: list[tuple[str, str]]) -> None:
    h.open()
    h.marks(mark("w1", LOW))
    h.w.on_ddl(tables, "ALTER TABLE other ADD COLUMN c INT")
    h.w.fill("w1", chunk(1, 2))
    h.marks(mark("w1", HIGH))
    assert h.outcome() == Outcome(emitted=2, scn=SCN)


def test_ddl_before_low_is_no_retry(h: Harness) -> None:
    h.open()
    h.w.on_ddl(None, "ALTER TABLE orders ADD COLUMN c INT")
    h.w.on_ddl([("shop", "orders")], "ALTER TABLE orders ADD COLUMN d INT")
    h.marks(mark("w1", LOW))
    h.w.fill("w1", chunk(1))
    h.marks(mark("w1", HIGH))
    assert h.outcome() == Outcome(emitted=1, scn=SCN, ddl_mark=2)


def test_ddl_marks_count_what_may_touch_a_table() -> None:
    w = Windows(SRC, WATERMARKS)
    assert w.ddl_mark("shop", "orders") == 0 and not w.watching
    w.on_ddl([("Shop", "ORDERS")], "ALTER TABLE ORDERS ADD c INT")
    w.on_ddl([("shop", "")], "DROP DATABASE shop")
    w.on_ddl(None, "CREATE FUNCTION f ...")
    w.on_ddl([("shop", "other"), ("else", "orders")], "RENAME TABLE ...")
    assert w.ddl_mark("shop", "orders") == 3
    assert w.ddl_mark("SHOP", "Orders") == 3
    assert w.ddl_mark("shop", "other") == 3  # its own, its database's, the unnamed one
    assert w.ddl_mark("else", "x") == 1
    w.snapshotting += 1
    assert w.watching  # a running table snapshot hears DDL between its windows too


def test_the_outcome_carries_the_ddl_mark_at_high(h: Harness) -> None:
    h.w.on_ddl([("shop", "orders")], "ALTER TABLE orders ADD c INT")
    h.open()
    h.marks(mark("w1", LOW))
    h.w.fill("w1", chunk(1))
    h.marks(mark("w1", HIGH))
    h.w.on_ddl([("shop", "orders")], "ALTER TABLE orders ADD d INT")
    assert h.outcome() == Outcome(emitted=1, scn=SCN, ddl_mark=1)


# -- B: the high watermark of one chunk and the low one of the next in one write ----------------


def test_both_closes_the_slots_window_and_opens_the_next(h: Harness) -> None:
    h.open("w1")
    h.marks(mark("w1", LOW))
    h.w.on_rows("shop", "orders", [upd(row(2), row(2, "y"))])  # between L1 and B: drops row 2 of chunk 1
    h.w.fill("w1", chunk(1, 2))
    h.open("w2")
    h.marks(mark("w2", BOTH))
    assert h.outcome("w1") == Outcome(emitted=1, scn=SCN)
    assert [r for _, rows in h.emitted for r in rows] == [ins(row(1))]
    h.w.on_rows("shop", "orders", [upd(row(3), row(3, "y"))])  # after B: only chunk 2's window sees it
    h.w.fill("w2", chunk(3, 4))
    h.marks(mark("w2", HIGH))
    assert h.outcome("w2") == Outcome(emitted=1, scn=SCN)
    assert [r for _, rows in h.emitted for r in rows] == [ins(row(1)), ins(row(4))]
    assert not h.w.active


def test_both_leaves_other_slots_and_windows_without_low_alone(h: Harness) -> None:
    h.outcomes["other"] = []
    h.w.open("other", "shop", "orders", h.outcomes["other"].append, slot=1)
    h.marks(mark("other", LOW, slot=1))
    h.open("w1")  # slot 0, its low not seen yet
    h.open("w2")
    h.marks(mark("w2", BOTH))
    assert h.outcomes["other"] == [] and h.outcomes["w1"] == [] and h.outcomes["w2"] == []
    h.w.fill("other", chunk(7))
    h.marks(mark("other", HIGH, slot=1))
    assert h.outcome("other") == Outcome(emitted=1, scn=SCN)


def test_both_for_a_closed_window_still_closes_the_one_before(h: Harness) -> None:
    h.open("w1")
    h.marks(mark("w1", LOW))
    h.w.fill("w1", chunk(1))
    h.open("w2")
    h.w.close("w2")  # the snapshotter gave up the next read (e.g. the table was dropped)
    h.marks(mark("w2", BOTH))
    assert h.outcome("w1") == Outcome(emitted=1, scn=SCN)
    assert not h.w.active


# -- keyless chunks ------------------------------------------------------------------------------


REPLACE = Chunk(T, (), [], marks=("replace",))  # the window that begins a keyless table's consistent read


def page(*rows: dict[str, Any], marks: tuple[str, ...] = ()) -> Chunk:
    return Chunk(T, (), [ins(r) for r in rows], marks=marks, consistent=True)


@pytest.mark.parametrize("change", [upd(row(1, "a"), row(1, "c")), ins(row(3, "new")), dele(row(9, "never read"))])
def test_a_keyless_read_begun_while_its_table_changed_begins_again(h: Harness, change: dict[str, Any]) -> None:
    """Whether the read saw a change made between L and H is unknown: the `replace` has no place."""
    out = h.run(REPLACE, [change])
    assert out.retry and "no key" in out.retry
    assert h.emitted == []


def test_a_keyless_read_begun_in_a_quiet_window_emits_its_replace(h: Harness) -> None:
    assert h.run(REPLACE, [], before=[ins(row(1))]) == Outcome(emitted=0, scn=SCN)
    assert h.emitted == [(T, [])] and h.marked == [("replace",)]


@pytest.mark.parametrize("marks", [(), ("replaced",), ("abandoned",)])
def test_a_page_of_a_consistent_read_is_emitted_as_read_whatever_changed(h: Harness, marks: tuple[str, ...]) -> None:
    """The page is the table at the `replace`; changes since are in the binlog after it, and the
    lake's multiset fold adds them up in any order."""
    c = page({"id": 1, "tags": ["a", "b"]}, row(1, "a"), row(1, "a"), marks=marks)
    out = h.run(c, [upd(row(1, "a"), row(1, "c")), dele(row(1, "a")), ins(row(5))])
    assert out == Outcome(emitted=3, scn=SCN)
    assert h.emitted == [(T, c.rows)] and h.marked == [marks]


def test_the_end_of_a_consistent_read_is_a_replaced_alone(h: Harness) -> None:
    assert h.run(page(marks=("replaced",)), [ins(row(1))]) == Outcome(emitted=0, scn=SCN)
    assert h.emitted == [(T, [])] and h.marked == [("replaced",)]


def test_a_keyed_chunk_has_no_marks(h: Harness) -> None:
    h.run(chunk(1, 2), [])
    assert h.marked == [()]


@pytest.mark.parametrize("tables", [[("shop", "orders")], None])
def test_ddl_while_a_keyless_read_begins_is_a_retry_and_not_while_its_pages_go_out(
        h: Harness, tables: list[tuple[str, str]] | None) -> None:
    """A page is the table at its `replace` (the read holds the table's metadata lock): a statement
    between its watermarks (GRANT, ANALYZE: no table named) does not begin the read again."""
    for wid, c in (("w1", REPLACE), ("w2", page(row(1)))):
        h.open(wid)
        h.marks(mark(wid, LOW))
        h.w.on_ddl(tables, "GRANT SELECT ON shop.* TO someone" if tables is None else "ALTER TABLE orders COMMENT 'x'")
        h.w.fill(wid, c)
        h.marks(mark(wid, HIGH))
    assert h.outcome("w1").retry
    out = h.outcome("w2")
    assert (out.emitted, out.scn, out.retry) == (1, SCN, None)


def test_surviving_matches_keyless_rows_by_whole_image() -> None:
    c = Chunk(T, (), [ins(row(1, "a")), ins(row(1, "b")), ins({"id": 1, "tags": ["a"]})])
    assert surviving(c, [row(1, "a"), {"id": 1, "tags": ["a"]}]) == [ins(row(1, "b"))]


# -- outcomes and the active flag --------------------------------------------------------------


def test_emit_gets_the_schema_and_surviving_rows_and_outcome_carries_count_and_scn(h: Harness) -> None:
    out = h.run(chunk(1, 2, 3), [dele(row(2))])
    assert out == Outcome(emitted=2, scn=SCN, retry=None)
    assert h.emitted == [(T, [ins(row(1)), ins(row(3))])]


def test_emit_may_return_no_scn() -> None:
    w = Windows(SRC, WATERMARKS)
    got: list[Outcome] = []
    w.open("w1", "shop", "orders", got.append)
    w.on_watermark([mark("w1", LOW)], lambda s, r, x: None)
    w.fill("w1", chunk(1))
    w.on_watermark([mark("w1", HIGH)], lambda s, r, x: None)
    assert got == [Outcome(emitted=1, scn=None)]


@pytest.mark.parametrize("ids", [(), (1, 2)])
def test_nothing_surviving_emits_nothing(h: Harness, ids: tuple[int, ...]) -> None:
    out = h.run(chunk(*ids), [dele(row(1)), upd(row(2), row(3))])
    assert out == Outcome()
    assert (out.emitted, out.scn, out.retry) == (0, None, None)
    assert h.emitted == []


def test_active_flag_flips(h: Harness) -> None:
    assert not h.w.active
    h.open("a")
    assert h.w.active
    h.open("b")
    h.w.close("a")
    assert h.w.active
    h.w.close("a")  # closing twice is harmless
    assert h.w.active
    h.marks(mark("b", LOW), mark("b", HIGH))  # H closes the window itself
    assert not h.w.active
    assert h.outcome("b").retry is not None  # never filled
    h.w.close("b")
    assert not h.w.active
    h.open("c")
    h.w.close("c")
    assert not h.w.active


def test_is_watermark() -> None:
    w = Windows(SRC, WATERMARKS)
    assert w.is_watermark("binlake", "watermarks")
    assert not w.is_watermark("binlake", "other")
    assert not w.is_watermark("shop", "watermarks")


def test_a_statement_that_removes_rows_without_row_events_is_counted_for_each_table_it_names():
    w = Windows(SRC, WATERMARKS)
    w.on_ddl([("s", "Orders"), ("s", "old")], "ALTER TABLE orders EXCHANGE PARTITION p0 WITH TABLE old")
    w.on_ddl([("s", "orders")], "ALTER TABLE orders ADD PARTITION (PARTITION p9 VALUES LESS THAN (9))")
    w.on_ddl([("s", "orders")], "ALTER TABLE orders CONVERT TO CHARACTER SET latin1")  # upserts suffice
    w.on_ddl([("s", "orders")], "ALTER TABLE orders DROP PARTITION p1")
    assert (w.removal_mark("s", "orders"), w.removal_mark("S", "OLD"), w.removal_mark("s", "other")) == (2, 1, 0)

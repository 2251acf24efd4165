"""services.loader.frames: a batch of envelopes -> per table, runs of rows and DDL steps (pure, pyarrow only)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa

from services.loader.frames import BOOKKEEPING, PREV, Ddl, Rows, TableChanges, group

ID = {"name": "id", "type": "int", "nullable": False}
NAME = {"name": "name", "type": "varchar", "nullable": True, "charset": "utf8mb4", "length": 160}
X = {"name": "x", "type": "int", "nullable": True}
SCHEMA_A = {"id": "aaaaaaaaaaaaaaaa", "columns": [ID, NAME]}
SCHEMA_B = {"id": "bbbbbbbbbbbbbbbb", "columns": [ID, NAME, X]}
BOOK = [f.name for f in BOOKKEEPING]


def env(op: str, rows: list[dict[str, Any]], *, table: str = "t", db: str = "d", schema: dict[str, Any] | None = None,
        pk: list[str] | None = None, scn: int = 1 << 32 | 100, ts: int = 1_700_000_000_123,
        gtid: str | None = "0-1-5") -> dict[str, Any]:
    return {"v": 1, "source": "main", "db": db, "table": table, "op": op, "ts": ts,
            "pos": {"file": "mysql-bin.000001", "offset": scn & 0xFFFFFFFF, "gtid": gtid}, "scn": scn,
            "txn": {"id": "x", "index": 0, "last": True}, "pk": ["id"] if pk is None else pk, "rows": rows,
            "schema": schema or SCHEMA_A}


def ddl(sql: str, alter: dict[str, Any] | None = None, *, table: str | None = "t", db: str = "d") -> dict[str, Any]:
    out = {"v": 1, "source": "main", "db": db, "table": table, "op": "ddl", "ts": 1, "ddl": sql,
           "pos": {"file": "mysql-bin.000001", "offset": 4}, "scn": 1 << 32 | 4}
    if alter is not None:
        out["alter"] = alter
    return out


def ins(*ids: int, **kw: Any) -> dict[str, Any]:
    return env("i", [{"after": {"id": i, "name": f"n{i}"}} for i in ids], **kw)


def upd(before: dict[str, Any], after: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return env("u", [{"before": before, "after": after}], **kw)


def one(out: dict[tuple[str, str], TableChanges], db: str = "d", table: str = "t") -> TableChanges:
    return out[(db, table)]


def run_of(changes: TableChanges) -> Rows:
    """The only step of a table: one run of rows."""
    (step,) = changes.steps
    assert isinstance(step, Rows)
    return step


def rows_of(run: Rows) -> list[dict[str, Any]]:
    return [r for t in run.arrow_segments() for r in t.to_pylist()]


def kinds(changes: TableChanges) -> list[str]:
    return ["rows" if isinstance(s, Rows) else "ddl" for s in changes.steps]


# -- grouping ---------------------------------------------------------------------------------


def test_events_are_grouped_per_table_in_order():
    out = group([(10, ins(1, 2)), (11, ins(7, table="u")), (12, ins(3)), (13, ins(8, db="e", table="u"))])
    assert set(out) == {("d", "t"), ("d", "u"), ("e", "u")}
    t = one(out)
    assert (t.db, t.table, t.rows) == ("d", "t", 3)
    run = run_of(t)
    assert (run.pk, run.rows, run.last_seq) == (["id"], 3, 12)
    got = [(r["_binlake_seq"], r["_binlake_row"], r["id"]) for r in rows_of(run)]
    assert got == [(10, 0, 1), (10, 1, 2), (12, 0, 3)]
    assert one(out, "d", "u").rows == 1 and one(out, "e", "u").rows == 1


def test_heartbeats_and_table_less_events_are_skipped():
    hb = {"v": 1, "op": "hb", "db": None, "table": None, "ts": 1, "scn": 5}
    create_db = ddl("CREATE DATABASE x", {"kind": "other", "ops": [], "renames": []}, table=None)
    assert group([(1, hb), (2, create_db)]) == {}
    t = one(group([(1, hb), (2, ins(1)), (3, hb), (4, create_db), (5, ins(2))]))
    assert kinds(t) == ["rows"]  # neither splits the run
    assert [r["id"] for r in rows_of(run_of(t))] == [1, 2]


def test_unknown_ops_are_skipped():
    assert group([(1, {**ins(1), "op": "commit"})]) == {}


def test_snapshot_reads_are_rows_like_inserts():
    t = one(group([(4, env("r", [{"after": {"id": 1, "name": "a"}}]))]))
    got = [(r["_binlake_op"], r["id"], r["name"], r[PREV + "id"]) for r in rows_of(run_of(t))]
    assert got == [("r", 1, "a", None)]


def test_an_empty_batch_has_no_tables():
    assert group([]) == {}


# -- bookkeeping ------------------------------------------------------------------------------


def test_bookkeeping_columns_come_first_with_their_types():
    t = one(group([(42, ins(5, 6, scn=3 << 32 | 777, ts=1_700_000_000_123, gtid="0-1-99"))]))
    (table,) = run_of(t).arrow_segments()
    assert BOOK == ["_binlake_op", "_binlake_seq", "_binlake_row", "_binlake_scn", "_binlake_ts", "_binlake_pos",
                    "_binlake_gtid", "_binlake_ddl"]
    assert table.schema.names == [*BOOK, "id", "name", PREV + "id"]
    for f in BOOKKEEPING:
        assert table.schema.field(f.name).type == f.type
    first = table.to_pylist()[0]
    assert first["_binlake_op"] == "i" and first["_binlake_seq"] == 42 and first["_binlake_row"] == 0
    assert first["_binlake_scn"] == 3 << 32 | 777
    assert first["_binlake_ts"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC)
    assert first["_binlake_pos"] == "mysql-bin.000001:777"
    assert first["_binlake_gtid"] == "0-1-99"
    assert first["_binlake_ddl"] is None  # a row change, not a DDL row
    assert [r["_binlake_row"] for r in table.to_pylist()] == [0, 1]


def test_gtid_may_be_missing():
    t = one(group([(1, ins(1, gtid=None))]))
    assert rows_of(run_of(t))[0]["_binlake_gtid"] is None


def test_data_and_before_image_columns_have_the_columns_arrow_types():
    schema = {"id": "tttttttttttttttt", "columns": [
        {"name": "k", "type": "bigint", "unsigned": True}, {"name": "d", "type": "datetime", "fsp": 6},
        {"name": "s", "type": "set", "values": ["a", "b"]}, {"name": "b", "type": "varbinary"}]}
    before = {"k": 1, "d": "2020-01-02T03:04:05.000001", "s": ["a"], "b": b"\x00"}
    after = {"k": 2**64 - 1, "d": "2020-01-02T03:04:05.000002", "s": [], "b": b""}
    for pk in (["k"], []):
        (table,) = run_of(one(group([(1, upd(before, after, schema=schema, pk=pk))]))).arrow_segments()
        expected = {"k": pa.decimal128(20, 0), "d": pa.timestamp("us"), "s": pa.list_(pa.string()), "b": pa.binary()}
        for name, kind in expected.items():
            assert table.schema.field(name).type == kind
        for name in pk or expected:
            assert table.schema.field(PREV + name).type == expected[name]


def test_missing_columns_in_an_image_are_null():
    t = one(group([(1, env("i", [{"after": {"id": 1}}]))]))
    assert rows_of(run_of(t))[0]["name"] is None


# -- images: tables with a key -------------------------------------------------------------------


def test_deletes_use_the_before_image():
    t = one(group([(3, env("d", [{"before": {"id": 9, "name": "gone"}}]))]))
    (row,) = rows_of(run_of(t))
    assert (row["_binlake_op"], row["id"], row["name"], row[PREV + "id"]) == ("d", 9, "gone", None)


def test_a_keyed_table_keeps_the_before_image_of_its_key_columns_only():
    t = one(group([(3, upd({"id": 9, "name": "old"}, {"id": 9, "name": "new"}))]))
    (table,) = run_of(t).arrow_segments()
    assert [n for n in table.schema.names if n.startswith(PREV)] == [PREV + "id"]


def test_an_update_that_keeps_its_key_leaves_the_before_image_null():
    t = one(group([(3, upd({"id": 9, "name": "old"}, {"id": 9, "name": "new"}))]))
    (row,) = rows_of(run_of(t))
    assert (row["_binlake_op"], row["id"], row["name"], row[PREV + "id"]) == ("u", 9, "new", None)


def test_a_key_changing_update_carries_the_old_key():
    rows = [{"before": {"id": 1, "name": "a"}, "after": {"id": 1001, "name": "a"}},
            {"before": {"id": 2, "name": "b"}, "after": {"id": 2, "name": "c"}},
            {"before": {"id": 3, "name": "b"}, "after": {"id": 1003, "name": "z"}}]
    t = one(group([(8, env("u", rows))]))
    got = [(r["_binlake_row"], r["id"], r["name"], r[PREV + "id"]) for r in rows_of(run_of(t))]
    assert got == [(0, 1001, "a", 1), (1, 2, "c", None), (2, 1003, "z", 3)]


def test_a_composite_key_change_carries_every_key_column():
    schema = {"id": "cccccccccccccccc", "columns": [{"name": "a", "type": "int"}, {"name": "b", "type": "varchar"},
                                                    {"name": "v", "type": "int"}]}
    rows = [{"before": {"a": 1, "b": "x", "v": 0}, "after": {"a": 1, "b": "y", "v": 0}},
            {"before": {"a": 2, "b": "x", "v": 0}, "after": {"a": 2, "b": "x", "v": 1}}]
    t = one(group([(8, env("u", rows, schema=schema, pk=["a", "b"]))]))
    (table,) = run_of(t).arrow_segments()
    assert table.schema.names[len(BOOK):] == ["a", "b", "v", PREV + "a", PREV + "b"]
    got = [(r["a"], r["b"], r[PREV + "a"], r[PREV + "b"]) for r in table.to_pylist()]
    assert got == [(1, "y", 1, "x"), (2, "x", None, None)]


# -- images: tables without a key ---------------------------------------------------------------


def test_a_keyless_table_keeps_the_whole_before_image_of_every_update():
    events = [(1, env("i", [{"after": {"id": 1, "name": "a"}}], pk=[])),
              (2, env("u", [{"before": {"id": 1, "name": "a"}, "after": {"id": 1, "name": "b"}},  # key-like column kept
                            {"before": {"id": 1, "name": "b"}, "after": {"id": 2, "name": "b"}},
                            {"before": {"id": 2, "name": None}, "after": {"id": 2, "name": None}}], pk=[])),
              (3, env("d", [{"before": {"id": 2, "name": "b"}}], pk=[]))]
    run = run_of(one(group(events)))
    assert run.pk == []
    (table,) = run.arrow_segments()
    assert table.schema.names[len(BOOK):] == ["id", "name", PREV + "id", PREV + "name"]
    got = [(r["_binlake_op"], r["id"], r["name"], r[PREV + "id"], r[PREV + "name"]) for r in table.to_pylist()]
    assert got == [("i", 1, "a", None, None),
                   ("u", 1, "b", 1, "a"),
                   ("u", 2, "b", 1, "b"),
                   ("u", 2, None, 2, None),
                   ("d", 2, "b", None, None)]


# -- segments ---------------------------------------------------------------------------------


def test_a_new_schema_version_starts_a_new_segment():
    events = [(1, ins(1)), (2, ins(2)),
              (4, env("i", [{"after": {"id": 3, "name": "n3", "x": 7}}], schema=SCHEMA_B)),
              (5, upd({"id": 1, "name": "n1", "x": None}, {"id": 1, "name": "n1", "x": 8}, schema=SCHEMA_B))]
    run = run_of(one(group(events)))
    assert [seg.columns for _, seg in run.segments] == [SCHEMA_A["columns"], SCHEMA_B["columns"]]
    assert run.columns == SCHEMA_B["columns"]  # the newest schema
    a, b = run.arrow_segments()
    assert "x" not in a.schema.names and a.num_rows == 2
    assert b.schema.field("x").type == pa.int32() and b.column("x").to_pylist() == [7, 8]
    assert run.rows == 4 and run.last_seq == 5


def test_going_back_to_an_earlier_schema_starts_another_segment():
    run = run_of(one(group([(1, ins(1)), (2, ins(2, schema=SCHEMA_B)), (3, ins(3)), (4, ins(4))])))
    assert [len(seg.columns) for _, seg in run.segments] == [2, 3, 2]
    assert [s.num_rows for s in run.arrow_segments()] == [1, 1, 2]


def test_same_schema_events_share_one_segment():
    run = run_of(one(group([(i, ins(i)) for i in range(1, 6)])))
    assert len(run.segments) == 1 and run.rows == 5


def test_a_primary_key_change_within_one_batch_keeps_each_segments_own_before_image():
    """DROP PRIMARY KEY, ADD PRIMARY KEY (name) between two events: same columns, another key."""
    events = [(1, upd({"id": 1, "name": "a"}, {"id": 2, "name": "a"})),
              (2, upd({"id": 2, "name": "a"}, {"id": 2, "name": "b"}, pk=["name"])),
              (3, upd({"id": 2, "name": "b"}, {"id": 3, "name": "b"}, pk=["name"])),
              (4, upd({"id": 3, "name": "b"}, {"id": 4, "name": "c"}, pk=[]))]
    run = run_of(one(group(events)))
    assert run.pk == []  # the newest key
    by_id, by_name, keyless = run.arrow_segments()
    prev = [[n for n in t.schema.names if n.startswith(PREV)] for t in (by_id, by_name, keyless)]
    assert prev == [[PREV + "id"], [PREV + "name"], [PREV + "id", PREV + "name"]]
    assert by_id.column(PREV + "id").to_pylist() == [1]
    assert by_name.column(PREV + "name").to_pylist() == ["a", None]  # the second update kept its key
    assert keyless.to_pylist()[0][PREV + "id"] == 3 and keyless.to_pylist()[0][PREV + "name"] == "b"


# -- DDL --------------------------------------------------------------------------------------


def test_ddl_splits_the_runs_and_keeps_its_place():
    add_x = {"kind": "alter", "ops": [{"op": "add", "column": X}], "columns": None, "pk": None, "renames": []}
    events = [(1, ins(1)), (2, ins(2)),
              (3, ddl("ALTER TABLE t ADD COLUMN x INT", add_x)),
              (4, env("i", [{"after": {"id": 3, "name": "n3", "x": 7}}], schema=SCHEMA_B)),
              (5, ins(9, table="u")),
              (6, ddl("TRUNCATE t", {"kind": "truncate", "ops": [], "renames": []})),
              (7, ddl("DROP TABLE t", {"kind": "drop", "ops": [], "renames": []})),
              (8, ins(4, schema=SCHEMA_B))]
    t = one(group(events))
    assert kinds(t) == ["rows", "ddl", "rows", "ddl", "ddl", "rows"]
    assert t.rows == 4
    first, alter, second, truncate, drop, third = t.steps
    assert isinstance(first, Rows) and isinstance(second, Rows) and isinstance(third, Rows)
    assert [r["id"] for r in rows_of(first)] == [1, 2] and first.last_seq == 2
    assert [(r["id"], r["x"]) for r in rows_of(second)] == [(3, 7)]
    assert [r["id"] for r in rows_of(third)] == [4]
    assert isinstance(alter, Ddl) and isinstance(truncate, Ddl) and isinstance(drop, Ddl)
    assert (alter.seq, alter.sql, alter.alter) == (3, "ALTER TABLE t ADD COLUMN x INT", add_x)
    assert (truncate.seq, truncate.alter["kind"]) == (6, "truncate")
    assert (drop.seq, drop.sql, drop.alter["kind"]) == (7, "DROP TABLE t", "drop")
    assert kinds(one(group(events), "d", "u")) == ["rows"]  # another table's DDL does not split it


def test_a_batch_may_start_or_be_only_ddl():
    t = one(group([(1, ddl("CREATE TABLE t (id INT)", {"kind": "create", "ops": [], "renames": [],
                                                        "columns": [ID], "pk": []})),
                   (2, ins(1))]))
    assert kinds(t) == ["ddl", "rows"]
    only = one(group([(1, ddl("DROP INDEX i ON t", {"kind": "index", "ops": [], "renames": []}))]))
    assert kinds(only) == ["ddl"] and only.rows == 0


def test_a_ddl_without_an_alter_description_is_other():
    (step,) = one(group([(1, ddl("OPTIMIZE TABLE t"))])).steps
    assert isinstance(step, Ddl)
    assert step.alter == {"kind": "other", "ops": [], "renames": []}
    assert Ddl(2, {"op": "ddl"}).sql == ""

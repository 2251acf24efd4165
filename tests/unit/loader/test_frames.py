"""services.loader.frames: a batch of envelopes -> per-table changelog segments (pure, pyarrow only)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from services.loader import frames
from services.loader.frames import BOOKKEEPING, PREV_KEY, column_renames, group

ID = {"name": "id", "type": "int", "nullable": False}
NAME = {"name": "name", "type": "varchar", "nullable": True, "charset": "utf8mb4", "length": 160}
X = {"name": "x", "type": "int", "nullable": True}
SCHEMA_A = {"id": "aaaaaaaaaaaaaaaa", "columns": [ID, NAME]}
SCHEMA_B = {"id": "bbbbbbbbbbbbbbbb", "columns": [ID, NAME, X]}


def env(op: str, rows: list[dict[str, Any]], *, table: str = "t", db: str = "d", schema: dict[str, Any] | None = None,
        pk: list[str] | None = None, scn: int = 1 << 32 | 100, ts: int = 1_700_000_000_123,
        gtid: str | None = "0-1-5") -> dict[str, Any]:
    return {"v": 1, "source": "main", "db": db, "table": table, "op": op, "ts": ts,
            "pos": {"file": "mysql-bin.000001", "offset": scn & 0xFFFFFFFF, "gtid": gtid}, "scn": scn,
            "txn": {"id": "x", "index": 0, "last": True}, "pk": ["id"] if pk is None else pk, "rows": rows,
            "schema": schema or SCHEMA_A}


def ddl(sql: str, *, table: str = "t", db: str = "d") -> dict[str, Any]:
    return {"v": 1, "source": "main", "db": db, "table": table, "op": "ddl", "ts": 1, "ddl": sql,
            "pos": {"file": "mysql-bin.000001", "offset": 4}, "scn": 1 << 32 | 4}


def ins(*ids: int, **kw: Any) -> dict[str, Any]:
    return env("i", [{"after": {"id": i, "name": f"n{i}"}} for i in ids], **kw)


def one(out: dict[tuple[str, str], frames.TableChanges], db: str = "d", table: str = "t") -> frames.TableChanges:
    return out[(db, table)]


def rows_of(changes: frames.TableChanges) -> list[dict[str, Any]]:
    return [r for t in changes.arrow_segments() for r in t.to_pylist()]


# -- grouping ---------------------------------------------------------------------------------


def test_events_are_grouped_per_table_in_order():
    out = group([(10, ins(1, 2)), (11, ins(7, table="u")), (12, ins(3)), (13, ins(8, db="e", table="u"))])
    assert set(out) == {("d", "t"), ("d", "u"), ("e", "u")}
    t = one(out)
    assert (t.db, t.table, t.pk, t.rows) == ("d", "t", ["id"], 3)
    assert [(r["_seq"], r["_row"], r["id"]) for r in rows_of(t)] == [(10, 0, 1), (10, 1, 2), (12, 0, 3)]
    assert one(out, "d", "u").rows == 1 and one(out, "e", "u").rows == 1


def test_heartbeats_and_table_less_events_are_skipped():
    hb = {"v": 1, "op": "hb", "db": None, "table": None, "ts": 1, "scn": 5}
    create_db = {**ddl("CREATE DATABASE x"), "table": None}
    assert group([(1, hb), (2, create_db)]) == {}
    assert one(group([(1, hb), (2, ins(1)), (3, hb)])).rows == 1


def test_snapshot_reads_are_rows_like_inserts():
    t = one(group([(4, env("r", [{"after": {"id": 1, "name": "a"}}]))]))
    assert [(r["_op"], r["id"], r["name"]) for r in rows_of(t)] == [("r", 1, "a")]


def test_an_empty_batch_has_no_tables():
    assert group([]) == {}


# -- bookkeeping ------------------------------------------------------------------------------


def test_bookkeeping_columns_come_first_with_their_types():
    t = one(group([(42, ins(5, 6, scn=3 << 32 | 777, ts=1_700_000_000_123, gtid="0-1-99"))]))
    (table,) = t.arrow_segments()
    assert table.schema.names == [f.name for f in BOOKKEEPING] + ["id", "name", PREV_KEY + "id"]
    for f in BOOKKEEPING:
        assert table.schema.field(f.name).type == f.type
    assert table.schema.field("id").type == pa.int32()
    assert table.schema.field(PREV_KEY + "id").type == pa.int32()
    first = table.to_pylist()[0]
    assert first["_op"] == "i" and first["_seq"] == 42 and first["_row"] == 0
    assert first["_scn"] == 3 << 32 | 777
    assert first["_ts"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC)
    assert first["_pos"] == "mysql-bin.000001:777"
    assert first["_gtid"] == "0-1-99"
    assert [r["_row"] for r in table.to_pylist()] == [0, 1]


def test_gtid_may_be_missing():
    t = one(group([(1, ins(1, gtid=None))]))
    assert rows_of(t)[0]["_gtid"] is None


# -- images -----------------------------------------------------------------------------------


def test_deletes_use_the_before_image():
    t = one(group([(3, env("d", [{"before": {"id": 9, "name": "gone"}}]))]))
    (row,) = rows_of(t)
    assert (row["_op"], row["id"], row["name"], row[PREV_KEY + "id"]) == ("d", 9, "gone", None)


def test_updates_use_the_after_image_and_leave_prev_key_null_when_the_key_stays():
    t = one(group([(3, env("u", [{"before": {"id": 9, "name": "old"}, "after": {"id": 9, "name": "new"}}]))]))
    (row,) = rows_of(t)
    assert (row["_op"], row["id"], row["name"], row[PREV_KEY + "id"]) == ("u", 9, "new", None)


def test_a_key_changing_update_carries_the_old_key():
    rows = [{"before": {"id": 1, "name": "a"}, "after": {"id": 1001, "name": "a"}},
            {"before": {"id": 2, "name": "b"}, "after": {"id": 2, "name": "c"}},
            {"before": {"id": 3, "name": "b"}, "after": {"id": 1003, "name": "z"}}]
    t = one(group([(8, env("u", rows))]))
    got = [(r["_row"], r["id"], r["name"], r[PREV_KEY + "id"]) for r in rows_of(t)]
    assert got == [(0, 1001, "a", 1), (1, 2, "c", None), (2, 1003, "z", 3)]


def test_a_composite_key_change_carries_every_key_column():
    schema = {"id": "cccccccccccccccc", "columns": [{"name": "a", "type": "int"}, {"name": "b", "type": "varchar"},
                                                    {"name": "v", "type": "int"}]}
    rows = [{"before": {"a": 1, "b": "x", "v": 0}, "after": {"a": 1, "b": "y", "v": 0}},
            {"before": {"a": 2, "b": "x", "v": 0}, "after": {"a": 2, "b": "x", "v": 1}}]
    t = one(group([(8, env("u", rows, schema=schema, pk=["a", "b"]))]))
    got = [(r["a"], r["b"], r[PREV_KEY + "a"], r[PREV_KEY + "b"]) for r in rows_of(t)]
    assert got == [(1, "y", 1, "x"), (2, "x", None, None)]


def test_a_keyless_table_has_no_prev_key_columns():
    rows = [{"before": {"id": 1, "name": "a"}, "after": {"id": 2, "name": "a"}}]
    t = one(group([(8, env("u", rows, pk=[]))]))
    (table,) = t.arrow_segments()
    assert t.pk == []
    assert not [n for n in table.schema.names if n.startswith(PREV_KEY)]


def test_missing_columns_in_an_image_are_null():
    t = one(group([(1, env("i", [{"after": {"id": 1}}]))]))
    assert rows_of(t)[0]["name"] is None


# -- segments ---------------------------------------------------------------------------------


def test_a_schema_change_starts_a_new_segment():
    events = [(1, ins(1)), (2, ins(2)),
              (3, ddl("ALTER TABLE t ADD COLUMN x INT")),
              (4, env("i", [{"after": {"id": 3, "name": "n3", "x": 7}}], schema=SCHEMA_B)),
              (5, env("u", [{"before": {"id": 1, "name": "n1", "x": None},
                             "after": {"id": 1, "name": "n1", "x": 8}}], schema=SCHEMA_B))]
    t = one(group(events))
    assert [sid for sid, _ in t.segments] == [SCHEMA_A["id"], SCHEMA_B["id"]]
    assert t.columns == SCHEMA_B["columns"]  # the newest schema
    a, b = t.arrow_segments()
    assert "x" not in a.schema.names and a.num_rows == 2
    assert b.schema.field("x").type == pa.int32() and b.column("x").to_pylist() == [7, 8]
    assert t.ddl == [(3, "ALTER TABLE t ADD COLUMN x INT")]
    assert t.reset_seq == 0 and t.renames == []
    assert t.rows == 4


def test_going_back_to_an_earlier_schema_starts_another_segment():
    t = one(group([(1, ins(1)), (2, ins(2, schema=SCHEMA_B)), (3, ins(3)), (4, ins(4))]))
    assert [sid for sid, _ in t.segments] == [SCHEMA_A["id"], SCHEMA_B["id"], SCHEMA_A["id"]]
    assert [s.num_rows for s in t.arrow_segments()] == [1, 1, 2]


def test_same_schema_events_share_one_segment():
    t = one(group([(i, ins(i)) for i in range(1, 6)]))
    assert len(t.segments) == 1 and t.rows == 5


def test_a_primary_key_change_between_segments_keeps_each_segments_own_key():
    """ALTER TABLE ... DROP PRIMARY KEY, ADD PRIMARY KEY (name) inside one batch."""
    by_name = {"id": "dddddddddddddddd", "columns": [ID, NAME]}
    events = [(1, env("u", [{"before": {"id": 1, "name": "a"}, "after": {"id": 2, "name": "a"}}])),
              (2, env("u", [{"before": {"id": 2, "name": "a"}, "after": {"id": 2, "name": "b"}}],
                      schema=by_name, pk=["name"]))]
    t = one(group(events))
    a, b = t.arrow_segments()
    assert a.column(PREV_KEY + "id").to_pylist() == [1]
    assert b.column(PREV_KEY + "name").to_pylist() == ["a"]


# -- DDL --------------------------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "DROP TABLE `t` /* generated by server */",
    "drop table if exists t",
    "DROP TEMPORARY TABLE t",
    "  TRUNCATE TABLE `d`.`t`",
    "truncate t",
])
def test_drop_and_truncate_reset_the_table(sql):
    t = one(group([(1, ins(1)), (2, ins(2)), (3, ddl(sql)), (4, ins(3))]))
    assert t.reset_seq == 3
    assert t.rows == 3  # the changelog keeps every change; the snapshot filters by reset_seq


@pytest.mark.parametrize("sql", [
    "ALTER TABLE t ADD COLUMN x INT", "CREATE TABLE t (id INT PRIMARY KEY)", "DROP INDEX i ON t",
    "ALTER TABLE t DROP COLUMN name", "RENAME TABLE t TO t2",
])
def test_other_ddl_does_not_reset(sql):
    t = one(group([(1, ddl(sql))]))
    assert t.reset_seq == 0 and t.ddl == [(1, sql)] and t.rows == 0 and t.segments == []


def test_the_last_reset_of_a_batch_wins():
    t = one(group([(1, ddl("TRUNCATE t")), (2, ins(1)), (3, ddl("DROP TABLE t")), (4, ins(2))]))
    assert t.reset_seq == 3


def test_renames_in_ddl_are_collected_in_order():
    t = one(group([(1, ddl("ALTER TABLE t RENAME COLUMN a TO b")), (2, ins(1)),
                   (3, ddl("ALTER TABLE t CHANGE COLUMN b c INT"))]))
    assert t.renames == [("a", "b"), ("b", "c")]


@pytest.mark.parametrize(("sql", "expected"), [
    ("ALTER TABLE t RENAME COLUMN a TO b", [("a", "b")]),
    ("alter table t rename column `a` to `b b`", [("a", "b b")]),
    ("ALTER TABLE t RENAME COLUMN `we``ird` TO `x`", [("we`ird", "x")]),
    ("ALTER TABLE t CHANGE COLUMN a b INT", [("a", "b")]),
    ("ALTER TABLE t CHANGE a b VARCHAR(10) NOT NULL", [("a", "b")]),
    ("ALTER TABLE t CHANGE COLUMN IF EXISTS `a` `b` INT", [("a", "b")]),
    ("ALTER TABLE t CHANGE column_a column_b INT", [("column_a", "column_b")]),
    ("ALTER TABLE t CHANGE a a BIGINT", []),  # only the type changes
    ("ALTER TABLE t RENAME COLUMN a TO b, RENAME COLUMN c TO d", [("a", "b"), ("c", "d")]),
    ("ALTER TABLE t RENAME COLUMN a TO b, CHANGE c d INT", [("a", "b"), ("c", "d")]),
    ("ALTER TABLE t MODIFY a BIGINT", []),
    ("ALTER TABLE t ADD COLUMN x INT", []),
    ("ALTER TABLE t RENAME TO u", []),
])
def test_column_renames(sql, expected):
    assert column_renames(sql) == expected

"""Assembler: binlog events -> envelopes with exact txn.last, resume positions, chunks and skips."""

from __future__ import annotations

from typing import Any

import pytest

from services.parser import values as v
from services.parser.columns import Column, TableSchema
from services.parser.transactions import (
    HEADER_ALLOWANCE,
    Assembler,
    Outgoing,
    Resume,
    SkipMark,
    gtid_state_str,
    parse_gtid_state,
)
from shared import envelope, objects
from shared.errors import DecodeError, SourceMisconfigured
from shared.gtid import GtidSet
from shared.subjects import Names

F = "mysql-bin.000003"
TS = 1_700_000_000_000
T = TableSchema(
    db="shop",
    table="orders",
    columns=(
        Column("id", "int", False, v.ColumnType(v.LONG)),
        Column("note", "varchar", True, v.ColumnType(v.VARCHAR, length=400, encoding="utf-8"), "utf8mb4"),
    ),
    pk=("id",),
)


def asm(**kw: Any) -> Assembler:
    kw.setdefault("start", Resume(F, 4, "0-1-5"))
    return Assembler("src", Names(), **kw)


def rows(*ids: int, note: str = "x") -> list[dict[str, Any]]:
    return [{"after": {"id": i, "note": note}} for i in ids]


def env(msg: Outgoing) -> dict[str, Any]:
    return envelope.as_dict(envelope.decode(msg.data))


def mariadb_txn(a: Assembler, gtid: str, start: int, events: int, domain: int = 0) -> list[Outgoing]:
    """GTID, BEGIN, `events` insert rows events 100 bytes apart, XID."""
    out = a.gtid(gtid, domain, False, F, start)
    out += a.query("BEGIN", "shop", F, start + 40, start + 80, TS)
    for k in range(events):
        out += a.rows("i", T, rows(k), F, start + 100 * (k + 1), TS + k)
    return out + a.commit(F, start + 100 * (events + 1))


def test_one_message_per_rows_event_and_last_only_at_commit():
    a = asm()
    assert a.gtid("0-1-6", 0, False, F, 100) == []
    assert a.query("BEGIN", "shop", F, 140, 180, TS) == []
    assert a.in_transaction
    assert a.rows("i", T, rows(1, 2), F, 200, TS) == []  # held back until we know it is not the last
    first = a.rows("u", T, [{"before": {"id": 1, "note": "x"}, "after": {"id": 1, "note": "y"}}], F, 300, TS)
    second = a.rows("d", T, [{"before": {"id": 2, "note": "x"}}], F, 400, TS)
    last = a.commit(F, 500)
    msgs = first + second + last
    assert [m.op for m in msgs] == ["i", "u", "d"]
    assert [m.last for m in msgs] == [False, False, True]
    assert [m.rows for m in msgs] == [2, 1, 1]
    txn_start = Resume(F, 100, "0-1-5")
    after_commit = Resume(F, 500, "0-1-6")
    assert [m.resume for m in msgs] == [txn_start, txn_start, after_commit]
    assert a.boundary == after_commit and not a.in_transaction
    envs = [env(m) for m in msgs]
    assert [e["txn"] for e in envs] == [
        {"id": "0-1-6", "i": 0, "last": False},
        {"id": "0-1-6", "i": 1, "last": False},
        {"id": "0-1-6", "i": 2, "last": True},
    ]
    assert [e["resume"] for e in envs] == [txn_start.to_dict(), txn_start.to_dict(), after_commit.to_dict()]
    for m, e, offset in zip(msgs, envs, (200, 300, 400), strict=True):
        scn = envelope.scn(F, offset)
        assert e["scn"] == scn == (3 << 32) | offset
        assert m.msg_id == f"src:{scn}" == m.headers["Nats-Msg-Id"]
        assert m.subject == "binlake.raw.src.shop.orders"
        assert e["pos"] == {"file": F, "offset": offset, "gtid": "0-1-6"}
        assert (e["source"], e["db"], e["table"], e["pk"], e["chunk"]) == ("src", "shop", "orders", ["id"], 0)
        assert e["schema"] == T.described
        assert m.headers["Binlake-Table"] == "shop.orders"
        assert m.headers["Binlake-Pos"] == f"{F}:{offset} 0-1-6"
    assert envs[0]["rows"] == rows(1, 2)


def test_gtid_state_tracks_every_domain():
    a = asm(start=Resume(F, 4, "0-1-5,1-1-3"))
    out = mariadb_txn(a, "1-1-4", 100, 1, domain=1)
    assert out[-1].resume == Resume(F, 300, "0-1-5,1-1-4")
    out = mariadb_txn(a, "2-1-1", 400, 1, domain=2)
    assert out[-1].resume == Resume(F, 600, "0-1-5,1-1-4,2-1-1")
    assert parse_gtid_state("1-1-4, 0-1-5") == {0: "0-1-5", 1: "1-1-4"}
    assert gtid_state_str({2: "2-1-1", 0: "0-1-5"}) == "0-1-5,2-1-1"


def test_mysql_transaction_resumes_by_file_offset():
    a = asm(start=Resume(F, 4), mariadb=False)
    a.gtid("3e11fa47-71ca-11e1-9e33-c80aa9429562:23", None, False, F, 100)
    a.query("BEGIN", "shop", F, 150, 200, TS)
    a.rows("i", T, rows(1), F, 200, TS)
    (msg,) = a.commit(F, 300)
    assert msg.last and msg.resume == Resume(F, 300, None)
    assert env(msg)["txn"]["id"] == "3e11fa47-71ca-11e1-9e33-c80aa9429562:23"


def test_anonymous_transaction_id_is_its_position():
    a = asm(start=Resume(F, 4), mariadb=False)
    a.anonymous_start(F, 100)
    a.query("BEGIN", "shop", F, 150, 200, TS)
    a.rows("i", T, rows(1), F, 200, TS)
    (msg,) = a.query("COMMIT", "shop", F, 300, 330, TS)
    assert env(msg)["txn"] == {"id": f"{F}:100", "i": 0, "last": True}
    assert msg.resume == Resume(F, 330, None)


def test_transaction_without_commit_ends_at_next_gtid():
    a = asm()
    a.gtid("0-1-6", 0, False, F, 100)
    a.rows("i", T, rows(1), F, 200, TS)
    (msg,) = a.gtid("0-1-7", 0, False, F, 300)
    assert msg.last and msg.resume == Resume(F, 300, "0-1-6")


def test_rows_outside_transaction_is_decode_error():
    with pytest.raises(DecodeError, match="outside a transaction"):
        asm().rows("i", T, rows(1), F, 200, TS)


# -- skip after restart ---------------------------------------------------------------------------


def test_skip_mark_drops_batches_already_published_of_that_txn_only():
    a = asm(skip=SkipMark("0-1-6", 1))
    other = mariadb_txn(a, "0-1-9", 100, 2)  # not the named transaction: nothing dropped
    assert [env(m)["txn"]["i"] for m in other] == [0, 1]
    replay = mariadb_txn(a, "0-1-6", 1000, 3)
    assert [env(m)["txn"]["i"] for m in replay] == [2]
    assert replay[0].last and replay[0].msg_id == f"src:{envelope.scn(F, 1300)}"
    assert a.skip is None
    again = mariadb_txn(a, "0-1-6", 2000, 3)  # the mark applied once
    assert [env(m)["txn"]["i"] for m in again] == [0, 1, 2]


def test_skip_mark_can_drop_every_batch_but_the_commit_still_moves_the_boundary():
    a = asm(skip=SkipMark("0-1-6", 2))
    assert mariadb_txn(a, "0-1-6", 100, 3) == []
    assert a.boundary == Resume(F, 500, "0-1-6")


# -- DDL ------------------------------------------------------------------------------------------


def test_standalone_ddl_is_published_on_its_table_subject():
    a = asm()
    assert a.gtid("0-1-6", 0, True, F, 100) == []
    sql = "ALTER TABLE orders ADD COLUMN c INT"
    (msg,) = a.query(sql, "shop", F, 140, 260, TS)
    e = env(msg)
    assert msg.subject == "binlake.raw.src.shop.orders"
    assert (msg.op, e["op"], e["ddl"], e["db"], e["table"]) == ("ddl", "ddl", sql, "shop", "orders")
    assert "schema" not in e and "rows" not in e
    assert msg.last and e["txn"] == {"id": "0-1-6", "i": 0, "last": True}
    assert msg.resume == a.boundary == Resume(F, 260, "0-1-6")
    assert msg.msg_id == f"src:{envelope.scn(F, 140)}"
    assert msg.headers["Binlake-Op"] == "ddl" and msg.headers["Binlake-Rows"] == "0"
    assert e["alter"] == {"kind": "alter", "columns": None, "pk": None, "renames": [],
                          "ops": [{"op": "add", "column": {"name": "c", "type": "int", "nullable": True},
                                   "default": None}]}


def test_ddl_on_mysql_without_standalone_flag_ends_its_transaction():
    a = asm(start=Resume(F, 4), mariadb=False)
    a.gtid("uuid:1", None, False, F, 100)
    (msg,) = a.query("CREATE TABLE t (a INT)", "shop", F, 140, 260, TS)
    assert msg.last and msg.subject == "binlake.raw.src.shop.t" and not a.in_transaction


@pytest.mark.parametrize(
    ("sql", "tables"),
    [
        ("DROP TABLE `a`,`b` /* generated by server */", [("shop", "a"), ("shop", "b")]),
        ("RENAME TABLE a TO b, other.c TO d", [("shop", "a"), ("shop", "b"), ("other", "c"), ("shop", "d")]),
    ],
)
def test_multi_table_ddl_gives_one_message_per_table(sql, tables):
    a = asm()
    a.gtid("0-1-6", 0, True, F, 100)
    msgs = a.query(sql, "shop", F, 140, 260, TS)
    envs = [env(m) for m in msgs]
    assert [(e["db"], e["table"]) for e in envs] == tables
    assert [m.subject for m in msgs] == [f"binlake.raw.src.{d}.{t}" for d, t in tables]
    assert [e["chunk"] for e in envs] == list(range(len(tables)))
    assert len({m.msg_id for m in msgs}) == len(tables)
    scn = envelope.scn(F, 140)
    assert [m.msg_id for m in msgs] == [f"src:{scn}"] + [f"src:{scn}:{k}" for k in range(1, len(tables))]
    assert [e["txn"]["i"] for e in envs] == list(range(len(tables)))
    assert all(e["alter"] == envs[0]["alter"] and e["alter"]["kind"] == sql.split()[0].lower() for e in envs)
    assert [m.last for m in msgs] == [False] * (len(tables) - 1) + [True]
    assert msgs[-1].resume == Resume(F, 260, "0-1-6")
    assert all(m.resume == Resume(F, 100, "0-1-5") for m in msgs[:-1])


def test_ddl_naming_no_table_goes_to_the_ddl_subject():
    a = asm()
    a.gtid("0-1-6", 0, True, F, 100)
    (msg,) = a.query("CREATE DATABASE d2", "shop", F, 140, 260, TS)
    e = env(msg)
    assert msg.subject == "binlake.raw.src.$binlake.ddl"
    assert (e["db"], e["table"], e["ddl"]) == ("shop", None, "CREATE DATABASE d2")
    assert msg.headers["Binlake-Table"] == ""


def test_lower_case_table_names_puts_ddl_on_the_subject_of_its_rows():
    """lower_case_table_names=1: the TableMaps name `shop.orders` however the SQL (or USE) spells it."""
    a = asm(lower_names=True, ignore=frozenset({("Binlake", "Watermarks")}))
    out = a.query("CREATE TABLE Shop.Orders (id INT PRIMARY KEY, note TEXT)", "Other", F, 100, 200, TS)
    out += a.query("ALTER TABLE ORDERS ADD COLUMN x INT, RENAME TO Old", "Shop", F, 200, 300, TS)
    out += a.query("CREATE DATABASE D2", "Shop", F, 300, 400, TS)
    out += a.query("CREATE TABLE binlake.WATERMARKS (id INT)", "Shop", F, 400, 500, TS)
    a.gtid("0-1-6", 0, False, F, 500)
    out += a.rows("i", T, rows(1), F, 600, TS)
    out += a.commit(F, 700)
    envs = [env(m) for m in out]
    assert [(e["op"], e["db"], e["table"]) for e in envs] == [
        ("ddl", "shop", "orders"), ("ddl", "shop", "orders"), ("ddl", "shop", "old"), ("ddl", "shop", None),
        ("i", "shop", "orders")]
    assert [m.subject for m in out] == ["binlake.raw.src.shop.orders"] * 2 + [
        "binlake.raw.src.shop.old", "binlake.raw.src.$binlake.ddl", "binlake.raw.src.shop.orders"]
    assert envs[0]["ddl"] == "CREATE TABLE Shop.Orders (id INT PRIMARY KEY, note TEXT)"  # the text as written
    assert envs[1]["alter"]["renames"] == [["shop", "orders", "shop", "old"]]


def test_names_keep_their_case_without_lower_case_table_names():
    (msg,) = asm().query("CREATE TABLE Shop.Orders (id INT)", "Other", F, 100, 200, TS)
    assert msg.subject == "binlake.raw.src.Shop.Orders"
    assert (env(msg)["db"], env(msg)["table"]) == ("Shop", "Orders")


def test_ddl_without_gtid_is_its_own_transaction():
    a = asm(start=Resume(F, 4), mariadb=False)
    (msg,) = a.query("TRUNCATE t", "shop", F, 140, 260, TS)
    assert msg.last and env(msg)["txn"]["id"] == f"{F}:140" and not a.in_transaction


def test_mysql_create_table_select_is_one_transaction():
    # MySQL >= 8.0.21 logs CREATE ... SELECT as GTID, BEGIN, CREATE ... START TRANSACTION, rows, XID.
    a = asm(start=Resume(F, 4), mariadb=False)
    a.gtid("uuid:6", None, False, F, 100)
    a.query("BEGIN", "shop", F, 150, 200, TS)
    out = a.query("CREATE TABLE orders (id INT, note TEXT) START TRANSACTION", "shop", F, 200, 300, TS)
    out += a.rows("i", T, rows(1), F, 350, TS)
    out += a.commit(F, 400)
    assert [(m.op, m.last) for m in out] == [("ddl", False), ("i", True)]
    assert [m.resume for m in out] == [Resume(F, 100), Resume(F, 400)]


def test_savepoint_inside_a_transaction_is_ignored():
    a = asm()
    a.gtid("0-1-6", 0, False, F, 100)
    a.query("BEGIN", "shop", F, 140, 180, TS)
    a.rows("i", T, rows(1), F, 200, TS)
    assert a.query("SAVEPOINT `sp1`", "shop", F, 250, 280, TS) == []
    out = a.rows("i", T, rows(2), F, 300, TS) + a.commit(F, 400)
    assert [(env(m)["txn"]["i"], m.last) for m in out] == [(0, False), (1, True)]


def test_rollback_to_savepoint_does_not_end_the_transaction():
    a = asm()
    a.gtid("0-1-6", 0, False, F, 100)
    a.query("BEGIN", "shop", F, 140, 180, TS)
    out = a.rows("i", T, rows(1), F, 200, TS)
    a.query("SAVEPOINT `sp1`", "shop", F, 250, 280, TS)
    out += a.rows("i", T, rows(2), F, 300, TS)
    assert a.query("ROLLBACK TO `sp1`", "shop", F, 350, 380, TS) == []
    assert a.in_transaction
    out += a.rows("i", T, rows(3), F, 400, TS) + a.commit(F, 500)
    assert [m.last for m in out] == [False, False, True]
    assert out[-1].resume == Resume(F, 500, "0-1-6")


@pytest.mark.parametrize(
    "sql", ["INSERT INTO t VALUES (1)", "update t set a = 2", "/* x */ DELETE FROM t", "REPLACE INTO t VALUES (1)"]
)
def test_statement_based_dml_is_refused(sql):
    a = asm()
    a.gtid("0-1-6", 0, False, F, 100)
    a.query("BEGIN", "shop", F, 140, 180, TS)
    with pytest.raises(SourceMisconfigured, match="binlog_format=ROW"):
        a.query(sql, "shop", F, 200, 260, TS)


# -- oversize events ------------------------------------------------------------------------------


def test_large_rows_event_is_split_into_chunks():
    max_payload = HEADER_ALLOWANCE + 1500
    a = asm(max_payload=max_payload)
    many = rows(*range(40), note="n" * 100)
    a.gtid("0-1-6", 0, False, F, 100)
    a.query("BEGIN", "shop", F, 140, 180, TS)
    out = a.rows("i", T, many, F, 200, TS)
    out += a.rows("d", T, [{"before": {"id": 0, "note": None}}], F, 9000, TS)
    out += a.commit(F, 9500)
    chunks, tail = out[:-1], out[-1]
    assert len(chunks) > 2
    envs = [env(m) for m in chunks]
    scn = envelope.scn(F, 200)
    assert [m.msg_id for m in chunks] == [f"src:{scn}"] + [f"src:{scn}:{k}" for k in range(1, len(chunks))]
    assert [e["chunk"] for e in envs] == list(range(len(chunks)))
    assert [e["txn"]["i"] for e in [*envs, env(tail)]] == list(range(len(chunks) + 1))
    assert all(len(m.data) <= max_payload - HEADER_ALLOWANCE for m in out)
    assert [r for e in envs for r in e["rows"]] == many
    assert [m.rows for m in chunks] == [len(e["rows"]) for e in envs]
    assert all(e["scn"] == scn and e["schema"] == T.described for e in envs)
    assert [m.last for m in out] == [False] * len(chunks) + [True]


def test_last_rows_event_split_marks_only_its_final_chunk_last():
    max_payload = HEADER_ALLOWANCE + 1500
    a = asm(max_payload=max_payload)
    many = rows(*range(40), note="n" * 100)
    a.gtid("0-1-6", 0, False, F, 100)
    a.rows("i", T, many, F, 200, TS)
    out = a.commit(F, 9500)
    assert len(out) > 2
    assert [m.last for m in out] == [False] * (len(out) - 1) + [True]
    assert [m.resume for m in out] == [Resume(F, 100, "0-1-5")] * (len(out) - 1) + [Resume(F, 9500, "0-1-6")]
    assert [env(m)["txn"]["i"] for m in out] == list(range(len(out)))
    assert len({m.msg_id for m in out}) == len(out)


def test_single_row_larger_than_max_payload_travels_as_an_object_reference():
    a = asm(max_payload=HEADER_ALLOWANCE + 500)
    a.gtid("0-1-6", 0, False, F, 100)
    big = rows(1, 2, 3, note="n" * 1000)
    out = a.rows("i", T, big[:1], F, 200, TS) + a.rows("i", T, big[1:], F, 400, TS) + a.commit(F, 600)
    assert all(len(m.data) <= 500 for m in out)
    refs = [m for m in out if m.blob is not None]
    assert len(refs) == 3  # the second event is halved down to single rows, each an object
    for m in refs:
        assert m.blob is not None
        ref_env = env(m)
        ref = objects.Ref.of(ref_env)
        assert ref is not None and ref.bucket == "binlake_raw_objects"
        assert ref.name == f"{m.msg_id}.{ref.sha256[:16]}" and ref_env["v"] == envelope.REF_VERSION
        assert ref.size == len(m.blob) and ref_env["rows"] == [] and m.rows == 1
        whole = envelope.decode(m.blob)
        assert whole["scn"] == ref_env["scn"] and whole["chunk"] == ref_env["chunk"]
        assert whole["txn"] == ref_env["txn"] and whole["schema"] == T.described
        assert m.headers[objects.HEADER] == f"binlake_raw_objects/{ref.name}"
    assert [r for m in refs for r in envelope.decode(m.blob or b"")["rows"]] == big
    assert [env(m)["txn"]["i"] for m in out] == list(range(len(out)))
    assert [m.last for m in out] == [False] * (len(out) - 1) + [True]


# -- heartbeats -----------------------------------------------------------------------------------


def test_heartbeat_only_between_transactions():
    a = asm()
    (hb,) = a.heartbeat(TS)
    e = env(hb)
    assert hb.subject == "binlake.raw.src.$binlake.heartbeat"
    assert (hb.op, hb.last, hb.resume, hb.rows) == ("hb", True, Resume(F, 4, "0-1-5"), 0)
    assert (e["op"], e["db"], e["table"], e["txn"]["last"]) == ("hb", None, None, True)
    assert e["resume"] == {"file": F, "offset": 4, "gtid": "0-1-5"}
    assert hb.msg_id == f"src:{envelope.scn(F, 4)}:hb{TS}"
    a.gtid("0-1-6", 0, False, F, 100)
    assert a.heartbeat(TS + 1) == []
    a.rows("i", T, rows(1), F, 200, TS)
    assert a.heartbeat(TS + 2) == []
    a.commit(F, 300)
    (hb,) = a.heartbeat(TS + 3)
    assert hb.resume == Resume(F, 300, "0-1-6")
    a.between("mysql-bin.000004", 4)
    (hb,) = a.heartbeat(TS + 4)
    assert hb.resume == Resume("mysql-bin.000004", 4, "0-1-6")


def test_between_does_not_move_the_boundary_inside_a_transaction():
    a = asm()
    a.gtid("0-1-6", 0, False, F, 100)
    a.between(F, 150)
    assert a.boundary == Resume(F, 4, "0-1-5")


def test_between_never_moves_back_within_a_file():
    """A resume by GTID streams the file from its start: its first events are behind the boundary."""
    a = asm(start=Resume(F, 5000, "0-1-5"))
    a.between(F, 158)
    assert a.boundary == Resume(F, 5000, "0-1-5")
    a.between("mysql-bin.000002", 4)  # another server's or the next file: taken
    assert a.boundary.file == "mysql-bin.000002"


def test_no_heartbeat_while_the_stream_ends_inside_an_unfinished_transaction():
    """After a restart mid-transaction the tail holds its first batches; a heartbeat published
    before the transaction is finished would hide the skip mark and re-publish them."""
    a = asm(start=Resume(F, 100, "0-1-5"), skip=SkipMark("0-1-6", 0))
    assert a.heartbeat(TS) == []
    out = mariadb_txn(a, "0-1-6", 100, 3)
    assert [env(m)["txn"]["i"] for m in out] == [1, 2]  # batch 0 is stored
    assert len(a.heartbeat(TS + 1)) == 1


def test_a_stream_opened_by_gtid_keeps_its_start_until_a_transaction_commits():
    """Positions the server sends before the first transaction of a run opened by GTID (a rotate to
    the file's start, Previous_gtids) are no place to resume at by file and offset."""
    start = Resume("binlog.000007", 1234, "0-1-5", server=1, epoch=1)
    a = asm(start=start, server=2, epoch=1, by_gtid=True)
    a.between("binlog.000001", 4)
    a.between("binlog.000001", 158)
    assert a.boundary == start and a.heartbeat(TS)[0].resume == start
    a.gtid("0-2-6", 0, False, "binlog.000001", 900)
    a.commit("binlog.000001", 1000)
    assert a.boundary == Resume("binlog.000001", 1000, "0-2-6", 2, 1)
    a.between("binlog.000002", 4)
    assert a.boundary == Resume("binlog.000002", 4, "0-2-6", 2, 1)


def test_mysql_without_gtid_mode_tracks_no_set():
    a = asm(start=Resume("binlog.000001", 4, None), mariadb=False, gtids=False)
    a.previous_gtids(GtidSet.parse("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100"))
    a.between("binlog.000001", 158)
    assert a.boundary == Resume("binlog.000001", 158, None)


def test_resume_round_trip():
    r = Resume(F, 123, "0-1-5")
    assert Resume.from_dict(r.to_dict()) == r
    assert Resume.from_dict({"file": F, "offset": "7"}) == Resume(F, 7, None)

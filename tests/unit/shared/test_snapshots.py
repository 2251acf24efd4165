"""Snapshot requests and per-table progress in the cursor bucket: keys, JSON round trips, pattern matching."""

from __future__ import annotations

import json
import re

import pytest

from shared import keys
from shared import snapshots as snap
from shared.keys import kv_token
from shared.snapshots import SnapshotRequest, TableProgress, matches

NAMES = ["", "=", "a", "A", "a.b", "a_b", "a-b", "a b", "a=2Eb", "a=2E", "=2E", ".", "..", "*", ">", "caf\u00e9",
         "\U0001f389", "x/y", "a\\b", "a`b", "tab\tle", "=3D", "3D", "a.b.c", "a..b"]


# -- keys -----------------------------------------------------------------------------------------


def test_kv_token_is_injective_and_uses_only_safe_characters() -> None:
    tokens = [kv_token(n) for n in NAMES]
    assert len(set(tokens)) == len(NAMES)
    for t in tokens:
        assert re.fullmatch(r"[A-Za-z0-9_=-]+", t), t


@pytest.mark.parametrize(
    ("name", "token"),
    [("orders", "orders"), ("Order_2-x", "Order_2-x"), ("a.b", "a=2Eb"), ("=", "=3D"), ("", "="),
     ("caf\u00e9", "caf=C3=A9"), ("a b", "a=20b")],
)
def test_kv_token(name: str, token: str) -> None:
    assert kv_token(name) == token


def test_table_and_request_keys() -> None:
    assert keys.snapshot_table("main", "shop", "orders") == "snapshot.main.table.shop.orders"
    assert keys.snapshot_request("main", "abc123") == "snapshot.main.request.abc123"
    assert keys.snapshot_tables("main") == "snapshot.main.table.>"
    assert keys.snapshot_requests("main") == "snapshot.main.request.>"


def test_keys_escape_dots_so_names_cannot_collide() -> None:
    assert keys.snapshot_table("main", "a.b", "c") != keys.snapshot_table("main", "a", "b.c")
    assert keys.snapshot_table("main", "a.b", "c") == "snapshot.main.table.a=2Eb.c"
    assert keys.snapshot_table("a.b", "c", "d") != keys.snapshot_table("a", "b.c", "d")
    assert len(keys.snapshot_table("main", "a.b", "c.d").split(".")) == 5


@pytest.mark.parametrize("source", ["main", "east.1", "we ird"])
def test_keys_fall_under_their_filters(source: str) -> None:
    tkey = keys.snapshot_table(source, "shop", "orders")
    rkey = keys.snapshot_request(source, "r1")
    assert tkey.startswith(keys.snapshot_tables(source)[:-1])
    assert rkey.startswith(keys.snapshot_requests(source)[:-1])
    assert not tkey.startswith(keys.snapshot_requests(source)[:-1])
    other = keys.snapshot_table(source + "x", "shop", "orders")
    assert not other.startswith(keys.snapshot_tables(source)[:-1])


# -- TableProgress --------------------------------------------------------------------------------


def progress(**kw: object) -> TableProgress:
    base: dict[str, object] = {"db": "shop", "table": "orders", "run": "r1"}
    return TableProgress(**(base | kw))  # type: ignore[arg-type]


def test_table_progress_defaults() -> None:
    p = progress()
    assert (p.state, p.chunks, p.last_key, p.rows, p.estimate, p.key, p.error) == (snap.PENDING, 0, None, 0, 0, [],
                                                                                     None)
    assert p.name == "shop.orders"
    assert not p.finished


@pytest.mark.parametrize(
    "last_key",
    [None, [], [1], [1, "x", b"\x00\xff"], [b""], ["12.50", "2024-01-01 00:00:00"], [2**64 - 1, -1]],
)
def test_table_progress_json_round_trip(last_key: list[object] | None) -> None:
    p = progress(state=snap.RUNNING, chunks=3, last_key=last_key, rows=12_000, estimate=50_000, key=["a", "b"],
                 key_kind="unique", retries=2, requested_ms=1, started_ms=2, updated_ms=3, error="boom")
    back = TableProgress.from_json(p.to_json())
    assert back == p
    if last_key:
        assert [type(x) for x in back.last_key or []] == [type(x) for x in last_key]


def test_bytes_in_last_key_travel_as_hex() -> None:
    d = json.loads(progress(last_key=[b"\x01\xab", 5]).to_json())
    assert d["last_key"] == [{"hex": "01ab"}, 5]


def test_unknown_json_fields_are_ignored_and_missing_ones_default() -> None:
    data = json.dumps({"db": "d", "table": "t", "run": "r", "state": "done", "future_field": [1, 2],
                       "another": {"x": 1}}).encode()
    p = TableProgress.from_json(data)
    assert p == TableProgress(db="d", table="t", run="r", state=snap.DONE)


def test_advanced_running() -> None:
    p = progress(state=snap.RUNNING, chunks=2, rows=10, estimate=100, last_key=[5])
    q = p.advanced(last_key=[9], rows=4, now_ms=1234, done=False)
    assert (q.state, q.chunks, q.rows, q.last_key, q.updated_ms, q.finished_ms, q.estimate) == (
        snap.RUNNING, 3, 14, [9], 1234, 0, 100)
    assert not q.finished
    assert p.rows == 10  # frozen: the original is unchanged


@pytest.mark.parametrize(("estimate", "rows_before", "rows", "expected"), [(100, 10, 4, 100), (5, 10, 4, 14),
                                                                           (0, 0, 0, 0)])
def test_advanced_done_sets_finished_and_estimate_at_least_rows(estimate: int, rows_before: int, rows: int,
                                                                expected: int) -> None:
    p = progress(state=snap.RUNNING, chunks=1, rows=rows_before, estimate=estimate)
    q = p.advanced(last_key=None, rows=rows, now_ms=777, done=True)
    assert (q.state, q.finished_ms, q.updated_ms, q.estimate, q.rows) == (snap.DONE, 777, 777, expected,
                                                                           rows_before + rows)
    assert q.estimate >= q.rows
    assert q.finished


@pytest.mark.parametrize(
    ("state", "finished"),
    [(snap.PENDING, False), (snap.RUNNING, False), (snap.DONE, True), (snap.FAILED, True), (snap.DROPPED, True)],
)
def test_finished(state: str, finished: bool) -> None:
    assert progress(state=state).finished is finished


# -- SnapshotRequest ------------------------------------------------------------------------------


def test_snapshot_request_round_trip() -> None:
    r = SnapshotRequest(id="abc", patterns=["shop.orders", r"shop\..*"], created_ms=42)
    assert (r.state, r.tables, r.error) == ("new", [], None)
    assert SnapshotRequest.from_json(r.to_json()) == r
    answered = SnapshotRequest(id="abc", patterns=["x"], created_ms=1, state="failed", tables=["k1", "k2"],
                               error="no table")
    assert SnapshotRequest.from_json(answered.to_json()) == answered


def test_snapshot_request_ignores_unknown_fields() -> None:
    data = json.dumps({"id": "i", "patterns": ["a.b"], "created_ms": 5, "state": "accepted", "new_field": 1}).encode()
    assert SnapshotRequest.from_json(data) == SnapshotRequest(id="i", patterns=["a.b"], created_ms=5, state="accepted")


# -- matches --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patterns", "db", "table", "expected"),
    [
        (["shop.orders"], "shop", "orders", True),
        (["shop.orders"], "shop", "orders2", False),
        (["shop.orders"], "xshop", "orders", False),
        (["shop"], "shop", "orders", False),
        (["orders"], "shop", "orders", False),
        ([r"shop\.ord"], "shop", "orders", False),
        ([r"shop\..*"], "shop", "orders", True),
        ([r"shop\..*"], "shop2", "orders", False),
        ([r"shop\..*"], "myshop", "orders", False),
        ([r".*\.orders"], "any", "orders", True),
        ([r"(a|b)\.t\d+"], "b", "t12", True),
        ([r"(a|b)\.t\d+"], "b", "t12x", False),
        (["a+b.t(1)"], "a+b", "t(1)", True),  # a literal name that as a regex would not match itself
        (["a+b.t(1)"], "aab", "t1", True),  # ... and as a regex, it also matches this
        (["nope", r"shop\.orders"], "shop", "orders", True),
        ([], "shop", "orders", False),
        (["SHOP.ORDERS"], "shop", "orders", False),
    ],
)
def test_matches(patterns: list[str], db: str, table: str, expected: bool) -> None:
    assert matches(patterns, db, table) is expected


def test_a_literal_name_that_is_no_valid_regex_still_matches_itself() -> None:
    assert matches(["db.t[1"], "db", "t[1")

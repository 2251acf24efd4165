"""services.loader.naming: source db/table names <-> lake identifiers (pure)."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from services.loader.frames import BOOK_PREFIX, lake_columns
from services.loader.naming import (
    BOOK_NAMESPACE,
    CHANGELOG_SUFFIX,
    LIVE_SUFFIX,
    MAX_NAME,
    LakeNameError,
    TableNames,
    bounded,
    escape,
    hashed,
    lake_column,
    quote,
    reserved_column,
    source_column,
    source_of,
    unescape,
)

# Any str at all: surrogates, controls and unassigned code points included.
ANY = st.text(st.characters(exclude_categories=[]))
LAKE_ALPHABET = re.compile(r"[a-z0-9_]*")
# What the lake itself may hold in a folder or catalog: strings over escape's output alphabet.
IDENTS = st.text(st.sampled_from("abx0159f_"), max_size=24)


@pytest.mark.parametrize(("name", "ident"), [
    ("users", "users"),
    ("order_items", "order_items"),
    ("t1", "t1"),
    ("Users", "__x55_sers"),
    ("order-items", "order__x2d_items"),
    ("a__b", "a__x5f___x5f_b"),
    ("_t", "__x5f_t"),
    ("t_", "t__x5f_"),
    ("_", "__x5f_"),
    ("a b", "a__x20_b"),
    ("a.b", "a__x2e_b"),
    ("a`b", "a__x60_b"),
    ("ü", "__xfc_"),
    ("😀", "__x1f600_"),
    ("", ""),
])
def test_escape_examples(name, ident):
    assert escape(name) == ident
    assert unescape(ident) == name


@given(ANY)
@example("x__changelog")
@example("x__live")
@example("_binlake")
@example("__x41_")
def test_escape_is_lower_case_ascii_and_reversible(name):
    ident = escape(name)
    assert LAKE_ALPHABET.fullmatch(ident)
    assert unescape(ident) == name


@given(ANY, ANY)
def test_escape_is_injective(a, b):
    assume(a != b)
    assert escape(a) != escape(b)


@given(ANY, ANY)
@example("t", "t__changelog")
@example("t", "t__live")
@example("", "__changelog")
def test_no_name_escapes_to_another_names_changelog_or_live_table(a, b):
    assert escape(a) + CHANGELOG_SUFFIX != escape(b)
    assert escape(a) + LIVE_SUFFIX != escape(b)
    assert not escape(b).endswith(CHANGELOG_SUFFIX)
    assert not escape(b).endswith(LIVE_SUFFIX)


@given(ANY)
@example("_binlake")
@example("binlake")
def test_the_bookkeeping_namespace_is_no_escaped_name(name):
    assert escape(name) != BOOK_NAMESPACE
    assert not escape(name).startswith("_") or escape(name).startswith("__x")


def _huge_escape(ident: str) -> bool:
    return any(int(h, 16) > 0x10FFFF for h in re.findall(r"__x([0-9a-f]+)_", ident))


@given(IDENTS)
@example("_binlake")
@example("__x41_")  # upper case must stay escaped
@example("__x061_")  # a leading zero is not what escape writes
@example("a_")
@example("__x5f")
@example("___x5f_")
def test_unescape_accepts_exactly_what_escape_writes(ident):
    assume(not _huge_escape(ident))  # test_unescape_rejects_code_points_out_of_range
    try:
        name = unescape(ident)
    except LakeNameError:
        return
    assert escape(name) == ident


@pytest.mark.parametrize("ident", ["A", "a-b", "a.b", "a b", "ü", "x__changelog", "x__live", "__x_", "__xg_"])
def test_unescape_rejects_what_escape_never_writes(ident):
    with pytest.raises(LakeNameError):
        unescape(ident)



@pytest.mark.parametrize("ident", ["__x110000_", "__x" + "f" * 20 + "_"])
def test_unescape_rejects_code_points_out_of_range(ident):
    with pytest.raises(LakeNameError):
        unescape(ident)
    assert source_of("d", ident) is None


# -- source_of ------------------------------------------------------------------------------


@given(ANY, ANY)
@example("d", "t__changelog")
@example("_binlake", "commits")
def test_source_of_round_trips(db, table):
    names = TableNames("lake", db, table)
    if hashed(names.namespace) or hashed(names.current_name):  # bounded: read back from the table's property
        assert source_of(names.namespace, names.current_name) is None
        return
    assert source_of(names.namespace, names.current_name) == (db, table, "current")
    assert source_of(names.namespace, names.changelog_name) == (db, table, "changelog")


@pytest.mark.parametrize(("namespace", "name"), [
    (BOOK_NAMESPACE, "commits"),
    (BOOK_NAMESPACE, "t"),
    ("d", "Users"),
    ("D", "t"),
    ("d", "t__live"),
    ("d", "t__changelog__changelog"),
    ("d", "x__y"),
])
def test_source_of_other_tables_is_none(namespace, name):
    assert source_of(namespace, name) is None


# -- quote and TableNames -------------------------------------------------------------------------


@pytest.mark.parametrize(("ident", "quoted"), [
    ("t", "`t`"),
    ("a b", "`a b`"),
    ("a.b", "`a.b`"),
    ("a`b", "`a``b`"),
    ("``", "``````"),
    ("", "``"),
])
def test_quote(ident, quoted):
    assert quote(ident) == quoted


@given(ANY)
def test_quote_round_trips(ident):
    q = quote(ident)
    assert q[0] == q[-1] == "`"
    assert "`" not in q[1:-1].replace("``", "")
    assert q[1:-1].replace("``", "`") == ident


def test_table_names():
    n = TableNames("lake", "Shop", "order-items")
    assert n.namespace == "__x53_hop"
    assert (n.current_name, n.changelog_name, n.live_name) == (
        "order__x2d_items", "order__x2d_items__changelog", "order__x2d_items__live")
    assert n.current == "`lake`.`__x53_hop`.`order__x2d_items`"
    assert n.changelog == "`lake`.`__x53_hop`.`order__x2d_items__changelog`"
    assert n.live == "`lake`.`__x53_hop`.`order__x2d_items__live`"
    assert n.sql("x") == "`lake`.`__x53_hop`.`x`"
    assert n.path("/data/lake/", n.changelog_name) == "/data/lake/__x53_hop/order__x2d_items__changelog"
    assert n.path("/data/lake", n.current_name) == "/data/lake/__x53_hop/order__x2d_items"


@pytest.mark.parametrize("name", ["_binlake_x", "_BINLAKE_op", "__binlake_x", "___Binlake_", "binlake_x", "x", "_b"])
def test_column_names_round_trip_and_never_meet_the_bookkeeping(name: str) -> None:
    lake = lake_column(name)
    assert source_column(lake) == name
    assert not lake.lower().startswith(BOOK_PREFIX) or lake.startswith("__")
    assert reserved_column(name) == (lake != name)


def test_lake_columns_renames_every_column_an_envelope_names() -> None:
    env = {"op": "u", "pk": ["_binlake_k"], "schema": {"columns": [{"name": "_binlake_k"}, {"name": "v"}]},
           "rows": [{"before": {"_binlake_k": 1, "v": 2}, "after": {"_binlake_k": 1, "v": 3}}]}
    out = lake_columns(env)
    assert out["pk"] == ["__binlake_k"] and [c["name"] for c in out["schema"]["columns"]] == ["__binlake_k", "v"]
    assert out["rows"] == [{"before": {"__binlake_k": 1, "v": 2}, "after": {"__binlake_k": 1, "v": 3}}]
    ddl = {"op": "ddl", "alter": {"kind": "alter", "ops": [
        {"op": "rename", "old": "_binlake_a", "new": "b"},
        {"op": "add", "column": {"name": "_binlake_c"}, "after": "b"},
        {"op": "primary_key", "columns": ["_binlake_c"]}, {"op": "drop", "name": "_binlake_d"}]}}
    assert lake_columns(ddl)["alter"]["ops"] == [
        {"op": "rename", "old": "__binlake_a", "new": "b"},
        {"op": "add", "column": {"name": "__binlake_c"}, "after": "b"},
        {"op": "primary_key", "columns": ["__binlake_c"]}, {"op": "drop", "name": "__binlake_d"}]
    plain = {"op": "i", "schema": {"columns": [{"name": "id"}]}, "rows": [{"after": {"id": 1}}]}
    assert lake_columns(plain) is plain


def test_long_names_are_bounded_by_a_hash_of_the_whole_name() -> None:
    long = "ORDER_ITEMS_" + "X" * 34  # 46 upper-case characters: 276 bytes escaped
    names = TableNames("lake", "Shop" * 16, long)
    for ident in (names.namespace, names.current_name):
        assert len(ident) <= MAX_NAME and hashed(ident)
    assert len(names.changelog_name) <= 128
    assert source_of(names.namespace, names.current_name) is None  # found by its property instead
    assert bounded(long) != bounded(long[:-1] + "Y")
    assert bounded("short") == escape("short") and not hashed(escape("a__b" * 20))

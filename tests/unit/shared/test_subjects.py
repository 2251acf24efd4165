"""Subject names, reversible token escaping and the partition hash."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from shared.subjects import Names, escape_token, fnv1a32, partition, unescape_token

# Keep hypothesis' caches out of the working tree.
set_hypothesis_home_dir(str(Path(tempfile.gettempdir()) / "binlake-unit-hypothesis"))


@settings(database=None, max_examples=300)
@given(st.text())
def test_escape_round_trip(name):
    token = escape_token(name)
    assert unescape_token(token) == name
    assert token
    assert not set(token) & set(". *>\t\r\n")
    assert token.isascii()


@settings(database=None)
@given(st.text(alphabet="abc.%$ *>\u00e9\U0001f600", max_size=8), st.text(alphabet="abc.%$ *>", max_size=8))
def test_escape_is_injective(a, b):
    if a != b:
        assert escape_token(a) != escape_token(b)


@pytest.mark.parametrize(
    ("name", "token"),
    [
        ("orders", "orders"),
        ("Order_Items-2", "Order_Items-2"),
        ("a.b", "a%2Eb"),
        ("my table", "my%20table"),
        ("*", "%2A"),
        (">", "%3E"),
        ("%", "%25"),
        ("$binlake", "%24binlake"),
        ("\u00e9", "%C3%A9"),
        ("", "%"),
    ],
)
def test_escape_examples(name, token):
    assert escape_token(name) == token
    assert unescape_token(token) == name


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", 0x811C9DC5), (b"a", 0xE40C292C), (b"foobar", 0xBF9CF968)],
)
def test_fnv1a32_vectors(data, expected):
    assert fnv1a32(data) == expected


def test_partition_hashes_the_concatenated_tokens():
    assert partition(16, "src", "db", "t") == fnv1a32(b"srcdbt") % 16
    assert partition(1, "x") == 0
    assert all(0 <= partition(7, "s", "d", f"t{i}") < 7 for i in range(50))


def test_names_default_prefix():
    n = Names()
    assert (n.raw_stream, n.cdc_stream) == ("BINLAKE_RAW", "BINLAKE_CDC")
    assert (n.cursors_bucket, n.schema_bucket, n.members_bucket, n.leases_bucket) == (
        "binlake_cursors", "binlake_schema", "binlake_members", "binlake_leases",
    )
    assert n.raw("main", "shop", "orders") == "binlake.raw.main.shop.orders"
    assert n.raw("main", "my.db", "t 1") == "binlake.raw.main.my%2Edb.t%201"
    assert n.raw_internal("main", "heartbeat") == "binlake.raw.main.$binlake.heartbeat"
    assert n.raw_source_filter("main") == "binlake.raw.main.>"
    assert n.raw_partition_filter("main", 3) == "binlake.raw.main.3.>"
    assert n.cdc("main", "shop", "orders") == "binlake.cdc.main.shop.orders"
    assert n.dlq("main") == "binlake.dlq.main"


def test_names_custom_prefix():
    n = Names("acme")
    assert (n.raw_stream, n.cursors_bucket) == ("ACME_RAW", "acme_cursors")
    assert n.raw("s", "d", "t") == "acme.raw.s.d.t"


def test_raw_transform():
    assert Names().raw_transform(16) == (
        "binlake.raw.*.*.*",
        "binlake.raw.{{wildcard(1)}}.{{partition(16,1,2,3)}}.{{wildcard(2)}}.{{wildcard(3)}}",
    )


@pytest.mark.parametrize(("db", "table"), [("shop", "orders"), ("a.b", "c d"), ("\u00fc", "*>"), ("", "t")])
def test_raw_stored_round_trip(db, table):
    n = Names()
    subject = n.raw_stored("main", db, table, 16)
    part = partition(16, escape_token("main"), escape_token(db), escape_token(table))
    assert subject == f"binlake.raw.main.{part}.{escape_token(db)}.{escape_token(table)}"
    assert n.parse_raw_stored(subject) == ("main", part, db, table)


@pytest.mark.parametrize(("db", "table"), [("shop", "orders"), ("a.b", "c d"), ("\u00fc", "*>")])
def test_the_stored_filter_of_a_raw_subject_matches_its_stored_subject_in_any_partition(db, table):
    n = Names()
    pattern = n.raw_stored_filter(n.raw("main", db, table)).split(".")
    stored = n.raw_stored("main", db, table, 16).split(".")
    assert len(pattern) == len(stored) and all(p in ("*", s) for p, s in zip(pattern, stored, strict=True))
    with pytest.raises(ValueError, match="not a raw subject"):
        n.raw_stored_filter(".".join(stored))


@pytest.mark.parametrize("subject", ["binlake.raw.main.shop.orders", "other.raw.main.1.d.t", "binlake.cdc.m.1.d.t"])
def test_parse_raw_stored_rejects_other_subjects(subject):
    with pytest.raises(ValueError, match="not a stored raw subject"):
        Names().parse_raw_stored(subject)

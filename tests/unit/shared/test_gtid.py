"""shared.gtid: MySQL GTID sets in text and binary form, tagged GTIDs included."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import DecodeError
from shared.gtid import GtidError, GtidSet, parse_gtid

U1, U2 = "7c3eea46-ea65-11f1-98b9-02fc00000001", "3e11fa47-71ca-11e1-9e33-c80aa9429562"
# The body of a real MySQL 9.7 Previous_gtids event after tagged transactions.
PREVIOUS_GTIDS = bytes.fromhex(
    "01030000000000017c3eea46ea6511f198b902fc00000001000100000000000000010000000000000004000000000000007c3eea46"
    "ea6511f198b902fc00000001066162630100000000000000010000000000000002000000000000007c3eea46ea6511f198b902fc00"
    "0000010874616731010000000000000001000000000000000200000000000000")


def test_text_is_normalised_the_way_mysql_prints_it():
    s = GtidSet.parse(f" {U2.upper()}:5-7:1-3 ,\n{U1}:1:2-3:TAG1:1:abc:1")
    assert str(s) == f"{U2}:1-3:5-7,{U1}:1-3:abc:1:tag1:1"  # by uuid, untagged first, then tags in order
    assert GtidSet.parse(str(s)) == s
    assert str(GtidSet.parse("")) == "" and not GtidSet.parse(None)


def test_adding_the_next_transaction_extends_its_range():
    s = GtidSet.parse(f"{U1}:1-3")
    s.add(f"{U1}:4")
    s.add(f"{U1}:6")
    s.add(f"{U1}:etl:1")
    assert str(s) == f"{U1}:1-4:6:etl:1"
    s.add(f"{U1}:5")
    assert str(s) == f"{U1}:1-6:etl:1"


def test_previous_gtids_event_decodes_and_encodes_byte_exact():
    s = GtidSet.decode(PREVIOUS_GTIDS)
    assert str(s) == f"{U1}:1-3:abc:1:tag1:1"
    assert s.encode() == PREVIOUS_GTIDS


def test_untagged_sets_use_the_old_binary_form():
    s = GtidSet.parse(f"{U1}:1-3")
    assert s.encode()[:8] == (1).to_bytes(8, "little")
    assert GtidSet.decode(s.encode()) == s


def test_contains_and_missing():
    have = GtidSet.parse(f"{U1}:1-10:20-30:etl:1-5")
    assert have.contains(GtidSet.parse(f"{U1}:2-9:25:etl:5"))
    assert not have.contains(GtidSet.parse(f"{U1}:9-11"))
    assert str(have.missing(GtidSet.parse(f"{U1}:5-25:etl:4-7,{U2}:1"))) == f"{U2}:1,{U1}:11-19:etl:6-7"


@pytest.mark.parametrize("bad", ["nope:1", f"{U1}", f"{U1}:0", f"{U1}:5-3", f"{U1}:1x", f"{U1}:9tag:1",
                                 f"{U1}:{'t' * 33}:1"])
def test_bad_text_is_refused(bad):
    with pytest.raises(GtidError):
        GtidSet.parse(bad)


@pytest.mark.parametrize("bad", ["0-1-5", f"{U1}", f"{U1}:t:0", f"{U1}:a:b:1"])
def test_bad_gtids_are_refused(bad):
    with pytest.raises(GtidError):
        parse_gtid(bad)


def test_truncated_binary_is_a_decode_error():
    with pytest.raises(DecodeError):
        GtidSet.decode(PREVIOUS_GTIDS[:-3])


@given(st.lists(st.tuples(st.sampled_from([U1, U2]), st.sampled_from(["", "a", "etl_2"]),
                          st.integers(1, 60)), max_size=80))
def test_any_added_gtids_survive_text_and_binary(gtids):
    s = GtidSet()
    for sid, tag, n in gtids:
        s.add(f"{sid}:{tag}:{n}" if tag else f"{sid}:{n}")
    assert GtidSet.parse(str(s)) == s
    assert GtidSet.decode(s.encode()) == s
    for sid, tag, n in gtids:
        assert s.contains(GtidSet.parse(f"{sid}:{tag}:{n}" if tag else f"{sid}:{n}"))

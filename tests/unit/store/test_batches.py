"""services.store.batches (delivered / acked / wanted) and shared.clients.ClientState (pure)."""

from __future__ import annotations

import re

import pytest

from services.store import batches
from services.store.batches import ProtocolError
from shared import keys
from shared.clients import ClientState
from shared.rpc import BadRequest, RpcError


def state(**kw: object) -> ClientState:
    return ClientState("app", **kw)  # type: ignore[arg-type]


# -- delivered ------------------------------------------------------------------------------


def test_delivered_appends_the_batch_and_moves_delivered():
    s = batches.delivered(state(acked=5, delivered=5), 9)
    assert (s.acked, s.delivered, s.batches) == (5, 9, (9,))
    s = batches.delivered(s, 12)
    assert (s.acked, s.delivered, s.batches) == (5, 12, (9, 12))


def test_delivered_keeps_the_other_fields():
    s = state(filter="a\\..*", acked=1, delivered=1, min_ts=7, min_scn=8, epoch=3)
    assert batches.delivered(s, 2) == ClientState("app", "a\\..*", 1, 2, (2,), 7, 8, 3)


@pytest.mark.parametrize("end", [4, 5])
def test_delivered_refuses_a_batch_that_does_not_end_after_delivered(end):
    with pytest.raises(ValueError, match="not after delivered 5"):
        batches.delivered(state(acked=2, delivered=5, batches=(5,)), end)


# -- acked ----------------------------------------------------------------------------------


def test_ack_of_the_oldest_batch_moves_acked_and_pops_it():
    s = state(acked=3, delivered=12, batches=(7, 10, 12))
    s = batches.acked(s, 7)
    assert (s.acked, s.delivered, s.batches) == (7, 12, (10, 12))
    s = batches.acked(s, 10)
    s = batches.acked(s, 12)
    assert (s.acked, s.delivered, s.batches) == (12, 12, ())


def _refused(s: ClientState, batch_id: int) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        batches.acked(s, batch_id)
    assert isinstance(info.value, RpcError)
    return info.value


@pytest.mark.parametrize("batch_id", [0, 1, 3])
def test_ack_of_an_already_acked_batch(batch_id):
    err = _refused(state(acked=3, delivered=7, batches=(7,)), batch_id)
    assert err.code == "already_acked"
    assert f"batch {batch_id} is already acked (acked up to 3)" in str(err)


def test_ack_of_the_last_acked_batch_again_is_already_acked():
    s = batches.acked(state(acked=0, delivered=4, batches=(4,)), 4)
    err = _refused(s, 4)
    assert err.code == "already_acked"


@pytest.mark.parametrize("batch_id", [4, 6, 8, 100])
def test_ack_of_an_unknown_batch(batch_id):
    err = _refused(state(acked=3, delivered=7, batches=(5, 7)), batch_id)
    assert err.code == "unknown_batch"
    assert f"batch {batch_id} is unknown to client 'app'" in str(err)


def test_ack_after_rollback_is_unknown():
    s = state(acked=3, delivered=7, batches=(5, 7)).rolled_back()
    assert _refused(s, 5).code == "unknown_batch"
    assert _refused(s, 7).code == "unknown_batch"


@pytest.mark.parametrize("batch_id", [7, 9])
def test_ack_out_of_order(batch_id):
    s = state(acked=3, delivered=9, batches=(5, 7, 9))
    err = _refused(s, batch_id)
    assert err.code == "out_of_order"
    assert f"batch {batch_id} is not the first unacked batch; ack 5 first" in str(err)
    # nothing changed: the first one can still be acked
    assert batches.acked(s, 5).batches == (7, 9)


def test_a_refused_ack_leaves_the_state_alone():
    s = state(acked=3, delivered=9, batches=(5, 9))
    for bad in (2, 6, 9):
        with pytest.raises(ProtocolError):
            batches.acked(s, bad)
    assert s == state(acked=3, delivered=9, batches=(5, 9))


# -- compile_filter -------------------------------------------------------------------------


def test_compile_filter_accepts_a_regex():
    assert batches.compile_filter(r"shop\..*").fullmatch("shop.users")


@pytest.mark.parametrize("pattern", ["(", "[a-", "*x", "a{2,1}"])
def test_compile_filter_rejects_a_bad_regex_with_bad_request(pattern):
    with pytest.raises(BadRequest) as info:
        batches.compile_filter(pattern)
    assert info.value.code == "bad_request"
    assert "is not a valid RE2 regular expression" in str(info.value)
    assert repr(pattern) in str(info.value)


def test_compile_filter_is_linear_time_and_bounded():
    # Python's re would try 2^200 ways here; RE2 answers at once.
    assert batches.compile_filter(r"(.|.)*Z").fullmatch("x" * 200) is None
    assert batches.compile_filter(r"(a|b)\.\w+").fullmatch("a.users")
    with pytest.raises(BadRequest, match="filter has 1001 characters; at most 1000"):
        batches.compile_filter("a" * 1001)
    with pytest.raises(BadRequest, match="RE2"):
        batches.compile_filter(r"(a)\1")  # backreferences need backtracking: refused with the reason


@pytest.mark.parametrize(("name", "problem"), [
    ("my-app", None), ("app.eu@host:1", None), ("é" * 128, None), ("my app/ü", None),
    ("", "must not be empty"), ("  ", "must not be empty"), ("x" * 129, "at most 128 characters, got 129"),
    ("tab\there", "no control characters"), ("nl\n", "no control characters"),
])
def test_client_names_are_checked(name, problem):
    from shared.clients import name_problem

    found = name_problem(name)
    assert (found is None) if problem is None else (problem in (found or "")), found


# -- wanted ---------------------------------------------------------------------------------

ANY = re.compile(".*")


def hdr(ts: int = 1000, scn: int = 500, **extra: str) -> dict[str, str]:
    return {"Binlake-Ts": str(ts), "Binlake-Scn": str(scn), **extra}


def test_wanted_takes_every_table_with_the_default_filter():
    assert batches.wanted(("shop", "users"), hdr(), state(), ANY)
    assert batches.wanted(("", "t"), hdr(), state(), ANY)


@pytest.mark.parametrize("table", ["heartbeat", "ddl", "anything"])
def test_wanted_never_takes_binlake_internal_subjects(table):
    assert not batches.wanted(("$binlake", table), hdr(), state(), ANY)
    assert not batches.wanted(("$binlake", table), hdr(), state(), re.compile(r"\$binlake\..*"))


def test_wanted_min_ts_drops_older_events_only():
    s = state(min_ts=2000)
    assert not batches.wanted(("a", "b"), hdr(ts=1999), s, ANY)
    assert batches.wanted(("a", "b"), hdr(ts=2000), s, ANY)
    assert batches.wanted(("a", "b"), hdr(ts=2001), s, ANY)
    assert not batches.wanted(("a", "b"), {"Binlake-Scn": "1"}, s, ANY)  # no ts: older than anything


def test_wanted_min_scn_drops_older_positions_only():
    s = state(min_scn=(1 << 32) | 400)
    assert not batches.wanted(("a", "b"), hdr(scn=(1 << 32) | 399), s, ANY)
    assert batches.wanted(("a", "b"), hdr(scn=(1 << 32) | 400), s, ANY)
    assert batches.wanted(("a", "b"), hdr(scn=(2 << 32) | 4), s, ANY)
    assert not batches.wanted(("a", "b"), hdr(scn=400), s, ANY)


def test_wanted_min_ts_and_min_scn_both_apply():
    s = state(min_ts=2000, min_scn=100)
    assert batches.wanted(("a", "b"), hdr(ts=2000, scn=100), s, ANY)
    assert not batches.wanted(("a", "b"), hdr(ts=1000, scn=100), s, ANY)
    assert not batches.wanted(("a", "b"), hdr(ts=2000, scn=99), s, ANY)


def test_wanted_zero_min_ts_and_min_scn_mean_no_limit():
    assert batches.wanted(("a", "b"), {}, state(), ANY)


def test_wanted_regex_must_match_the_whole_db_dot_table():
    p = re.compile(r"shop\.user")
    assert batches.wanted(("shop", "user"), hdr(), state(), p)
    assert not batches.wanted(("shop", "users"), hdr(), state(), p)  # prefix only
    assert not batches.wanted(("myshop", "user"), hdr(), state(), p)  # suffix only
    assert not batches.wanted(("xshop", "userx"), hdr(), state(), p)  # substring only


def test_wanted_regex_alternatives_and_real_names():
    p = re.compile(r"shop\.(users|orders)|audit\..*")
    assert batches.wanted(("shop", "users"), hdr(), state(), p)
    assert batches.wanted(("shop", "orders"), hdr(), state(), p)
    assert not batches.wanted(("shop", "items"), hdr(), state(), p)
    assert batches.wanted(("audit", "log"), hdr(), state(), p)
    # names are the real (unescaped) ones: a dot in a db name is a literal dot
    assert batches.wanted(("my.db", "t t"), hdr(), state(), re.compile(r"my\.db\.t t"))


# -- ClientState ----------------------------------------------------------------------------


def test_rolled_back_forgets_unacked_batches_and_keeps_the_rest():
    s = ClientState("app", "x\\..*", 10, 25, (15, 20, 25), 1000, 77, 4)
    r = s.rolled_back()
    assert r == ClientState("app", "x\\..*", 10, 10, (), 1000, 77, 5)


def test_rolled_back_without_unacked_batches_only_bumps_the_epoch():
    s = ClientState("app", acked=10, delivered=10)
    assert s.rolled_back() == ClientState("app", acked=10, delivered=10, epoch=1)


def test_rewound_moves_both_cursors_and_sets_the_limits():
    s = ClientState("app", "f", 10, 25, (15, 25), 5, 6, 2)
    r = s.rewound(3, stream="s1", min_ts=1234)
    assert r == ClientState("app", "f", 3, 3, (), 1234, 0, 3, "s1")
    r = s.rewound(40, stream="s1", min_scn=99)
    assert r == ClientState("app", "f", 40, 40, (), 0, 99, 3, "s1")


def test_to_dict_from_dict_round_trip():
    s = ClientState("app", r"shop\..*", 10, 25, (15, 20, 25), 1000, 77, 4, "s1")
    d = s.to_dict()
    assert d == {"client": "app", "filter": r"shop\..*", "acked": 10, "delivered": 25, "batches": [15, 20, 25],
                 "min_ts": 1000, "min_scn": 77, "epoch": 4, "stream_id": "s1", "seq": 10}
    assert ClientState.from_dict(d) == s
    assert ClientState.from_dict(ClientState("x").to_dict()) == ClientState("x")


def test_to_dict_survives_json_and_msgpack():
    import json

    import msgpack

    s = ClientState("app", ".*", 1, 3, (2, 3), 0, (7 << 32) | 123, 1)
    assert ClientState.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert ClientState.from_dict(msgpack.unpackb(msgpack.packb(s.to_dict()), raw=False)) == s


def test_from_dict_defaults_and_coercion():
    assert ClientState.from_dict({"client": "c"}) == ClientState("c", ".*", 0, 0, (), 0, 0, 0)
    s = ClientState.from_dict({"client": "c", "acked": "4", "delivered": "9", "batches": ["6", 9], "epoch": "2"})
    assert (s.acked, s.delivered, s.batches, s.epoch) == (4, 9, (6, 9), 2)


def test_seq_in_the_dict_is_the_acked_position():
    """meta's monotonic cursor check orders client cursors by `seq`."""
    assert ClientState("c", acked=42, delivered=50, batches=(50,)).to_dict()["seq"] == 42


def test_client_key_is_kv_safe():
    assert keys.client_cursor("main", "loader") == "client.main.loader"
    key = keys.client_cursor("main", "my app/ü*>")
    assert re.fullmatch(r"[A-Za-z0-9_=.-]+", key)


def test_client_key_is_injective():
    names = ["a.b", "a_b", "a b", "a*b"]
    assert len({keys.client_cursor("main", n) for n in names}) == len(names)


def test_a_transaction_is_open_until_it_has_as_many_messages_as_its_last_says():
    from services.store.batches import OpenTxns

    o = OpenTxns()
    o.add(("t1", 2, True))  # its last message first (another partition was faster)
    assert o
    o.add(None)  # a heartbeat: its own transaction
    o.add(("t2", 0, True))  # a whole one-message transaction in between
    assert set(o.seen) == {"t1"}
    o.add(("t1", 0, False))
    o.add(("t1", 1, False))  # e.g. the sink's marker for a message its rules dropped
    assert not o and o.seen == {} and o.expected == {}
    carried = OpenTxns()
    carried.add(("t3", 0, False))
    later = carried.copy()
    later.add(("t3", 1, True))
    assert carried and not later

"""services.meta.rewind.gtid_set_member: which transactions a client already has, by GTID."""

from __future__ import annotations

import pytest

from services.meta.rewind import gtid_set_member
from shared.rpc import BadRequest

U = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


def test_mysql_sets_with_tags():
    has = gtid_set_member(f"{U}:1-10:20:etl:1-3")
    assert has(f"{U}:10") and has(f"{U}:20") and has(f"{U}:etl:3")
    assert not has(f"{U}:11") and not has(f"{U}:etl:4") and not has("4e11fa47-71ca-11e1-9e33-c80aa9429562:1")


def test_mariadb_states_per_domain():
    has = gtid_set_member("0-1-100, 1-2-7")
    assert has("0-1-100") and has("0-5-3") and has("1-9-7")
    assert not has("0-1-101") and not has("2-1-1")


@pytest.mark.parametrize(("text", "txn"), [("nonsense", f"{U}:1"), (f"{U}:1-5", "binlog.000001:1234"),
                                           ("0-1-5", f"{U}:3"), ("0-1-5", "binlog.000001:1234")])
def test_what_cannot_be_compared_is_a_bad_request(text, txn):
    with pytest.raises(BadRequest):
        gtid_set_member(text)(txn)

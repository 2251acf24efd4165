"""services.parser.failover: where a parser continues when the source is another server."""

from __future__ import annotations

import pytest

from services.parser.failover import SourceSwitched, other_history, resume_on
from services.parser.transactions import Resume
from shared import envelope

LAST = Resume("mysql-bin.000007", 1234, "0-1-120", server=1, epoch=0)


def test_the_same_server_goes_on_where_it_stopped():
    assert resume_on(LAST, 1, True, "0-1-130") == LAST


def test_a_position_from_before_servers_were_recorded_is_taken_as_this_servers():
    old = Resume("mysql-bin.000007", 1234, "0-1-120")
    assert resume_on(old, 5, True, "0-1-130") == Resume("mysql-bin.000007", 1234, "0-1-120", 5, 0)


def test_another_server_with_every_published_transaction_continues_by_gtid_in_the_next_epoch():
    moved = resume_on(LAST, 2, True, "0-1-120,1-2-7")
    # still the old server's position (found on the new one by GTID) until a transaction commits there
    assert moved == Resume("mysql-bin.000007", 1234, "0-1-120", 1, 1)
    # Its order keys come after every key of the first server, whatever its binlog numbers.
    assert envelope.scn("mysql-bin.000001", 4, moved.epoch) > envelope.scn("mysql-bin.999999", 2**32 - 1, 0)


@pytest.mark.parametrize(("server_gtid", "mariadb", "last", "match"), [
    ("0-1-119", True, LAST, "lacks transactions binlake already published"),
    ("", True, LAST, "lacks transactions"),
    ("0-1-200", False, Resume("binlog.000007", 1234, None, server=1), "no GTID"),
    ("0-1-200", True, Resume("mysql-bin.000007", 1234, None, server=1), "no GTID"),
    ("0-1-200", True, Resume("mysql-bin.000007", 1234, "0-1-120", 1, envelope.MAX_EPOCH), "the most"),
])
def test_a_switch_that_would_lose_changes_is_refused(server_gtid, mariadb, last, match):
    with pytest.raises(SourceSwitched, match=match):
        resume_on(last, 2, mariadb, server_gtid)


def test_a_switch_inside_a_partly_published_transaction_is_refused():
    with pytest.raises(SourceSwitched, match="ends inside transaction 0-1-121"):
        resume_on(LAST, 2, True, "0-1-130", unfinished="0-1-121")
    assert resume_on(LAST, 1, True, "0-1-130", unfinished="0-1-121") == LAST  # the same server finishes it


def test_the_order_key_refuses_what_it_cannot_hold():
    with pytest.raises(envelope.EnvelopeError):
        envelope.scn("mysql-bin.000001", 4, envelope.MAX_EPOCH + 1)
    with pytest.raises(envelope.EnvelopeError):
        envelope.scn("mysql-bin.16777216", 4)
    assert envelope.scn("mysql-bin.000042", 7) == 42 << 32 | 7  # epoch 0: the keys of before


U1, U2 = "3e11fa47-71ca-11e1-9e33-c80aa9429562", "4e11fa47-71ca-11e1-9e33-c80aa9429562"
MYSQL_LAST = Resume("binlog.000007", 1234, f"{U1}:1-120:etl:1-3", server=1, epoch=0)


def test_mysql_moves_to_a_server_that_executed_the_published_set():
    moved = resume_on(MYSQL_LAST, 2, False, f"{U1}:1-130:etl:1-5,{U2}:1-4")
    assert moved == Resume("binlog.000007", 1234, f"{U1}:1-120:etl:1-3", 1, 1)


@pytest.mark.parametrize(("server_gtid", "missing"), [
    (f"{U1}:1-119:etl:1-3", f"{U1}:120"),
    (f"{U1}:1-130", f"{U1}:etl:1-3"),
    (f"{U2}:1-500", f"{U1}:1-120:etl:1-3"),
    ("", f"{U1}:1-120:etl:1-3"),
    (f"{U1}:1-50:60-130:etl:1-3", f"{U1}:51-59"),
])
def test_mysql_refuses_a_server_that_lacks_published_transactions(server_gtid, missing):
    with pytest.raises(SourceSwitched, match="lacks transactions") as err:
        resume_on(MYSQL_LAST, 2, False, server_gtid)
    assert missing in str(err.value)


@pytest.mark.parametrize(("there", "moved"), [
    ("0-1-120", False),  # the same binlog: the state binlake recorded at that position
    ("0-1-120,1-5-9", False),  # a domain binlake never saw in its stream changes nothing
    (None, True),  # no such file, or no event boundary at that offset
    ("0-1-97", True),  # another history reaches that offset
    ("", True),
])
def test_a_server_with_the_same_server_id_is_another_when_its_binlog_differs_at_the_position(there, moved):
    assert other_history(LAST, True, there) is moved


def test_only_a_mariadb_position_with_a_gtid_state_can_be_checked():
    assert not other_history(LAST, False, None)
    assert not other_history(Resume("mysql-bin.000007", 1234, None, server=1), True, None)


def test_another_server_with_the_same_server_id_continues_by_gtid_in_the_next_epoch():
    assert resume_on(LAST, 1, True, "0-1-130", moved=True) == Resume("mysql-bin.000007", 1234, "0-1-120", 1, 1)
    with pytest.raises(SourceSwitched, match=r"another server with server_id 1 .* lacks transactions"):
        resume_on(LAST, 1, True, "0-1-100", moved=True)


def test_mysql_tells_servers_with_the_same_server_id_apart_by_server_uuid():
    last = Resume("binlog.000007", 1234, f"{U1}:1-120", server=1, uuid=U1)
    assert not other_history(last, False, None, U1)
    assert other_history(last, False, None, U2)
    assert not other_history(Resume("binlog.000007", 1234, f"{U1}:1-120", server=1), False, None, U2)  # unrecorded
    moved = resume_on(last, 1, False, f"{U1}:1-130", moved=True)
    assert moved == Resume("binlog.000007", 1234, f"{U1}:1-120", 1, 1, U1)
    assert Resume.from_dict(moved.to_dict()) == moved

"""MemberClock: who is alive, judged against this worker's own renewals as the watcher shows them."""

from __future__ import annotations

from services.sink.membership import MemberClock


def test_a_member_whose_renewals_stop_for_a_ttl_is_dead() -> None:
    c = MemberClock("me", ttl_s=15)
    c.renewed("me", 0)
    c.renewed("other", 0)
    assert c.alive() == {"me", "other"}
    c.renewed("me", 10)
    assert c.alive() == {"me", "other"}
    c.renewed("me", 16)
    assert c.alive() == {"me"}
    c.renewed("other", 17)
    assert c.alive() == {"me", "other"}


def test_a_stalled_bus_ages_nobody() -> None:
    """No renewals arrive at all (a leader election): the view stays as it was, however long."""
    c = MemberClock("me", ttl_s=15)
    c.renewed("me", 0)
    c.renewed("other", 1)
    assert c.alive() == {"me", "other"}  # nothing new for a minute: still both


def test_a_member_that_leaves_is_gone_at_once() -> None:
    c = MemberClock("me", ttl_s=15)
    c.renewed("me", 0)
    c.renewed("other", 0)
    c.left("other")
    assert c.alive() == {"me"}


def test_before_our_own_first_renewal_shows_everyone_known_counts() -> None:
    c = MemberClock("me", ttl_s=15)
    c.renewed("other", 0)
    assert c.alive() == {"me", "other"}

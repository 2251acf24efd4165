"""A service that could not answer for a moment is retried like any bus error; a refusal is not."""

from __future__ import annotations

import pytest

from shared import rpc
from shared.rpc import BadRequest, RpcError
from shared.subjects import subject_matches


def test_unavailable_is_retriable_and_refusals_are_not() -> None:
    assert RpcError("unavailable", "no answer on binlake.meta.cursor.get within 5.0s").retriable
    assert not RpcError("retention_gap", "gone").retriable
    assert not RpcError("failed", "boom").retriable
    assert not BadRequest("max_rows must be 1..100").retriable


@pytest.mark.parametrize(("pattern", "subject", "matches"), [
    ("binlake.store.main.get.*", "binlake.store.main.get.app1", True),
    ("binlake.store.main.get.*", "$KV.binlake_leases.loader.x.app1", False),  # a JetStream relay
    ("binlake.meta.cursor.put", "binlake.meta.cursor.put", True),
    ("binlake.meta.cursor.put", "$KV.binlake_leases.loader.x", False),
    ("binlake.meta.>", "binlake.meta.a.b", True),
    ("binlake.meta.>", "binlake.meta", False),
])
def test_requests_count_only_on_the_served_subject(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


@pytest.mark.parametrize(("reply", "answered"), [
    ("_INBOX.abc.def", True), ("_INBOX_app1.abc", True), ("_INBOX_my%20app.x", True),
    ("binlake.raw.main.shop.t", False), ("$KV.binlake_cursors.sink.main.p0", False),
    ("_INBOXfoo.x", False), ("_INBOX", False), ("_INBOX.>", False),
])
def test_answers_go_only_into_inboxes(reply: str, answered: bool) -> None:
    assert bool(rpc.INBOX.fullmatch(reply)) is answered

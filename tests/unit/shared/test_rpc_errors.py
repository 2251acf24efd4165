"""A service that could not answer for a moment is retried like any bus error; a refusal is not."""

from __future__ import annotations

from shared.rpc import BadRequest, RpcError


def test_unavailable_is_retriable_and_refusals_are_not() -> None:
    assert RpcError("unavailable", "no answer on binlake.meta.cursor.get within 5.0s").retriable
    assert not RpcError("retention_gap", "gone").retriable
    assert not RpcError("failed", "boom").retriable
    assert not BadRequest("max_rows must be 1..100").retriable

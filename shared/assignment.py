"""Pure: which raw partitions a sink worker owns, given the live members."""

from __future__ import annotations

from collections.abc import Iterable


def owned(members: Iterable[str], me: str, partitions: int) -> frozenset[int]:
    """Round-robin over the sorted member names: balanced, and the same on every worker."""
    ordered = sorted(set(members) | {me})
    return frozenset(p for p in range(partitions) if ordered[p % len(ordered)] == me)

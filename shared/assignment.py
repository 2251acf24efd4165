"""Pure: which raw partitions a sink worker owns, given the live members and the partitions' tables."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shared.subjects import Names


def owned(members: Iterable[str], me: str, partitions: int, tables: Mapping[int, int] | None = None) -> frozenset[int]:
    """The partitions `me` runs; every worker computes the same split from the same inputs.

    Tables are what a partition's load is made of, so they are spread first: partitions with
    tables go, most tables first, each to the member with the fewest tables so far. The empty
    ones then go to the member with the fewest partitions. Without `tables` this is round-robin
    over the sorted member names.
    """
    ordered = sorted(set(members) | {me})
    weight = tables or {}
    load = dict.fromkeys(ordered, 0)
    count = dict.fromkeys(ordered, 0)
    mine = set()
    for p in sorted(range(partitions), key=lambda p: (-weight.get(p, 0), p)):
        w = weight.get(p, 0)
        if w > 0:
            owner = min(ordered, key=lambda m: (load[m], count[m], m))
        else:
            owner = min(ordered, key=lambda m: (count[m], load[m], m))
        load[owner] += w
        count[owner] += 1
        if owner == me:
            mine.add(p)
    return frozenset(mine)


def tables_per_partition(names: Names, source: str, subjects: Iterable[str]) -> dict[int, int]:
    """Tables of `source` per partition, from BINLAKE_RAW's stored subjects."""
    out: dict[int, int] = {}
    for subject in subjects:
        try:
            src, part, _, _ = names.parse_raw_stored(subject)
        except ValueError:
            continue
        if src == source:
            out[part] = out.get(part, 0) + 1
    return out

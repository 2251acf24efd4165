"""shared.assignment.owned: every partition has exactly one owner, balanced, deterministic."""

from __future__ import annotations

import itertools
import random

import pytest

from shared.assignment import owned


def assignment(members: list[str], partitions: int) -> dict[str, frozenset[int]]:
    return {m: owned(members, m, partitions) for m in set(members)}


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 16, 17, 64])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 20])
def test_every_partition_owned_exactly_once_and_balanced(n, partitions):
    members = [f"main.sink-{i}" for i in range(n)]
    parts = assignment(members, partitions)
    all_owned = [p for ps in parts.values() for p in ps]
    assert sorted(all_owned) == list(range(partitions))  # each exactly once, none missing
    sizes = [len(ps) for ps in parts.values()]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == partitions


def test_deterministic_regardless_of_input_order_and_duplicates():
    members = ["c", "a", "b", "d", "e"]
    expected = {m: owned(members, m, 16) for m in members}
    rng = random.Random(7)
    for _ in range(50):
        shuffled = members[:] + rng.sample(members, 2)  # duplicates do not count twice
        rng.shuffle(shuffled)
        for m in members:
            assert owned(shuffled, m, 16) == expected[m]
        assert owned(iter(shuffled), "a", 16) == expected["a"]  # any iterable, consumed once
        assert owned(frozenset(shuffled), "a", 16) == expected["a"]


def test_me_is_always_a_member():
    # A worker that does not see itself yet (its membership not written or expired) still counts itself,
    # so it computes the same assignment as the peers that do see it.
    members = ["a", "b", "c"]
    for me in members:
        others = [m for m in members if m != me]
        assert owned(others, me, 16) == owned(members, me, 16)
    assert owned([], "solo", 8) == frozenset(range(8))
    assert owned(["solo"], "solo", 8) == frozenset(range(8))


def test_a_worker_not_in_the_view_takes_a_share():
    assert len(owned(["a", "b", "c"], "d", 16)) == 4  # four members, 16 partitions


def test_zero_partitions():
    assert owned(["a", "b"], "a", 0) == frozenset()


def test_more_members_than_partitions_leaves_some_idle():
    members = [f"m{i}" for i in range(5)]
    parts = assignment(members, 3)
    assert sorted(len(p) for p in parts.values()) == [0, 0, 1, 1, 1]


@pytest.mark.parametrize("before,after", [(["a", "b"], ["a", "b", "c"]), (["a", "b", "c"], ["a", "c"])])
def test_membership_changes_keep_the_invariants(before, after):
    for members in (before, after):
        parts = assignment(members, 16)
        assert sorted(itertools.chain.from_iterable(parts.values())) == list(range(16))


def test_without_tables_it_is_round_robin_by_name():
    members = ["b", "a", "c"]
    for i, m in enumerate(sorted(members)):
        assert owned(members, m, 16) == frozenset(p for p in range(16) if p % 3 == i)
        assert owned(members, m, 16, {}) == owned(members, m, 16)


def test_tables_are_spread_before_partitions():
    # Round-robin would give "a" the even partitions: all six tables.
    tables = {0: 2, 2: 2, 4: 1, 6: 1}
    a, b = owned(["a", "b"], "a", 16, tables), owned(["a", "b"], "b", 16, tables)
    assert a | b == frozenset(range(16)) and not a & b
    assert sum(tables.get(p, 0) for p in a) == sum(tables.get(p, 0) for p in b) == 3
    assert abs(len(a) - len(b)) <= 2  # the empty partitions still alternate


@pytest.mark.parametrize("seed", range(20))
def test_tables_balance_within_the_largest_partition(seed):
    rng = random.Random(seed)
    members = [f"m{i}" for i in range(rng.randint(1, 6))]
    tables = {p: rng.choice([0, 0, 1, 1, 2, 5]) for p in range(32)}
    parts = {m: owned(members, m, 32, tables) for m in members}
    assert sorted(itertools.chain.from_iterable(parts.values())) == list(range(32))
    loads = [sum(tables[p] for p in ps) for ps in parts.values()]
    assert max(loads) - min(loads) <= max(tables.values())  # greedy, heaviest first


def test_tables_per_partition_counts_one_source_from_stored_subjects():
    from shared.assignment import tables_per_partition
    from shared.subjects import Names

    names = Names("binlake")
    subjects = [names.raw_stored("main", "shop", t, 16) for t in ("a", "b", "c", "d")]
    subjects += [names.raw_stored("other", "shop", "a", 16), "binlake.raw.main._binlake.ddl", "junk"]
    counts = tables_per_partition(names, "main", subjects)
    assert sum(counts.values()) == 4
    for t in ("a", "b", "c", "d"):
        part = names.parse_raw_stored(names.raw_stored("main", "shop", t, 16))[1]
        assert counts[part] >= 1

"""shared.patterns: table patterns from outside a process match in linear time (RE2)."""

from __future__ import annotations

import pytest

from shared import snapshots
from shared.patterns import MAX_PATTERN, PatternError, compile_pattern


def test_a_backtracking_pattern_cannot_hold_the_matcher() -> None:
    # With Python's re this takes 2^40 steps; RE2 answers at once (a hang would hit the test timeout).
    assert not snapshots.matches([r"(a+)+$x"], "shop", "a" * 40)
    assert not compile_pattern(r"(.|.)*Z").fullmatch("x" * 10_000)


def test_snapshot_patterns_match_names_and_literal_names() -> None:
    assert snapshots.matches([r"shop\.(orders|items)"], "shop", "items")
    assert snapshots.matches(["shop.orders"], "shop", "orders")
    assert snapshots.matches(["odd(name.t"], "odd(name", "t")  # a literal name needs no escaping
    assert not snapshots.matches([r"shop\.orders"], "shop", "orders2")


@pytest.mark.parametrize(("pattern", "message"), [
    (r"(a)\1", "is not a valid RE2 regular expression"),  # backreferences: not RE2
    (r"(?=a)a", "is not a valid RE2 regular expression"),  # lookahead: not RE2
    ("[a-", "missing ]"),
    ("x" * (MAX_PATTERN + 1), f"at most {MAX_PATTERN}"),
])
def test_what_re2_refuses_is_named(pattern: str, message: str) -> None:
    with pytest.raises(PatternError) as info:
        compile_pattern(pattern)
    assert message in str(info.value)
    with pytest.raises(ValueError):
        snapshots.matches([pattern], "shop", "t")


def test_a_lone_surrogate_is_a_pattern_error() -> None:
    with pytest.raises(PatternError):
        compile_pattern("\ud800")

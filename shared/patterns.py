"""Regular expressions over `db.table` names that come from outside a process: RE2, linear time.

Python's `re` backtracks: a pattern like `(a+)+$` or `(.|.)*Z` against a long name holds the
event loop of whoever matches it. A store client's filter, a snapshot request (which any user
that may file one writes) and `BINLAKE_SNAPSHOT_TABLES` are therefore compiled here, with
RE2's syntax (no backreferences or lookaround) and a bounded memory.
"""

from __future__ import annotations

import functools
from typing import Protocol

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the error goes back to whoever gave the pattern, not to stderr
_OPTIONS.max_mem = 8 << 20
MAX_PATTERN = 1000  # characters


class Pattern(Protocol):
    def fullmatch(self, text: str) -> object | None: ...


class PatternError(ValueError):
    """Not a pattern RE2 takes; the message says why."""


def compile_pattern(pattern: str) -> Pattern:
    """`pattern` compiled by RE2, or PatternError naming the problem."""
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"pattern has {len(pattern)} characters; at most {MAX_PATTERN}")
    try:
        compiled: Pattern = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(f"{pattern!r} is not a valid RE2 regular expression: {reason}") from None
    except UnicodeError:  # a lone surrogate (JSON can carry one) is no UTF-8
        raise PatternError(f"{pattern!r} is not valid Unicode text") from None
    return compiled


@functools.lru_cache(maxsize=256)
def cached(pattern: str) -> Pattern:
    """compile_pattern, remembered: the same few patterns are matched against every table."""
    return compile_pattern(pattern)

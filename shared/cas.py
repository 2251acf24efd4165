"""Read, compare-and-set, retry: the one loop for every read-modify-write of shared state.

Two shapes of it:
- `retry_on_conflict`: a whole read-compute-write attempt (the store's client state, a
  rewind) is run again when its compare-and-set loses against a concurrent writer.
- `write_forward`: a position (the parser's, a sink partition's) is written over the
  revision last seen; on a conflict the stored value is read, and the write is dropped
  when that value is already at or past ours (a position never moves back).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import nats.js.errors
from nats.js.kv import KeyValue

from shared.errors import NatsUnavailable
from shared.jetstream import nats_errors
from shared.rpc import RpcError

T = TypeVar("T")


async def retry_on_conflict(attempt: Callable[[], Awaitable[T]], *,
                            conflict: type[Exception] | tuple[type[Exception], ...], tries: int, what: str,
                            on_conflict: Callable[[], Awaitable[None]] | None = None) -> T:
    """`attempt()` until it does not raise `conflict`; RpcError `conflict` naming `what` after `tries` losses."""
    for _ in range(tries):
        try:
            return await attempt()
        except conflict:
            if on_conflict is not None:
                await on_conflict()
    raise RpcError("conflict", f"{what} keeps changing concurrently; try again")


@dataclass(frozen=True)
class Written:
    revision: int | None  # the key's revision as this writer now knows it
    stored: bool  # False: a concurrent writer was already at or past this value; nothing was written


async def write_forward(kv: KeyValue, key: str, value: bytes, revision: int | None,
                        at_or_past: Callable[[bytes], bool], tries: int = 3) -> Written:
    """Create (`revision` None) or update `key` by compare-and-set, never over a value that is further on.

    `at_or_past(stored)` says whether the stored value already is where `value` would take it."""
    with nats_errors(f"cursor {key}"):
        for _ in range(tries):
            try:
                if revision is None:
                    return Written(await kv.create(key, value), True)
                return Written(await kv.update(key, value, last=revision), True)
            except nats.js.errors.KeyWrongLastSequenceError:
                entry = await kv.get(key)
                revision = entry.revision
                if at_or_past(entry.value or b""):
                    return Written(revision, False)
    raise NatsUnavailable(f"cursor {key} kept changing under concurrent writers")

"""What keeps a service from doing its work right now, for `/healthz` (`shared.service.runtime`)."""

from __future__ import annotations

import math
import time

from shared.errors import StoreFull
from shared.jetstream import store_full

STORE_FULL = "store_full"
"""JetStream refused a publish for want of room (`shared.jetstream.store_full`)."""


class Conditions:
    """Named conditions, each with the reason an operator reads; `problem()` is None when there are none.

    The actor that meets a condition sets it, and clears it once its work goes on (a publish
    acknowledged again): the reason stays as long as the condition does, also between retries.
    One that nothing may clear (a request that failed, then no more requests) is set with a
    `ttl_s`: it ends then unless set again."""

    def __init__(self) -> None:
        self._now: dict[str, tuple[str, float]] = {}

    def set(self, name: str, reason: str, *, ttl_s: float | None = None) -> None:
        self._now[name] = (reason, math.inf if ttl_s is None else time.monotonic() + ttl_s)

    def clear(self, name: str) -> None:
        self._now.pop(name, None)

    def problem(self) -> str | None:
        now = time.monotonic()
        for name in [n for n, (_, until) in self._now.items() if until <= now]:
            del self._now[name]
        return "; ".join(reason for reason, _ in self._now.values()) or None

    def no_room(self, exc: BaseException, stream: str, what: str) -> StoreFull | None:
        """The StoreFull to raise when JetStream refused `what` for want of room, reported until
        `room()`; None for any other error."""
        full = store_full(exc, stream, what)
        if full is not None:
            self.set(STORE_FULL, str(full))
        return full

    def room(self) -> None:
        """A write was stored: JetStream has room (again)."""
        self.clear(STORE_FULL)

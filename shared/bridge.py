"""A bounded hand-over from a blocking thread to the event loop, in batches.

`asyncio.run_coroutine_threadsafe(queue.put(x))` costs a loop round-trip per item; the binlog
thread produces tens of thousands of items a second, so it appends to a deque under a lock
and wakes the loop only when the consumer sleeps. A full bridge blocks the producing thread,
which is how backpressure from JetStream reaches the binlog connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class BridgeClosed(Exception):
    """The consumer went away; the producing thread should stop."""


class ThreadBridge(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop, max_items: int = 10_000, *, max_bytes: int | None = None,
                 size: Callable[[T], int] | None = None) -> None:
        """At most `max_items` items and, with `size`, `max_bytes` bytes (a put into an empty bridge always fits)."""
        self._loop = loop
        self._max = max_items
        self._max_bytes = max_bytes
        self._size = size
        self._bytes = 0
        self._cond = threading.Condition()
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: BaseException | None = None
        self._cancelled = False

    # -- producer (thread) side -------------------------------------------------------------

    def put_many(self, items: Iterable[T]) -> None:
        """Append items; blocks while the bridge is full. Raises BridgeClosed once cancelled."""
        if self._size is not None and not isinstance(items, list):
            items = list(items)
        added = sum(map(self._size, items)) if self._size is not None else 0
        with self._cond:
            while (len(self._items) >= self._max or self._full()) and not self._cancelled:
                self._cond.wait(0.5)
            if self._cancelled:
                raise BridgeClosed
            self._items.extend(items)
            self._bytes += added
            wake = self._waiter is not None
        if wake:
            self._loop.call_soon_threadsafe(self._wake)

    def finish(self, error: BaseException | None = None) -> None:
        """The producer is done; `error` is raised to the consumer after the queued items."""
        with self._cond:
            self._done = True
            self._error = error
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # loop already closed
            pass

    def _full(self) -> bool:
        return self._max_bytes is not None and self._bytes >= self._max_bytes and bool(self._items)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    # -- consumer (loop) side ---------------------------------------------------------------

    async def get(self) -> list[T]:
        """Every queued item (at least one); raises the producer's error or EOFError when done."""
        while True:
            with self._cond:
                if self._items:
                    batch = list(self._items)
                    self._items.clear()
                    self._bytes = 0
                    self._cond.notify_all()
                    return batch
                if self._done:
                    if self._error is not None:
                        raise self._error
                    raise EOFError("producer finished")
                self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def get_nowait(self) -> list[T]:
        """Every queued item, possibly none (never raises the producer's error)."""
        with self._cond:
            if not self._items:
                return []
            batch = list(self._items)
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
            return batch

    def cancel(self) -> None:
        """Tell the producer to stop at its next put."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

"""ReadAhead: the next batch from the store, decoded and in Arrow, while the lake writes the one before.

Decoding envelopes and building Arrow is Python (it holds the GIL); writing the lake is
mostly the JVM (py4j waits with the GIL released). So the loader keeps one `get` in flight
and prepares what it returns in a worker thread while Spark writes the unit before: the
two halves overlap instead of adding up. Batches still come back one at a time and in the
store's order, and nothing is acked here: a crash redelivers from the last ack.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.loader import frames
from shared import envelope
from shared.store_client import Batch, StoreClient


@dataclass(frozen=True)
class Fetched:
    batch: Batch
    prepared: frames.Prepared  # empty for an empty batch


def decode(batch: Batch, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """(CDC sequence, envelope) of every message after sequence `after` (what the lake already holds)."""
    return [(seq, envelope.as_dict(envelope.decode(raw)))
            for seq, raw in zip(batch.seqs, batch.raw, strict=True) if seq > after]


class ReadAhead:
    def __init__(self, client: StoreClient, max_rows: int, max_wait_s: float, committed: Callable[[], int], *,
                 max_bytes: int | None = None) -> None:
        self._client = client
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._max_wait_s = max_wait_s
        self._committed = committed
        self._next: asyncio.Task[Fetched] | None = None

    async def next(self) -> Fetched:
        """The next batch (empty when none came within the wait); the one after is fetched meanwhile."""
        if self._next is None:
            self._next = asyncio.create_task(self._fetch())
        fetched = await self._next
        self._next = asyncio.create_task(self._fetch())
        return fetched

    async def close(self) -> None:
        if self._next is not None:
            self._next.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._next
            self._next = None

    async def _fetch(self) -> Fetched:
        batch = await self._client.get(self._max_rows, self._max_wait_s, self._max_bytes)
        if batch.id is None:
            return Fetched(batch, frames.Prepared([], {}))
        after = self._committed()
        prepared = await asyncio.get_running_loop().run_in_executor(
            None, lambda: frames.prepare(decode(batch, after)))
        return Fetched(batch, prepared)

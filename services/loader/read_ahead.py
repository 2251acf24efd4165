"""ReadAhead: the next batch from the store, decoded and in Arrow, while the lake writes the one before.

Decoding envelopes and building Arrow is Python (it holds the GIL); writing the lake is
mostly the JVM (py4j waits with the GIL released). So the loader keeps one `get` in flight
and prepares what it returns in a worker thread while Spark writes the unit before: the
two halves overlap instead of adding up. Batches still come back one at a time and in the
store's order, and nothing is acked here: a crash redelivers from the last ack.

Behind the store (a backlog after an outage, a deploy or a first start), batches grow: each
batch the store says is `full` (it ended at a limit, the store's own included, not at the wait)
doubles the rows asked for next, up to `catch_up_rows`; the first batch that is not full brings
it back to `max_rows`. Fewer, larger lake commits while behind; small, fresh ones once caught up.
Memory stays bounded by `max_bytes` per batch either way.

Lake sequences are CDC sequences plus the base the lake gave the batch's BINLAKE_CDC
(`Lake.bases`); a batch of a stream the lake has not seen comes unprepared, and the loader
has the lake adopt the stream first. Nothing is left out here by sequence: each lake table's own
marker says which changes it holds (`Lake.apply`), so a batch redelivered after a crash, or
delivered again after `binlake rewind`, adds exactly what each table lacks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.loader import frames
from shared import envelope
from shared.store_client import Batch, StoreClient


@dataclass(frozen=True)
class Fetched:
    batch: Batch
    prepared: frames.Prepared | None  # empty for an empty batch; None: its stream is new to the lake
    base: int = 0  # what the batch's CDC sequences add up to lake sequences

    @property
    def end(self) -> int:
        """The lake sequence the batch ends at."""
        assert self.batch.id is not None
        return self.base + self.batch.id


def decode(batch: Batch, base: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """(lake sequence, envelope) of every message."""
    return [(base + seq, envelope.as_dict(envelope.decode(raw)))
            for seq, raw in zip(batch.seqs, batch.raw, strict=True)]


class ReadAhead:
    def __init__(self, client: StoreClient, max_rows: int, max_wait_s: float, bases: Mapping[str, int], *,
                 max_bytes: int | None = None, catch_up_rows: int | None = None) -> None:
        self._client = client
        self._max_rows = max_rows
        self._catch_up_rows = max(max_rows, catch_up_rows or max_rows)
        self.asking = max_rows  # rows the next get asks for
        self.behind = False  # the last batch came back full: more was waiting
        self._max_bytes = max_bytes
        self._max_wait_s = max_wait_s
        self._bases = bases
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
        asked = self.asking
        batch = await self._client.get(asked, self._max_wait_s, self._max_bytes)
        self.behind = batch.full
        self.asking = min(2 * asked, self._catch_up_rows) if self.behind else self._max_rows
        if batch.id is None:
            return Fetched(batch, frames.Prepared([], {}))
        base = self._bases.get(batch.stream)
        if base is None:
            return Fetched(batch, None)
        return await self.prepare(batch, base)

    async def prepare(self, batch: Batch, base: int) -> Fetched:
        """`batch` decoded, its sequences `base` on."""
        prepared = await asyncio.get_running_loop().run_in_executor(None, lambda: frames.prepare(decode(batch, base)))
        return Fetched(batch, prepared, base)

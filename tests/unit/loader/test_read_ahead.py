"""services.loader.read_ahead: one `get` in flight, batches in the store's order, prepared off the event loop.

The store is a stand-in here (pure scheduling logic); the real store and loader run it in
tests/integration/test_loader.py, kills included.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

import pytest

from services.loader import frames
from services.loader.read_ahead import Fetched, ReadAhead
from shared import envelope
from shared.store_client import Batch

SCHEMA = {"id": "s1", "columns": [{"name": "id", "type": "int", "nullable": False}]}


def ins(key: int) -> dict[str, Any]:
    return {"v": envelope.VERSION, "source": "main", "db": "d", "table": "t", "op": "i", "ts": 1,
            "pos": {"file": "mysql-bin.000001", "offset": 4, "gtid": "0-1-1"}, "scn": 1 << 32 | key,
            "txn": {"id": "x", "i": 0, "last": True}, "pk": ["id"], "rows": [{"after": {"id": key}}]}


class Store:
    """Hands out the given batches in order, then empty ones; counts the gets in flight."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = batches
        self.in_flight = 0
        self.most_in_flight = 0
        self.gets = 0

    async def get(self, max_rows: int = 1000, max_wait: float = 1.0, max_bytes: int | None = None) -> Batch:
        self.gets += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            return self.batches.pop(0) if self.batches else Batch(None, [], 0, [])
        finally:
            self.in_flight -= 1


def batch(*seqs: int) -> Batch:
    raw = [envelope.encode(ins(seq), envelope.pack_schema(SCHEMA)) for seq in seqs]
    return Batch(seqs[-1], raw, len(seqs), list(seqs))


def reader(store: Store, bases: dict[str, int] | None = None) -> ReadAhead:
    return ReadAhead(store, 1000, 0.1,  # type: ignore[arg-type]  # the stand-in store
                     {"": 0} if bases is None else bases)


def prepared(fetched: Fetched) -> frames.Prepared:
    assert fetched.prepared is not None
    return fetched.prepared


async def test_batches_come_in_order_with_one_get_in_flight_and_the_next_already_fetched() -> None:
    store = Store([batch(1, 2), batch(3), batch(4, 5, 6)])
    ahead = reader(store)
    got = []
    for _ in range(3):
        fetched = await ahead.next()
        await asyncio.sleep(0.05)  # the lake writing: the next get is done meanwhile
        got.append([seq for seq, _ in prepared(fetched).events])
        assert store.gets == len(got) + 1
    await ahead.close()
    assert got == [[1, 2], [3], [4, 5, 6]]
    assert store.most_in_flight == 1


async def test_runs_are_grouped_and_in_arrow_before_the_lake_asks() -> None:
    ahead = reader(Store([batch(1, 2)]))
    fetched = await ahead.next()
    await ahead.close()
    (changes,) = prepared(fetched).tables.values()
    (run,) = changes.steps
    assert run._arrow is not None and sum(t.num_rows for t in run._arrow) == 2  # type: ignore[union-attr]


async def test_an_empty_batch_passes_through_and_every_message_of_a_batch_is_prepared() -> None:
    """Nothing is left out by sequence: each lake table's marker says what it holds (a rewind re-applies)."""
    ahead = reader(Store([Batch(None, [], 0, []), batch(7, 8, 9)]))
    empty = await ahead.next()
    assert empty.batch.id is None and prepared(empty).events == []
    fetched = await ahead.next()
    await ahead.close()
    assert [seq for seq, _ in prepared(fetched).events] == [7, 8, 9]


async def test_a_batch_of_a_stream_new_to_the_lake_waits_for_its_base_then_counts_on_from_it() -> None:
    """BINLAKE_CDC defined again numbers from 1: its sequences continue the lake's from the base the
    lake gives the stream, so what the lake holds (up to 40 here) never hides them."""
    new = replace(batch(1, 2, 3), stream="cdc-2")
    ahead = reader(Store([new]), bases={"cdc-1": 0})
    fetched = await ahead.next()
    assert fetched.prepared is None  # the loader has the lake adopt the stream first
    again = await ahead.prepare(fetched.batch, 40)
    await ahead.close()
    assert [seq for seq, _ in prepared(again).events] == [41, 42, 43]
    assert again.end == 43


async def test_preparing_runs_in_a_worker_thread() -> None:
    threads: list[threading.Thread] = []
    main = threading.current_thread()

    original = frames.prepare

    def prepare(events: Any) -> Any:
        threads.append(threading.current_thread())
        return original(events)

    mp = pytest.MonkeyPatch()
    mp.setattr(frames, "prepare", prepare)
    try:
        ahead = reader(Store([batch(1)]))
        await ahead.next()
        await ahead.close()
    finally:
        mp.undo()
    assert threads and all(t is not main for t in threads)


async def test_close_cancels_the_get_in_flight() -> None:
    store = Store([batch(1)])
    ahead = reader(store)
    await ahead.next()
    await ahead.close()
    await asyncio.sleep(0.02)
    assert store.in_flight == 0


class Backlog:
    """A store with `waiting` single-row messages, at most `bound` rows a batch (its own limit):
    each get hands out as many as asked for, and says whether more was there."""

    def __init__(self, waiting: int, bound: int = 1 << 30) -> None:
        self.waiting = waiting
        self.bound = bound
        self.next_seq = 1
        self.asked: list[int] = []

    async def get(self, max_rows: int = 1000, max_wait: float = 1.0, max_bytes: int | None = None) -> Batch:
        self.asked.append(max_rows)
        n = min(max_rows, self.bound, self.waiting)
        if not n:
            return Batch(None, [], 0, [])
        seqs = list(range(self.next_seq, self.next_seq + n))
        self.next_seq += n
        self.waiting -= n
        return replace(batch(*seqs), full=self.waiting > 0 and n == min(max_rows, self.bound))


async def test_behind_the_store_batches_grow_to_the_catch_up_bound_and_shrink_once_caught_up() -> None:
    """A backlog is loaded in fewer, larger lake commits; a fresh lake gets small ones again."""
    store = Backlog(1000 + 2000 + 4000 + 8000 + 8000 + 500)
    ahead = ReadAhead(store, 1000, 0.1, {"": 0}, catch_up_rows=8000)  # type: ignore[arg-type]
    sizes = []
    for _ in range(7):
        fetched = await ahead.next()
        sizes.append(fetched.batch.rows)
    await ahead.close()
    assert sizes[:6] == [1000, 2000, 4000, 8000, 8000, 500]
    assert store.asked[:7] == [1000, 2000, 4000, 8000, 8000, 8000, 1000]
    assert sizes[6] == 0


async def test_a_batch_the_store_ended_at_its_own_bound_counts_as_behind() -> None:
    """The store's BINLAKE_MAX_BATCH_ROWS below what the loader asks for: still behind, still growing."""
    store = Backlog(10_000, bound=1500)
    ahead = ReadAhead(store, 1000, 0.1, {"": 0}, catch_up_rows=8000)  # type: ignore[arg-type]
    for _ in range(4):
        await ahead.next()
        assert ahead.behind
    await ahead.close()
    assert store.asked[:4] == [1000, 2000, 4000, 8000]

"""ThreadBridge: a blocking producer thread hands batches to the event loop with backpressure."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from shared.bridge import BridgeClosed, ThreadBridge

N = 100_000


def start(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


async def drain(bridge: ThreadBridge[int]) -> list[int]:
    got: list[int] = []
    with pytest.raises(EOFError):
        while True:
            batch = await asyncio.wait_for(bridge.get(), 10)
            assert batch
            got.extend(batch)
    return got


@pytest.mark.parametrize(("batch", "max_items"), [(1, 50), (7, 1_000), (500, 10_000)])
async def test_many_items_arrive_complete_and_in_order(batch, max_items):
    bridge: ThreadBridge[int] = ThreadBridge(asyncio.get_running_loop(), max_items=max_items)

    def produce() -> None:
        for first in range(0, N, batch):
            bridge.put_many(range(first, min(first + batch, N)))
        bridge.finish()

    thread = start(produce)
    assert await drain(bridge) == list(range(N))
    thread.join(5)


async def test_full_bridge_blocks_the_producer_until_drained():
    bridge: ThreadBridge[int] = ThreadBridge(asyncio.get_running_loop(), max_items=10)
    bridge.put_many(range(10))
    done = threading.Event()

    def produce() -> None:
        bridge.put_many([10, 11])
        done.set()

    thread = start(produce)
    assert not await asyncio.to_thread(done.wait, 0.3)
    assert bridge.get_nowait() == list(range(10))
    assert await asyncio.to_thread(done.wait, 5)
    assert bridge.get_nowait() == [10, 11]
    thread.join(5)


async def test_cancel_unblocks_a_waiting_producer_with_bridge_closed():
    bridge: ThreadBridge[int] = ThreadBridge(asyncio.get_running_loop(), max_items=1)
    bridge.put_many([0])
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            bridge.put_many([1])
        except BridgeClosed as exc:
            errors.append(exc)

    thread = start(produce)
    await asyncio.sleep(0.05)
    assert not bridge.cancelled
    bridge.cancel()
    await asyncio.to_thread(thread.join, 5)
    assert not thread.is_alive()
    assert len(errors) == 1 and bridge.cancelled


async def test_put_after_cancel_raises():
    bridge: ThreadBridge[int] = ThreadBridge(asyncio.get_running_loop())
    bridge.cancel()
    with pytest.raises(BridgeClosed):
        bridge.put_many([1])
    assert bridge.get_nowait() == []


async def test_finish_with_error_raises_it_after_the_queued_items():
    bridge: ThreadBridge[int] = ThreadBridge(asyncio.get_running_loop())
    boom = RuntimeError("binlog broke")

    def produce() -> None:
        bridge.put_many([1, 2])
        bridge.put_many([3])
        bridge.finish(boom)

    await asyncio.to_thread(start(produce).join, 5)
    assert await bridge.get() == [1, 2, 3]
    assert bridge.get_nowait() == []  # never raises the producer's error
    with pytest.raises(RuntimeError, match="binlog broke") as info:
        await bridge.get()
    assert info.value is boom


async def test_finish_without_error_is_eof():
    bridge: ThreadBridge[int] = ThreadBridge(asyncio.get_running_loop())
    bridge.put_many([1])
    bridge.finish()
    assert await bridge.get() == [1]
    with pytest.raises(EOFError):
        await bridge.get()


async def test_waiting_consumer_is_woken_by_a_put_and_by_finish():
    bridge: ThreadBridge[int] = ThreadBridge(asyncio.get_running_loop())
    getter = asyncio.create_task(bridge.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    await asyncio.to_thread(bridge.put_many, [42])
    assert await asyncio.wait_for(getter, 5) == [42]
    getter = asyncio.create_task(bridge.get())
    await asyncio.sleep(0.01)
    await asyncio.to_thread(bridge.finish)
    with pytest.raises(EOFError):
        await asyncio.wait_for(getter, 5)


async def test_get_nowait():
    bridge: ThreadBridge[str] = ThreadBridge(asyncio.get_running_loop())
    assert bridge.get_nowait() == []
    bridge.put_many(["a"])
    bridge.put_many(["b", "c"])
    assert bridge.get_nowait() == ["a", "b", "c"]
    assert bridge.get_nowait() == []


def test_finish_after_the_loop_closed_does_not_raise():
    loop = asyncio.new_event_loop()
    loop.close()
    bridge: ThreadBridge[int] = ThreadBridge(loop)
    bridge.finish(ValueError("late"))

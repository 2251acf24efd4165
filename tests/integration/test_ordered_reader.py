"""shared.ordered_reader against a real nats-server: in order across many pull requests, from a
start sequence, and patient (not a busy loop) while its stream is away."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import StorageType, StreamConfig

from shared.ordered_reader import OrderedReader


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


async def new_stream(nc: Client) -> tuple[str, str]:
    name = f"READER_{secrets.token_hex(4)}"
    subject = f"{name.lower()}.>"
    await nc.jetstream().add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.MEMORY))
    return name, subject


async def test_reads_every_message_in_order_from_the_start_sequence(nc: Client) -> None:
    js = nc.jetstream()
    name, subject = await new_stream(nc)
    for i in range(1, 96):
        await js.publish(f"{name.lower()}.{'ab'[i % 2]}", str(i).encode())
    reader = OrderedReader(js, name, subject, 11, batch=10)  # many requests of 10
    got: list[int] = []
    try:
        while len(got) < 85:
            msgs = await reader.fetch(wait_s=1.0)
            assert msgs or len(got) == 85, f"stalled after {len(got)}"
            got += [int(m.data) for m in msgs]
        assert got == list(range(11, 96))
        assert reader.next_seq == 96 and reader.pending == 0
        assert await reader.fetch(wait_s=0.3) == []
        await js.publish(f"{name.lower()}.a", b"96")
        later = await reader.fetch(wait_s=2.0)
        assert [int(m.data) for m in later] == [96]
    finally:
        await reader.close()


async def test_a_missing_stream_is_waited_for_not_polled_in_a_loop(nc: Client) -> None:
    js = nc.jetstream()
    name, subject = await new_stream(nc)
    await js.publish(f"{name.lower()}.a", b"1")
    reader = OrderedReader(js, name, subject, 1, batch=10)
    try:
        assert [int(m.data) for m in await reader.fetch(wait_s=1.0)] == [1]
        await js.delete_stream(name)
        started = time.monotonic()
        for _ in range(5):
            assert await reader.fetch(wait_s=0.3) == []
        assert time.monotonic() - started >= 1.0, "fetch returned at once: a busy loop"
        await js.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.MEMORY))
        await js.publish(f"{name.lower()}.a", b"2")  # sequence 1 of the new stream
        reader.next_seq = 1
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = [m.data for m in await reader.fetch(wait_s=0.3)]
        assert got == [b"2"]
    finally:
        await reader.close()


async def test_a_byte_budget_bounds_each_request_and_the_reader_goes_on(nc: Client) -> None:
    js = nc.jetstream()
    name, subject = await new_stream(nc)
    for i in range(40):
        await js.publish(f"{name.lower()}.a", i.to_bytes(2, "big") * 100_000)  # 200 KB each
    reader = OrderedReader(js, name, subject, 1, batch=500, max_bytes=1)  # each request: one max_payload
    got: list[int] = []
    sizes: list[int] = []
    try:
        while len(got) < 40:
            msgs = await reader.fetch(wait_s=1.0)
            assert msgs, f"stalled after {len(got)}"
            got += [int.from_bytes(m.data[:2], "big") for m in msgs]
            sizes.append(sum(len(m.data) for m in msgs))
        assert got == list(range(40))
        # At most two requests of max_payload + room are ever delivered at once, never the whole 8 MB.
        assert max(sizes) <= 2 * (nc.max_payload + 64 * 1024), sizes
    finally:
        await reader.close()


@pytest.mark.parametrize("change", ["filter", "headers_only"])
async def test_a_consumer_another_user_redefines_hands_out_nothing_foreign_and_skips_nothing(
        nc: Client, change: str) -> None:
    """Who may create consumers on a stream can redefine one whose name it learnt (`/jsz`): a new
    filter, or headers only. The reader hands out none of what that consumer then delivers and
    reads on through a consumer of a new name from where it was."""
    js = nc.jetstream()
    name, _ = await new_stream(nc)
    mine, other = f"{name.lower()}.a", f"{name.lower()}.b"
    for i in range(1, 4):
        await js.publish(mine, str(i).encode())
    reader = OrderedReader(js, name, mine, 1, batch=10)
    try:
        got = [int(m.data) for m in await reader.fetch(wait_s=2.0)]
        assert got == [1, 2, 3]
        victim = reader._consumer
        assert victim is not None
        cfg = (await js.consumer_info(name, victim)).config
        cfg.name = victim
        if change == "filter":
            cfg.filter_subject = other
        else:
            cfg.headers_only = True
        updated = await js.add_consumer(name, cfg)  # the same name: an update of the reader's consumer
        assert updated.name == victim and (updated.config.filter_subject == other or updated.config.headers_only)
        for i in range(4, 10):
            await js.publish(other, f"foreign {i}".encode())
            await js.publish(mine, str(i).encode())
        deadline = time.monotonic() + 20
        while len(got) < 9:
            assert time.monotonic() < deadline, f"stalled at {got}"
            for m in await reader.fetch(wait_s=1.0):
                assert m.subject == mine and m.data and not m.data.startswith(b"foreign"), (m.subject, m.data)
                got.append(int(m.data))
        assert got == list(range(1, 10)) and reader._consumer != victim
    finally:
        await reader.close()

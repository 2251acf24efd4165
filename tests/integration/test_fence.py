"""The sink's fence against a real nats-server: atomic batches and one-ack-per-message writes.

Two writers of the same subjects (a stale owner and the new one) race through the same raw
messages; whatever the interleaving, every subject holds each raw message exactly once, in raw
order. A batch the server refuses as a whole (a message id it holds already) falls back to
single writes; a stream without atomic batches is written one message at a time.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig

from services.sink.fence import RAW_SEQ, Out, SubjectFence
from shared import jetstream
from shared.subjects import Names

SUBJECTS = ["a", "b", "c"]


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


async def new_stream(js: JetStreamContext, *, atomic: bool) -> str:
    name = f"FENCE_{secrets.token_hex(4)}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"], storage=StorageType.MEMORY,
                                     duplicate_window=60.0, allow_atomic=atomic))
    return name


def raw_messages(stream: str, n: int) -> list[Out]:
    """n raw messages spread over the subjects, raw sequences 1..n."""
    return [Out(f"{stream.lower()}.{SUBJECTS[i % 3]}", f"m{i}".encode(), {"Nats-Msg-Id": f"{stream}:{i}"}, i)
            for i in range(1, n + 1)]


async def stored(js: JetStreamContext, stream: str) -> dict[str, list[int]]:
    """The raw sequences each subject holds, in stream order."""
    sub = await js.pull_subscribe(f"{stream.lower()}.>", stream=stream)
    out: dict[str, list[int]] = {}
    try:
        while True:
            try:
                msgs = await sub.fetch(500, timeout=0.5)
            except TimeoutError:  # nats-py raises its own subclass or the builtin one
                return out
            for m in msgs:
                out.setdefault(m.subject, []).append(int((m.headers or {}).get(RAW_SEQ, 0)))
                await m.ack()
    finally:
        await sub.unsubscribe()


def expected(msgs: list[Out]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for m in msgs:
        out.setdefault(m.subject, []).append(m.raw_seq)
    return out


async def test_a_batch_goes_out_whole_and_a_replay_stores_nothing(nc: Client) -> None:
    js = nc.jetstream()
    stream = await new_stream(js, atomic=True)
    assert await jetstream.allows_atomic(js, stream)
    msgs = raw_messages(stream, 1200)  # more than one batch (the server's limit is 1,000)
    fence = SubjectFence(js, stream, 5.0, "raw-1", atomic=True)
    assert await fence.publish_all(msgs) == 1200
    again = SubjectFence(js, stream, 5.0, "raw-1", atomic=True)  # a restarted worker replays from an old cursor
    assert await again.publish_all(msgs[500:]) == 0
    assert await stored(js, stream) == expected(msgs)


@pytest.mark.parametrize("atomic", [True, False])
async def test_raw_sequences_of_a_raw_stream_defined_again_are_not_taken_for_stored_ones(
        nc: Client, atomic: bool) -> None:
    """BINLAKE_RAW deleted and defined again numbers its messages from 1: what the subjects hold
    from the old stream (higher raw sequences) does not make the fence skip the new ones."""
    js = nc.jetstream()
    stream = await new_stream(js, atomic=atomic)
    old = raw_messages(stream, 30)
    assert await SubjectFence(js, stream, 5.0, "raw-1", atomic=atomic).publish_all(old) == 30
    new = [Out(m.subject, m.data, {"Nats-Msg-Id": f"new:{m.raw_seq}"}, m.raw_seq) for m in raw_messages(stream, 6)]
    fence = SubjectFence(js, stream, 5.0, "raw-2", atomic=atomic)
    assert await fence.publish_all(new) == 6
    assert await fence.publish_all(new) == 0  # and a replay in the new stream still stores nothing
    held = await stored(js, stream)
    assert {s: seqs[10:] for s, seqs in held.items()} == expected(new)


async def test_a_stale_writer_and_the_new_owner_never_interleave(nc: Client) -> None:
    js = nc.jetstream()
    stream = await new_stream(js, atomic=True)
    msgs = raw_messages(stream, 3000)
    stale, owner = (SubjectFence(js, stream, 5.0, "raw-1", atomic=True),
                    SubjectFence(js, stream, 5.0, "raw-1", atomic=True))

    async def write(fence: SubjectFence, start: int, step: int) -> int:
        n = 0
        for i in range(start, len(msgs), step):
            n += await fence.publish_all(msgs[i:i + step])
        return n

    # Both read from the start in fetches of different sizes, so their batches overlap in every way.
    a, b = await asyncio.gather(write(stale, 0, 170), write(owner, 0, 230))
    assert a + b == 3000
    assert await stored(js, stream) == expected(msgs)


async def test_a_message_id_the_stream_holds_makes_single_writes(nc: Client) -> None:
    js = nc.jetstream()
    stream = await new_stream(js, atomic=True)
    msgs = raw_messages(stream, 10)
    # The id of raw 6 is already in the stream (under another subject): the server refuses the
    # whole batch, and the fence writes one message at a time, where a duplicate is only skipped.
    await js.publish(f"{stream.lower()}.other", b"x", headers={"Nats-Msg-Id": f"{stream}:6"})
    fence = SubjectFence(js, stream, 5.0, "raw-1", atomic=True)
    assert await fence.publish_all(msgs) == 10
    got = await stored(js, stream)
    assert got.pop(f"{stream.lower()}.other") == [0]
    want = expected(msgs)
    want[msgs[5].subject].remove(6)
    assert got == want
    assert fence.atomic, "a duplicate is no reason to give up batches"


async def test_without_atomic_batches_every_message_has_its_own_ack(nc: Client) -> None:
    js = nc.jetstream()
    stream = await new_stream(js, atomic=False)
    assert not await jetstream.allows_atomic(js, stream)
    msgs = raw_messages(stream, 300)
    fence = SubjectFence(js, stream, 5.0, "raw-1", atomic=False)
    assert await fence.publish_all(msgs[:200]) == 200
    batched = SubjectFence(js, stream, 5.0, "raw-1", atomic=True)  # a stream edited since the worker looked
    assert await batched.publish_all(msgs) == 100
    assert not batched.atomic
    assert await stored(js, stream) == expected(msgs)


async def test_an_existing_cdc_stream_is_given_atomic_batches(nc: Client) -> None:
    js = nc.jetstream()
    names = Names(f"fence{secrets.token_hex(3)}")
    old = jetstream.cdc_stream_config(names)
    old.allow_atomic = False
    await js.add_stream(old)
    assert not await jetstream.allows_atomic(js, names.cdc_stream)
    # A service only finds it (and says so): with a NATS user per service it may not change it.
    await jetstream.ensure_stream(js, jetstream.cdc_stream_config(names))
    assert not await jetstream.allows_atomic(js, names.cdc_stream)
    await jetstream.ensure_stream(js, jetstream.cdc_stream_config(names), repair=True)  # `binlake init`
    assert await jetstream.allows_atomic(js, names.cdc_stream)

"""shared.cas against a real nats-server KV bucket: positions never move back; losers run again."""

from __future__ import annotations

import json
from collections.abc import Callable

import nats
import pytest

from shared import cas, jetstream
from shared.rpc import RpcError


def position(seq: int) -> bytes:
    return json.dumps({"seq": seq}).encode()


def past(seq: int) -> Callable[[bytes], bool]:
    return lambda stored: int(json.loads(stored or b"{}").get("seq", 0)) >= seq


async def test_write_forward_creates_updates_and_never_moves_back(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        kv = await jetstream.ensure_kv(nc.jetstream(), "cas_test", history=4)
        first = await cas.write_forward(kv, "k", position(5), None, past(5))
        assert first.stored and first.revision is not None
        second = await cas.write_forward(kv, "k", position(7), first.revision, past(7))
        assert second.stored
        # another writer gets further meanwhile; our stale revision loses, and its value stays
        other = await kv.update("k", position(20), last=second.revision)
        behind = await cas.write_forward(kv, "k", position(9), second.revision, past(9))
        assert not behind.stored and behind.revision == other
        assert json.loads((await kv.get("k")).value or b"")["seq"] == 20
        # a writer that was behind us: we write over it from the revision we now know
        await kv.update("k", position(3), last=other)
        ahead = await cas.write_forward(kv, "k", position(30), other, past(30))
        assert ahead.stored
        assert json.loads((await kv.get("k")).value or b"")["seq"] == 30
        # create when the key exists already: read, and keep the further value
        again = await cas.write_forward(kv, "k", position(25), None, past(25))
        assert not again.stored
    finally:
        await nc.close()


async def test_retry_on_conflict_runs_again_then_names_what_kept_changing() -> None:
    calls: list[int] = []
    cleaned: list[int] = []

    class Lost(Exception):
        pass

    async def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Lost
        return "done"

    async def clean() -> None:
        cleaned.append(1)

    assert await cas.retry_on_conflict(attempt, conflict=Lost, tries=5, what="x", on_conflict=clean) == "done"
    assert (len(calls), len(cleaned)) == (3, 2)

    async def always() -> str:
        raise Lost

    with pytest.raises(RpcError, match="client 'a' keeps changing concurrently; try again") as info:
        await cas.retry_on_conflict(always, conflict=Lost, tries=3, what="client 'a'")
    assert info.value.code == "conflict"

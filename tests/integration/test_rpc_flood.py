"""A flood of requests to one service subject is refused beyond a bound, never queued without end."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import nats
import nats.errors

from shared import rpc
from shared.errors import NatsUnavailable


async def test_requests_beyond_the_bound_are_refused_as_unavailable(nats_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(rpc, "MAX_IN_FLIGHT", 8)
    release = asyncio.Event()

    async def slow(req: dict[str, Any]) -> dict[str, Any]:
        if "probe" not in req:
            await release.wait()
        return {"n": req.get("n")}

    server, client = await nats.connect(nats_url), await nats.connect(nats_url)
    try:
        sub = await rpc.serve(server, "test.flood", slow)
        await server.flush()
        for _ in range(50):  # the subscription is known to the server before the flood starts
            try:
                await client.request("test.flood", msgpack.packb({"probe": True}), timeout=2)
                break
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.1)
        pending = [asyncio.create_task(client.request("test.flood", msgpack.packb({"n": i}), timeout=30))
                   for i in range(20)]
        # The 12 over the bound are answered at once, while the 8 in flight still wait.
        done: set[asyncio.Task[Any]] = set()
        while len(done) < 12:
            finished, _ = await asyncio.wait([p for p in pending if p not in done], timeout=30,
                                             return_when=asyncio.FIRST_COMPLETED)
            assert finished, f"only {len(done)} requests answered while 8 were held"
            done |= finished
        assert len(done) == 12
        release.set()
        replies = [msgpack.unpackb((await p).data) for p in pending]
        refused = [r for r in replies if not r["ok"]]
        assert len(refused) == 12, replies
        assert all(r["code"] == "unavailable" and "8 requests already in flight" in r["error"] for r in refused)
        assert sorted(r["n"] for r in replies if r["ok"]) == list(range(8))
        await sub.unsubscribe()
    finally:
        await server.close()
        await client.close()


async def test_one_caller_cannot_take_the_bound_from_the_others(nats_url: str, monkeypatch: Any) -> None:
    """A client's long polls fill its own share only: another client's request is still answered."""
    monkeypatch.setattr(rpc, "MAX_PER_CALLER", 4)
    release = asyncio.Event()

    async def long_poll(req: dict[str, Any]) -> dict[str, Any]:
        if req.get("wait"):
            await release.wait()
        return {"n": req.get("n")}

    server, client = await nats.connect(nats_url), await nats.connect(nats_url)
    try:
        sub = await rpc.serve(server, "test.fair.*", long_poll, caller=lambda subject: subject.split(".")[-1])
        await server.flush()
        for _ in range(50):
            try:
                await client.request("test.fair.probe", msgpack.packb({}), timeout=2)
                break
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.1)
        greedy = [asyncio.create_task(client.request("test.fair.greedy", msgpack.packb({"n": i, "wait": True}),
                                                     timeout=30)) for i in range(10)]
        refused = [msgpack.unpackb((await p).data) for p in greedy[4:]]  # answered at once
        assert all(not r["ok"] and r["code"] == "unavailable" and "greedy has 4 requests in flight" in r["error"]
                   for r in refused), refused
        other = msgpack.unpackb((await client.request("test.fair.loader", msgpack.packb({"n": 99}), timeout=5)).data)
        assert other == {"ok": True, "n": 99}
        release.set()
        assert [msgpack.unpackb((await p).data)["n"] for p in greedy[:4]] == [0, 1, 2, 3]
        # Its share is free again once answered.
        again = msgpack.unpackb((await client.request("test.fair.greedy", msgpack.packb({"n": 5}), timeout=5)).data)
        assert again == {"ok": True, "n": 5}
        await sub.unsubscribe()
    finally:
        await server.close()
        await client.close()


async def test_a_service_that_finds_no_room_says_so_and_its_caller_waits(nats_url: str) -> None:
    """A write JetStream refuses for want of room, inside a handler (meta's cursor put, say): the
    reply's code is `no_room`, and the caller's error waits for room instead of using a restart budget."""
    from shared.errors import StoreFull

    async def full(req: dict[str, Any]) -> dict[str, Any]:
        raise StoreFull("JetStream has no room for a write in cursor loader.main")

    server, client = await nats.connect(nats_url), await nats.connect(nats_url)
    try:
        sub = await rpc.serve(server, "test.room", full)
        await server.flush()
        try:
            for _ in range(100):  # the subscription reaches the client's server: on a loaded box, not at once
                try:
                    await rpc.call(client, "test.room", {})
                    break
                except NatsUnavailable:
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("the handler never answered")
        except rpc.RpcError as exc:
            assert exc.code == rpc.NO_ROOM and "no room" in str(exc)
            assert exc.retriable and exc.waits
        else:
            raise AssertionError("a handler that found no room answered ok")
        await sub.unsubscribe()
    finally:
        await server.close()
        await client.close()

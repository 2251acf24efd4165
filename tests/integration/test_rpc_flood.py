"""A flood of requests to one service subject is refused beyond a bound, never queued without end."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import nats

from shared import rpc


async def test_requests_beyond_the_bound_are_refused_as_unavailable(nats_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(rpc, "MAX_IN_FLIGHT", 8)
    release = asyncio.Event()

    async def slow(req: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return {"n": req["n"]}

    server, client = await nats.connect(nats_url), await nats.connect(nats_url)
    try:
        sub = await rpc.serve(server, "test.flood", slow)
        await server.flush()
        pending = [asyncio.create_task(client.request("test.flood", msgpack.packb({"n": i}), timeout=10))
                   for i in range(20)]
        await asyncio.sleep(1)
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

"""Sink membership: each worker keeps a key alive in a TTL bucket and watches the others.

A worker that dies stops renewing; its key expires after the bucket TTL and the others
rebalance. A worker that stops cleanly deletes its key, so they rebalance at once.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from shared.actor import Latest


def member_key(source: str, instance: str) -> str:
    return f"sink.{source}.{re.sub(r'[^A-Za-z0-9_=-]', '_', instance)}"


class Membership:
    """Actor: announce this worker and publish the sorted live member names into `view`."""

    def __init__(self, kv: KeyValue, source: str, instance: str, ttl_s: float, view: Latest[frozenset[str]]) -> None:
        self._kv = kv
        self._prefix = f"sink.{source}."
        self.key = member_key(source, instance)
        self._ttl = ttl_s
        self._view = view
        self.log = structlog.get_logger().bind(actor="membership")

    async def run(self) -> None:
        value = json.dumps({"instance": self.key, "since_ms": int(time.time() * 1000)}).encode()
        last: frozenset[str] | None = None
        beat = 0.0
        try:
            while True:
                now = time.monotonic()
                if now - beat > self._ttl / 3:
                    await self._kv.put(self.key, value)
                    beat = now
                members = await self._members()
                if members != last:
                    self.log.info("membership.changed", members=sorted(members))
                    self._view.set(members)
                    last = members
                await asyncio.sleep(min(1.0, self._ttl / 6))
        finally:
            await self.leave()

    async def _members(self) -> frozenset[str]:
        try:
            keys = await self._kv.keys()
        except nats.js.errors.NoKeysError:
            keys = []
        return frozenset(k for k in keys if k.startswith(self._prefix)) | {self.key}

    async def leave(self) -> None:
        try:
            await asyncio.wait_for(self._kv.delete(self.key), 2)
        except (nats.errors.Error, TimeoutError, nats.js.errors.Error):
            pass  # the TTL removes it anyway

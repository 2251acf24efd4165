"""Sink membership: each worker keeps a key alive in a TTL bucket and watches the others.

One long-lived KV watcher (an ordered consumer) sees every member's renewals; listing the
bucket's keys would create and delete a consumer through the meta leader every second.
A member whose renewals stop for a TTL is dead; the TTL is measured against this worker's
own renewals as the watcher sees them, so a bus that stalls (a JetStream leader election)
stalls every member alike and nobody is dropped. A worker that stops cleanly deletes its
key, so the others rebalance at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from shared import keys
from shared.actor import Latest


class MemberClock:
    """Pure: when each member was last seen renewing, and who is alive by this worker's own clock."""

    def __init__(self, me: str, ttl_s: float) -> None:
        self.me = me
        self._ttl = ttl_s
        self._seen: dict[str, float] = {}

    def renewed(self, key: str, now: float) -> None:
        self._seen[key] = now

    def left(self, key: str) -> None:
        self._seen.pop(key, None)

    def alive(self) -> frozenset[str]:
        # Against our own last observed renewal, not the wall clock: while the bus stalls,
        # nobody's renewals arrive, ours included, and nobody ages.
        mine = self._seen.get(self.me)
        if mine is None:
            return frozenset({self.me, *self._seen})
        return frozenset({self.me} | {k for k, t in self._seen.items() if mine - t <= self._ttl})


class Membership:
    """Actor: announce this worker and publish the sorted live member names into `view`."""

    def __init__(self, kv: KeyValue, source: str, instance: str, ttl_s: float, view: Latest[frozenset[str]]) -> None:
        self._kv = kv
        self._prefix = keys.members_prefix(source)
        self.key = keys.member(source, instance)
        self._ttl = ttl_s
        self._view = view
        self.log = structlog.get_logger().bind(actor="membership")

    async def run(self) -> None:
        """Renew, watch, publish the view; bus errors (a leader election) are waited out, never fatal."""
        value = json.dumps({"instance": self.key, "since_ms": int(time.time() * 1000)}).encode()
        clock = MemberClock(self.key, self._ttl)
        last: frozenset[str] | None = None
        beat = 0.0
        watcher: KeyValue.KeyWatcher | None = None
        observed = time.monotonic()  # when the watcher last showed our own renewal
        try:
            while True:
                try:
                    now = time.monotonic()
                    if now - beat > self._ttl / 3:
                        await self._kv.put(self.key, value)
                        beat = now
                    if watcher is not None and now - observed > self._ttl:
                        # Our renewals succeed but never show: the watcher's consumer is lost.
                        self.log.warning("membership.rewatch")
                        await _stop(watcher)
                        watcher = None
                    if watcher is None:
                        watcher = await self._kv.watch(f"{self._prefix}>", meta_only=True)
                        observed = time.monotonic()
                    try:
                        entry = await watcher.updates(timeout=min(1.0, self._ttl / 6))  # type: ignore[no-untyped-call]
                    except (nats.errors.TimeoutError, TimeoutError):
                        entry = None
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                    self.log.warning("membership.bus_error", error=repr(exc))
                    await asyncio.sleep(min(1.0, self._ttl / 6))
                    continue
                if entry is not None and entry.operation in (KV_DEL, KV_PURGE):
                    clock.left(entry.key)
                elif entry is not None:
                    clock.renewed(entry.key, time.monotonic())
                    if entry.key == self.key:
                        observed = time.monotonic()
                members = clock.alive()
                if members != last:
                    self.log.info("membership.changed", members=sorted(members))
                    self._view.set(members)
                    last = members
        finally:
            if watcher is not None:
                await _stop(watcher)
            await self.leave()

    async def leave(self) -> None:
        try:
            await asyncio.wait_for(self._kv.delete(self.key), 2)
        except (nats.errors.Error, TimeoutError, nats.js.errors.Error):
            pass  # the TTL removes it anyway


async def _stop(watcher: KeyValue.KeyWatcher) -> None:
    with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
        await asyncio.wait_for(watcher.stop(), 2)  # type: ignore[no-untyped-call]

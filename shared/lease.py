"""Leader leases in a KV bucket whose TTL expires a lease its holder stopped renewing.

`acquire` waits as a standby until the key is free; `keep` renews it with a compare-and-set
on the revision and raises LeaseLost the moment someone else holds it (or when renewals
failed for longer than the TTL, since then another instance may have taken over).
"""

from __future__ import annotations

import asyncio
import time

import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from shared.actor import raise_if_cancelled
from shared.errors import LeaseLost


async def bucket_ttl(kv: KeyValue, default_s: float) -> float:
    """The TTL the bucket really has (its first creator chose it), which renewals must beat."""
    ttl = (await kv.status()).ttl
    return float(ttl) if ttl else default_s


class Lease:
    def __init__(self, kv: KeyValue, key: str, owner: str, ttl_s: float) -> None:
        self._kv = kv
        self.key = key
        self.owner = owner
        self._ttl = ttl_s
        self._revision: int | None = None
        self._renewed = 0.0
        self.log = structlog.get_logger().bind(actor="lease", key=key)

    @property
    def held(self) -> bool:
        return self._revision is not None

    async def acquire(self) -> None:
        """Wait until this instance holds the lease."""
        waiting = False
        while True:
            try:
                try:
                    self._revision = await self._kv.create(self.key, self.owner.encode())
                    self._renewed = time.monotonic()
                    self.log.info("lease.acquired", owner=self.owner)
                    return
                except nats.js.errors.KeyWrongLastSequenceError:
                    pass
                # Someone holds it: ourselves before a restart, or a live instance.
                if await self._reclaim():
                    return
                if not waiting:
                    holder = await self._holder()
                    self.log.info("lease.standby", holder=holder, owner=self.owner)
                    waiting = True
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:  # a full store, an election
                self.log.warning("lease.retry", error=repr(exc))
            await asyncio.sleep(min(1.0, self._ttl / 4))

    async def _reclaim(self) -> bool:
        """Take the lease back at once when it is held under our own name (we were restarted)."""
        try:
            entry = await self._kv.get(self.key)
        except nats.js.errors.KeyNotFoundError:
            return False
        if entry.value != self.owner.encode() or entry.revision is None:
            return False
        try:
            self._revision = await self._kv.update(self.key, self.owner.encode(), last=entry.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        self._renewed = time.monotonic()
        self.log.info("lease.reclaimed", owner=self.owner)
        return True

    async def _holder(self) -> str | None:
        try:
            entry = await self._kv.get(self.key)
        except (nats.js.errors.KeyNotFoundError, nats.errors.TimeoutError, TimeoutError):
            return None
        return entry.value.decode() if entry.value else None

    async def keep(self) -> None:
        """Renew every ttl/3 until cancelled; raise LeaseLost when the lease is gone."""
        while True:
            await asyncio.sleep(self._ttl / 3)
            try:
                self._revision = await self._kv.update(self.key, self.owner.encode(), last=self._revision)
                self._renewed = time.monotonic()
                raise_if_cancelled()
            except nats.js.errors.KeyWrongLastSequenceError as exc:
                self._revision = None
                raise LeaseLost(f"lease {self.key} was taken by {await self._holder()}") from exc
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                if time.monotonic() - self._renewed > self._ttl:
                    self._revision = None
                    raise LeaseLost(f"lease {self.key} could not be renewed for {self._ttl}s") from exc
                self.log.warning("lease.renew_failed", error=repr(exc))

    async def release(self) -> None:
        """Give the lease up so a standby takes over at once (best effort)."""
        if self._revision is None:
            return
        rev, self._revision = self._revision, None
        try:
            await self._kv.delete(self.key, last=rev)
            self.log.info("lease.released")
        except Exception as exc:  # the TTL frees it anyway
            self.log.warning("lease.release_failed", error=repr(exc))

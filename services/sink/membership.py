"""Sink membership: each worker keeps a key alive in a TTL bucket and watches the others.

One long-lived KV watcher (an ordered pull consumer) sees every member's renewals; listing the
bucket's keys would create and delete a consumer through the meta leader every second.
A member whose renewals stop for a TTL is dead; the TTL is measured against this worker's
own renewals as the watcher sees them, so a bus that stalls (a JetStream leader election)
stalls every member alike and nobody is dropped. A worker that stops cleanly deletes its
key, so the others rebalance at once.

Every renewal carries the header `Binlake-Member: <its key>`. NATS does not check reply
subjects: a user that may publish to any JetStream subject can name a member key's subject
as its reply, and the server's ack is stored there with no headers. Such an entry is no
member (it would be given partitions that then stall): the watcher ignores it and says so.
An entry without the header whose value names its own key is a worker from before the
header (a rolling upgrade), and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE

from shared import keys
from shared.actor import Latest, raise_if_cancelled
from shared.errors import StoreFull
from shared.health import Conditions
from shared.ordered_reader import OrderedReader
from shared.subjects import kv_stream, kv_subject

WATCH_BATCH = 256
MEMBER_HEADER = "Binlake-Member"
"""On each renewal: the member's own key. A server reply relayed into the bucket carries no headers."""
_GONE_MARKERS = frozenset({"MaxAge", "Purge", "Remove"})  # Nats-Marker-Reason of a server-removed key


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


@dataclass(frozen=True)
class Update:
    """What one entry of the members bucket says."""

    key: str
    gone: bool  # deleted, purged, or removed by the server
    member: bool  # a renewal by the member itself (it carries MEMBER_HEADER naming its key)


def update_of(prefix: str, subject: str, headers: dict[str, str], data: bytes = b"") -> Update | None:
    """Pure: the update a members-bucket message means (None: a server marker of an unknown kind)."""
    key = subject[len(prefix):]
    if headers.get(KV_OP) in (KV_DEL, KV_PURGE):
        return Update(key, gone=True, member=False)
    if "Nats-Marker-Reason" in headers:
        return Update(key, gone=True, member=False) if headers["Nats-Marker-Reason"] in _GONE_MARKERS else None
    if MEMBER_HEADER in headers:
        return Update(key, gone=False, member=headers[MEMBER_HEADER] == key)
    return Update(key, gone=False, member=_names_itself(data, key))


def _names_itself(data: bytes, key: str) -> bool:
    """A renewal of a worker before the header (a rolling upgrade): its value names its own key.

    No server reply has an `instance`, and a copy of another member's entry names that member.
    """
    try:
        value = json.loads(data)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("instance") == key


class MemberWatch:
    """An ordered watch of the member keys that keeps each entry's headers.

    nats.py's KV watcher drops them, and they are what tells a member's renewal from a server
    reply relayed into the bucket. A pull consumer (`OrderedReader`): a push consumer would
    deliver in the streams' account, which a role's account does not hear (shared.permissions).
    """

    def __init__(self, js: JetStreamContext, bucket: str, prefix: str) -> None:
        self._bucket = bucket
        self._reader = OrderedReader(js, kv_stream(bucket), kv_subject(bucket, f"{prefix}>"), 1, WATCH_BATCH)
        self._updates: asyncio.Queue[Update | None] = asyncio.Queue(1_000)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="member-watch")

    async def _run(self) -> None:
        while True:
            for msg in await self._reader.fetch(1.0):
                await self._updates.put(update_of(kv_subject(self._bucket, ""), msg.subject,
                                                  dict(msg.headers or {}), msg.data or b""))

    async def next(self, timeout: float) -> Update | None:
        """The next update, or None when none came within `timeout` seconds; the watch's own
        failure, raised here, where the actor sees it (a watch that ended must not look quiet)."""
        if self._task is not None and self._task.done() and not self._task.cancelled():
            self._task.result()
        try:
            update = await asyncio.wait_for(self._updates.get(), timeout)
        except TimeoutError:
            return None
        raise_if_cancelled()  # wait_for may return the update and drop our stop (CPython gh-86296)
        return update

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
            await asyncio.wait_for(self._reader.close(), 2)


class Membership:
    """Actor: announce this worker and publish the sorted live member names into `view`."""

    def __init__(self, js: JetStreamContext, bucket: str, source: str, instance: str, ttl_s: float,
                 view: Latest[frozenset[str]], conditions: Conditions | None = None) -> None:
        """`conditions`: where a bucket JetStream has no room for is reported (`/healthz`)."""
        self._js = js
        self._conditions = conditions or Conditions()
        self._bucket = bucket
        self._prefix = keys.members_prefix(source)
        self.key = keys.member(source, instance)
        self._ttl = ttl_s
        self._view = view
        self._foreign: set[str] = set()  # keys already reported as not a member's
        self.log = structlog.get_logger().bind(actor="membership")

    async def run(self) -> None:
        """Renew, watch, publish the view; bus errors (a leader election) are waited out, never fatal."""
        value = json.dumps({"instance": self.key, "since_ms": int(time.time() * 1000)}).encode()
        clock = MemberClock(self.key, self._ttl)
        last: frozenset[str] | None = None
        beat = 0.0
        watcher: MemberWatch | None = None
        observed = time.monotonic()  # when the watcher last showed our own renewal
        was_full = False  # the last renewal found no room
        try:
            while True:
                try:
                    now = time.monotonic()
                    if now - beat > self._ttl / 3:
                        # A put with a header (KeyValue.put has none): the bucket's TTL applies as before.
                        try:
                            await self._js.publish(kv_subject(self._bucket, self.key), value,
                                                   headers={MEMBER_HEADER: self.key})
                        except nats.js.errors.APIError as exc:
                            if full := self._conditions.no_room(exc, kv_stream(self._bucket), self.key):
                                raise full from exc
                            raise
                        self._conditions.room()
                        was_full = False
                        beat = now
                    if watcher is not None and now - observed > self._ttl:
                        # Our renewals succeed but never show: the watcher's consumer is lost.
                        self.log.warning("membership.rewatch")
                        await watcher.stop()
                        watcher = None
                    if watcher is None:
                        started = MemberWatch(self._js, self._bucket, self._prefix)
                        await started.start()  # a failed start is retried on the next turn
                        watcher = started
                        observed = time.monotonic()
                    update = await watcher.next(timeout=min(1.0, self._ttl / 6))
                except StoreFull as exc:
                    if not was_full:  # once per episode: it is retried three times per TTL
                        self.log.error("membership.store_full", reason=str(exc))
                    was_full = True
                    await asyncio.sleep(min(1.0, self._ttl / 6))
                    continue
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                    self.log.warning("membership.bus_error", error=repr(exc))
                    await asyncio.sleep(min(1.0, self._ttl / 6))
                    continue
                if update is not None and update.gone:
                    clock.left(update.key)
                elif update is not None and update.member:
                    clock.renewed(update.key, time.monotonic())
                    if update.key == self.key:
                        observed = time.monotonic()
                elif update is not None:
                    self._not_a_member(update.key)
                members = clock.alive()
                if members != last:
                    self.log.info("membership.changed", members=sorted(members))
                    self._view.set(members)
                    last = members
        finally:
            if watcher is not None:
                await watcher.stop()
            await self.leave()

    def _not_a_member(self, key: str) -> None:
        """An entry without the member header: no renewal. Said once per key."""
        if key in self._foreign:
            return
        self._foreign.add(key)
        self.log.warning("membership.foreign_entry", key=key, bucket=self._bucket,
                         reason=f"its latest value has no {MEMBER_HEADER} header, so no sink worker wrote it: most "
                                "likely a NATS user named its subject as a reply subject and the server stored its "
                                "answer there",
                         hint=f"find who (nats kv history {self._bucket} {key}) and stop them; the key is ignored "
                              f"and expires with the bucket's TTL (or: nats kv del {self._bucket} {key})")

    async def leave(self) -> None:
        try:
            await asyncio.wait_for(self._js.publish(kv_subject(self._bucket, self.key), headers={KV_OP: KV_DEL}), 2)
        except (nats.errors.Error, TimeoutError, nats.js.errors.Error):
            pass  # the TTL removes it anyway

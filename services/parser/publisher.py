"""Publish to BINLAKE_RAW pipelined, gap-free and bounded.

Every message carries `Nats-Expected-Last-Msg-Id` = the id of the message before it, so the
stream can only ever hold a prefix of what the parser produced: if one publish is lost, every
later one is refused, and the restart resumes right after the stream's last message. An ack
can be lost with its connection, so every one is bounded by a deadline, and at most `window`
messages are in flight (`shared.async_publisher`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors
import structlog
from nats.js.api import PubAck

from services.parser.transactions import Outgoing
from shared.async_publisher import AsyncPublisher
from shared.errors import PublishFailed
from shared.health import Conditions

EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"


class Publisher:
    def __init__(self, acks: AsyncPublisher, last_id: str | None, on_acked: Callable[[Outgoing | None, int], None],
                 *, window: int = 4000, window_bytes: int | None = None, ack_timeout_s: float = 15.0,
                 put_object: Callable[[Outgoing], Awaitable[None]] | None = None, stream: str,
                 conditions: Conditions | None = None) -> None:
        """`stream`: the stream it publishes to (BINLAKE_RAW's name); `conditions`: where a full
        JetStream is reported (`/healthz`) until a publish is acked again."""
        self._acks = acks
        self._stream = stream
        self._conditions = conditions or Conditions()
        self._put_object = put_object
        self._window = window
        self._window_bytes = window_bytes
        self._inflight_bytes = 0
        self._last_id = last_id
        self._on_acked = on_acked
        self._timeout = ack_timeout_s
        self._inflight: deque[tuple[Outgoing, asyncio.Future[PubAck], float]] = deque()
        self.published = 0
        self.objects = 0
        self.log = structlog.get_logger().bind(actor="publisher")

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def publish(self, batch: list[Outgoing]) -> None:
        for msg in batch:
            while len(self._inflight) >= self._window or (
                    self._window_bytes is not None and self._inflight and self._inflight_bytes >= self._window_bytes):
                await self._wait_oldest()
            if msg.blob is not None:
                # The object before its reference: a reader never finds a reference without it.
                if self._put_object is None:
                    raise PublishFailed(f"{msg.msg_id} needs an object store and this publisher has none")
                await self._put_object(msg)
                msg.blob = None  # stored: not held while its reference is in flight
                self.objects += 1
            if self._last_id is not None:
                msg.headers[EXPECTED_LAST_MSG_ID] = self._last_id
            try:
                fut = await self._acks.publish(msg.subject, msg.data, msg.headers)
            except (nats.errors.Error, OSError) as exc:
                raise PublishFailed(f"publish of {msg.msg_id} failed: {exc!r}") from exc
            self._inflight.append((msg, fut, time.monotonic()))
            self._inflight_bytes += len(msg.data)
            self._last_id = msg.msg_id
            if _cancelling():
                # A nats-py wait inside publish can swallow our cancellation (CPython gh-86296,
                # Python 3.11); honour it here so a stop or a lost lease always ends us.
                raise asyncio.CancelledError
        self._reap()

    def _reap(self) -> None:
        acked: Outgoing | None = None
        complete: Outgoing | None = None
        count = 0
        while self._inflight and self._inflight[0][1].done():
            msg, fut, _ = self._inflight.popleft()
            self._inflight_bytes -= len(msg.data)
            exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
            if exc is not None:
                if full := self._conditions.no_room(exc, self._stream, msg.msg_id):
                    raise full from exc
                raise PublishFailed(f"JetStream refused {msg.msg_id} on {msg.subject}: {exc!r}") from exc
            self.published += 1
            count += 1
            acked = msg
            if msg.last:
                complete = msg
        if acked is not None:
            self._conditions.room()
            self._on_acked(complete, count)
        if self._inflight and time.monotonic() - self._inflight[0][2] > self._timeout:
            msg = self._inflight[0][0]
            raise PublishFailed(f"no ack for {msg.msg_id} within {self._timeout}s")

    async def flush(self) -> None:
        """Wait until everything in flight is acknowledged (or fail)."""
        while self._inflight:
            await self._wait_oldest()

    async def _wait_oldest(self) -> None:
        _, fut, started = self._inflight[0]
        remaining = self._timeout - (time.monotonic() - started)
        if remaining > 0:
            await asyncio.wait([fut], timeout=remaining)
        self._reap()

    def abandon(self) -> None:
        """Cancel whatever is still in flight (its outcome is re-learned from the stream tail)."""
        for _, fut, _ in self._inflight:
            if fut.done() and not fut.cancelled():
                fut.exception()  # refused after an earlier refusal: known, and not worth a GC warning
        self._inflight.clear()
        self._inflight_bytes = 0
        self._acks.cancel_all()


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

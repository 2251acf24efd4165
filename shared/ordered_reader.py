"""Read a stream (one subject filter) in order, from a given sequence, with no gaps.

An ephemeral pull consumer (AckNone, state in memory) starts at the partition's cursor.
Every delivered message must have the next consumer sequence; on a gap, an error or a
server restart the consumer is recreated from the last sequence handed out, so nothing
is skipped (nats.py's own ordered consumer was seen jumping here, see bench notes).

The pull requests are our own: nats-py's `fetch` awaits each message in a task of its own
(with a uuid name and a timeout), which cost the sink a fifth of its CPU. Here the messages
of up to two outstanding requests land in a buffer from the subscription's callback, and a
fetch takes all of them after at most one wait.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.errors import NatsUnavailable
from shared.subjects import subject_matcher

STATUS = "Status"
MSG_SIZE = "Nats-Msg-Size"  # on a headers-only delivery, instead of the body
HEARTBEAT = "100"
REQUEST_OVER = frozenset({"404", "408"})  # nothing (more) for this request: it is over
BYTES_OVER = "Message Size Exceeds MaxBytes"  # a 409: the request's max_bytes are used up
BATCH_DONE = "Batch Completed"  # a 409 after the last message of a request with max_bytes (server >= 2.10)
MESSAGE_ROOM = 64 * 1024  # a request's max_bytes exceed max_payload by this, so one message always fits
REQUEST_S = 1.0  # every pull request lives as long, whatever a caller waits: they end in the order sent
LOST_MARGIN_S = 2.0  # a request whose end status never came (server restart) is given up this much later


class OrderedReader:
    def __init__(self, js: JetStreamContext, stream: str, subject: str, start_seq: int, batch: int, *,
                 headers_only: bool = False, max_bytes: int | None = None) -> None:
        """`max_bytes`: what the buffer may hold, in bytes (two pull requests of half of it each;
        a request always has room for one message of max_payload); None: `batch` messages bound it."""
        self._js = js
        self._nc = js._nc
        self._api = js._prefix
        self._stream = stream
        self._subject = subject
        self._on_filter = subject_matcher(subject)
        self.next_seq = max(1, start_seq)
        self._batch = batch
        self._headers_only = headers_only
        self._request_bytes = None if max_bytes is None else max(max_bytes // 2,
                                                                 int(self._nc.max_payload) + MESSAGE_ROOM)
        self._consumer: str | None = None
        self._inbox_sub: Subscription | None = None
        self._inbox = ""
        self._buffer: deque[Msg] = deque()
        self._arrived = asyncio.Event()
        self._requests: deque[list[float]] = deque()  # [messages still due, monotonic end] per pull request
        self._cseq = 0
        self.pending = 0
        self.opens = 0  # consumers created so far: a stream defined again shows only as one more
        self.log = structlog.get_logger().bind(actor="reader", subject=subject)

    async def _open(self) -> None:
        await self.close()
        cfg = ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.next_seq,
            filter_subject=self._subject, inactive_threshold=60.0, mem_storage=True, num_replicas=1,
            max_waiting=4, headers_only=self._headers_only or None,
        )
        try:
            info = await self._js.add_consumer(self._stream, cfg)
            self.opens += 1
            self._consumer = info.name  # known before the subscription, so close() deletes it on failure
            self._inbox = self._nc.new_inbox()
            self._inbox_sub = await self._nc.subscribe(self._inbox, cb=self._on_msg)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            raise NatsUnavailable(f"cannot create a consumer on {self._subject}: {exc!r}") from exc
        self._cseq = 0

    async def _on_msg(self, msg: Msg) -> None:
        self._buffer.append(msg)
        self._arrived.set()

    async def _request(self) -> None:
        """Ask for `batch` more messages while less than half a batch is on its way."""
        now = time.monotonic()
        while self._requests and self._requests[0][1] < now:
            self._requests.popleft()  # its end status never came
        if len(self._requests) >= 2 or sum(r[0] for r in self._requests) > self._batch // 2:
            return
        request: dict[str, int] = {"batch": self._batch, "expires": int(REQUEST_S * 1e9)}
        if self._request_bytes is not None:
            request["max_bytes"] = self._request_bytes
        body = json.dumps(request).encode()
        try:
            await self._nc.publish(f"{self._api}.CONSUMER.MSG.NEXT.{self._stream}.{self._consumer}", body,
                                   reply=self._inbox)
        except nats.errors.Error as exc:
            raise NatsUnavailable(f"cannot ask for messages of {self._subject}: {exc!r}") from exc
        self._requests.append([float(self._batch), now + REQUEST_S + LOST_MARGIN_S])

    async def fetch(self, wait_s: float = 1.0) -> list[Msg]:
        """The next messages in order (possibly none after `wait_s`)."""
        try:
            if self._consumer is None:
                await self._open()
            await self._request()
        except NatsUnavailable as exc:
            self.log.warning("reader.reopen", error=str(exc), next_seq=self.next_seq)
            await self.close()
            await asyncio.sleep(wait_s)  # not a busy loop while the stream or JetStream is away
            return []
        if not self._buffer:
            self._arrived.clear()
            # asyncio.wait, not wait_for: 3.11's wait_for can swallow a cancellation (gh-86296).
            arrival = asyncio.ensure_future(self._arrived.wait())
            try:
                await asyncio.wait([arrival], timeout=wait_s)
            finally:
                arrival.cancel()
            if not self._buffer:
                return []
        out: list[Msg] = []
        while self._buffer:
            m = self._buffer.popleft()
            status = (m.headers or {}).get(STATUS) if not m.data else None
            if status is not None:
                if status == HEARTBEAT:
                    continue
                description = (m.headers or {}).get("Description")
                if status == "409" and description == BATCH_DONE:
                    continue  # its messages already closed it in the count below
                if status in REQUEST_OVER or (status == "409" and description == BYTES_OVER):
                    if self._requests:
                        self._requests.popleft()
                    continue
                # 409 (consumer deleted, leadership change, ...), 503 (no consumer): start again.
                self.log.warning("reader.reopen", status=status, description=(m.headers or {}).get("Description"),
                                 next_seq=self.next_seq)
                await self.close()
                break
            if self._requests:
                self._requests[0][0] -= 1
                if self._requests[0][0] <= 0:
                    self._requests.popleft()
            try:
                md = m.metadata
            except nats.errors.Error:  # not a JetStream delivery: start again from what we have
                md = None
            if md is None or md.sequence.consumer != self._cseq + 1:
                self.log.warning("reader.gap", expected=self._cseq + 1, next_seq=self.next_seq)
                await self.close()
                break
            if not self._ours(m):
                # Someone who may create consumers on this stream redefined ours (its name is in
                # /jsz): never hand out what it now delivers; a consumer of a new name goes on.
                self.log.error("reader.consumer_redefined", subject=m.subject[:200], filter=self._subject,
                               next_seq=self.next_seq)
                await self.close()
                break
            self._cseq += 1
            self.next_seq = md.sequence.stream + 1
            self.pending = md.num_pending
            out.append(m)
        return out

    def _ours(self, m: Msg) -> bool:
        """A delivery this reader's consumer, as it created it, would make: on its subject filter,
        with the body unless it asked for headers only."""
        return self._on_filter(m.subject) and (
            self._headers_only or MSG_SIZE not in (m.headers or {}))

    @property
    def drained(self) -> bool:
        """Nothing buffered and, as the last delivery said, nothing pending on the server."""
        return not self._buffer and self.pending == 0

    async def handed_out_all(self) -> bool:
        """Whether the server has nothing pending for this consumer and every message it delivered
        was handed out by `fetch` (False when there is no consumer or the server cannot be asked)."""
        if self._consumer is None or self._buffer:
            return False
        try:
            info = await self._js.consumer_info(self._stream, self._consumer)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
            return False
        return not info.num_pending and info.delivered is not None and info.delivered.consumer_seq == self._cseq

    async def close(self) -> None:
        sub, self._inbox_sub = self._inbox_sub, None
        name, self._consumer = self._consumer, None
        self._buffer.clear()
        self._requests.clear()
        if sub is not None:
            try:
                await sub.unsubscribe()
            except (nats.errors.Error, TimeoutError):
                pass
        if name is not None:
            try:
                await self._js.delete_consumer(self._stream, name)
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
                pass  # an abandoned ephemeral consumer expires after its inactive threshold

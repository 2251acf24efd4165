"""Read a stream (one subject filter) in order, from a given sequence, with no gaps.

An ephemeral pull consumer (AckNone, state in memory) starts at the partition's cursor.
Every delivered message must have the next consumer sequence; on a gap, an error or a
server restart the consumer is recreated from the last sequence handed out, so nothing
is skipped (nats.py's own ordered consumer was seen jumping here, see bench notes).
"""

from __future__ import annotations

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.errors import NatsUnavailable


class OrderedReader:
    def __init__(self, js: JetStreamContext, stream: str, subject: str, start_seq: int, batch: int, *,
                 headers_only: bool = False) -> None:
        self._js = js
        self._stream = stream
        self._subject = subject
        self.next_seq = max(1, start_seq)
        self._batch = batch
        self._headers_only = headers_only
        self._sub: JetStreamContext.PullSubscription | None = None
        self._cseq = 0
        self.pending = 0
        self.log = structlog.get_logger().bind(actor="reader", subject=subject)

    async def _open(self) -> JetStreamContext.PullSubscription:
        await self.close()
        cfg = ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.next_seq,
            filter_subject=self._subject, inactive_threshold=60.0, mem_storage=True, num_replicas=1,
            max_waiting=4, headers_only=self._headers_only or None,
        )
        try:
            self._sub = await self._js.pull_subscribe(self._subject, stream=self._stream, config=cfg)
        except (nats.errors.Error, TimeoutError) as exc:
            raise NatsUnavailable(f"cannot create a consumer on {self._subject}: {exc!r}") from exc
        self._cseq = 0
        return self._sub

    async def fetch(self, wait_s: float = 1.0) -> list[Msg]:
        """The next messages in order (possibly none after `wait_s`)."""
        sub = self._sub or await self._open()
        try:
            msgs = await sub.fetch(self._batch, timeout=wait_s)
        except (nats.errors.TimeoutError, TimeoutError):
            return []  # nothing new within wait_s
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            self.log.warning("reader.reopen", error=repr(exc), next_seq=self.next_seq)
            await self.close()
            return []
        out = []
        for m in msgs:
            if not m.metadata or m.metadata.sequence.consumer != self._cseq + 1:
                self.log.warning("reader.gap", expected=self._cseq + 1, next_seq=self.next_seq)
                await self._open()
                break
            self._cseq += 1
            self.next_seq = m.metadata.sequence.stream + 1
            self.pending = m.metadata.num_pending
            out.append(m)
        return out

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is None:
            return
        name = getattr(sub, "_consumer", None)
        try:
            await sub.unsubscribe()
            if name:
                await self._js.delete_consumer(self._stream, name)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
            pass  # an abandoned ephemeral consumer expires after its inactive threshold

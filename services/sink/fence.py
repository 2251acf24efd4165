"""Publish to CDC table subjects in raw order, fenced against any other writer.

Every message carries `Binlake-Raw-Seq` (the raw stream sequence it came from), and the first
message of a subject in each write carries `Nats-Expected-Last-Subject-Sequence` (the
subject's last stored sequence). Writers of a subject process its raw messages in order, so
what a subject holds is always a prefix of its raw messages: a writer that finds the subject
moved (error 10071: another worker, or an old owner that has not noticed it lost the
partition) re-reads the last stored raw sequence and skips what is already there. A stale
worker therefore can never interleave with the new owner, and a replay never duplicates.
Raw sequences count in one definition of BINLAKE_RAW: every message also carries
`Binlake-Raw-Stream` (a short form of that stream's identity), and a subject whose last message
came from another BINLAKE_RAW (deleted and defined again since) holds none of the current one's.

Where BINLAKE_CDC allows atomic batches (nats-server ≥ 2.12), a whole fetch goes out as one
batch: every message is published without waiting, the last one commits and is the only
round trip. The batch is stored entirely or not at all, and the server checks each subject's
expected sequence at the commit, so the fence holds for every message of the batch. Without
them, each message waits for its own ack (one round trip per message and subject).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from shared.async_publisher import send
from shared.errors import BinlakeError, NatsUnavailable, PublishFailed
from shared.health import Conditions
from shared.jetstream import header, last_msg

RAW_SEQ = "Binlake-Raw-Seq"
RAW_STREAM = "Binlake-Raw-Stream"
EXPECTED_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQ = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
WRONG_LAST_SEQUENCE = 10071
WRONG_LAST_SEQUENCE_CONSTANT = 10164  # the subject is in another writer's batch in flight
DUPLICATE_IN_BATCH = (10158, 10201)  # a message id the stream already holds: per message, it is just skipped
ATOMIC_DISABLED = 10174
TOO_MANY_BATCHES = 10210
INCOMPLETE_BATCH = 10176  # a message of the batch went missing (nothing of it was stored)
MAX_BATCH_MESSAGES = 1000  # the server's limit per atomic batch
MAX_BATCH_BYTES = 8 << 20  # the server holds a batch until its commit


@dataclass(slots=True)
class Out:
    """One message for BINLAKE_CDC, from raw stream sequence `raw_seq`."""

    subject: str
    data: bytes
    headers: dict[str, str]
    raw_seq: int


class SubjectFence:
    def __init__(self, js: JetStreamContext, stream: str, timeout_s: float, raw_stream_id: str, *,
                 atomic: bool = False, conditions: Conditions | None = None) -> None:
        """`raw_stream_id`: the identity of the BINLAKE_RAW the raw sequences count in
        (`shared.jetstream.StreamIdentity.id`); `conditions`: where a full JetStream is reported
        (`/healthz`) until a publish is acked again."""
        self._js = js
        self._conditions = conditions or Conditions()
        self._nc: Client = js._nc  # batch messages are plain publishes
        self._stream = stream
        self._raw_stream = raw_stream_tag(raw_stream_id)
        self._timeout = timeout_s
        self._last: dict[str, tuple[int, int]] = {}  # subject -> (stream seq, raw seq) of its last message
        self.atomic = atomic
        self.skipped = 0

    async def _position(self, subject: str) -> tuple[int, int]:
        pos = self._last.get(subject)
        if pos is None:
            msg = await last_msg(self._js, self._stream, subject)
            ours = msg is not None and header(msg, RAW_STREAM) == self._raw_stream
            pos = (msg.seq or 0, int(header(msg, RAW_SEQ) or 0) if ours else 0) if msg is not None else (0, 0)
            self._last[subject] = pos
        return pos

    async def publish_all(self, outs: list[Out]) -> int:
        """Publish `outs` (raw order), each unless its subject holds it already; how many were stored now."""
        if not self.atomic:
            return await self._publish_each(outs)
        stored, chunk, size = 0, list[Out](), 0
        for i, out in enumerate(outs):
            if chunk and (len(chunk) >= MAX_BATCH_MESSAGES or size + len(out.data) > MAX_BATCH_BYTES):
                stored += await self._publish_batch(chunk)
                chunk, size = [], 0
                if not self.atomic:  # refused as disabled (the stream was edited): the rest one by one
                    return stored + await self._publish_each(outs[i:])
            chunk.append(out)
            size += len(out.data)
        if chunk:
            stored += await self._publish_batch(chunk)
        return stored

    async def _publish_batch(self, outs: list[Out]) -> int:
        for attempt in range(3):
            todo: list[Out] = []
            expected: dict[str, int] = {}
            for out in outs:
                seq, stored_raw = await self._position(out.subject)
                if out.raw_seq <= stored_raw:
                    self.skipped += 1
                    continue
                expected.setdefault(out.subject, seq)
                todo.append(out)
            if not todo:
                return 0
            try:
                first_seq = await self._send_batch(todo, expected)
            except nats.js.errors.APIError as exc:
                for subject in expected:
                    self._last.pop(subject, None)  # learn where the subjects stand
                if exc.err_code in (WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CONSTANT, TOO_MANY_BATCHES,
                                    INCOMPLETE_BATCH):
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
                if exc.err_code == ATOMIC_DISABLED:  # the stream was edited: back to one ack per message
                    self.atomic = False
                    return await self._publish_each(todo)
                if exc.err_code in DUPLICATE_IN_BATCH:
                    return await self._publish_each(todo)
                self._check_room(exc, f"a batch of {len(todo)}")
                raise PublishFailed(f"JetStream refused a batch of {len(todo)} for {sorted(expected)}: {exc}") from exc
            except (nats.errors.TimeoutError, nats.errors.Error, TimeoutError) as exc:
                for subject in expected:
                    self._last.pop(subject, None)
                raise NatsUnavailable(f"batch publish to {len(expected)} subjects failed: {exc!r}") from exc
            for i, out in enumerate(todo):  # a batch is stored in one run of stream sequences
                self._last[out.subject] = (first_seq + i, out.raw_seq)
            self._stored()
            return len(todo)
        raise PublishFailed(f"{sorted({o.subject for o in outs})} keep moving under concurrent writers; "
                            "is the partition owned twice?")

    async def _send_batch(self, todo: list[Out], expected: dict[str, int]) -> int:
        """One atomic batch; the stream sequence of its first message."""
        batch_id = secrets.token_hex(11)
        first_of: set[str] = set()
        last = len(todo)
        for n, out in enumerate(todo, 1):
            hdrs = {**out.headers, RAW_SEQ: str(out.raw_seq), RAW_STREAM: self._raw_stream, BATCH_ID: batch_id,
                    BATCH_SEQ: str(n)}
            if out.subject not in first_of:  # the server refuses the check on a subject already in the batch
                first_of.add(out.subject)
                hdrs[EXPECTED_SUBJECT_SEQ] = str(expected[out.subject])
            if 1 < n < last:
                await send(self._nc, out.subject, out.data, hdrs)
                continue
            if n == last:
                hdrs[BATCH_COMMIT] = "1"
            # The first message is a request too: the server refuses a batch (too many in flight)
            # only there, and a refusal nobody hears would surface as "incomplete" at the commit.
            try:
                reply = await self._nc.request(out.subject, out.data, timeout=self._timeout, headers=hdrs)
            except nats.errors.NoRespondersError as exc:
                raise nats.js.errors.NoStreamResponseError from exc
            resp = json.loads(reply.data) if reply.data else {}
            if "error" in resp:
                raise nats.js.errors.APIError.from_error(resp["error"])
            if n < last:
                continue
            count = int(resp.get("count", last))
            if count != last:
                raise PublishFailed(f"the stream stored {count} of a batch of {last}")
            return int(resp["seq"]) - last + 1
        raise AssertionError("unreachable: a batch has a last message")

    async def _publish_each(self, outs: list[Out]) -> int:
        """One ack per message: in order per subject, different subjects concurrently."""
        by_subject: dict[str, list[Out]] = {}
        for out in outs:
            by_subject.setdefault(out.subject, []).append(out)

        async def one_subject(items: list[Out]) -> int:
            return sum([await self.publish(o.subject, o.data, o.headers, o.raw_seq) for o in items])

        if len(by_subject) <= 1:
            return await one_subject(outs)
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(one_subject(items)) for items in by_subject.values()]
        except* BinlakeError as group:
            # The supervisor restarts on a retriable error and stops on a fatal one; a group of
            # them is neither, and would end the whole process on a bus that is only away.
            errors = list(group.exceptions)
            fatal = [e for e in errors if isinstance(e, BinlakeError) and not e.retriable]
            raise (fatal or errors)[0] from None
        return sum(t.result() for t in tasks)

    async def publish(self, subject: str, data: bytes, headers: dict[str, str], raw_seq: int) -> bool:
        """Publish one message unless the subject already holds `raw_seq`; True when stored now."""
        for _ in range(3):
            seq, stored_raw = await self._position(subject)
            if raw_seq <= stored_raw:
                self.skipped += 1
                return False
            hdrs = {**headers, EXPECTED_SUBJECT_SEQ: str(seq), RAW_SEQ: str(raw_seq), RAW_STREAM: self._raw_stream}
            try:
                ack = await self._js.publish(subject, data, timeout=self._timeout, headers=hdrs)
            except nats.js.errors.APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    self._check_room(exc, f"{subject} raw seq {raw_seq}")
                    raise PublishFailed(f"JetStream refused {subject} raw seq {raw_seq}: {exc}") from exc
                self._last.pop(subject, None)  # someone else wrote: learn where the subject stands
                continue
            except (nats.errors.TimeoutError, nats.errors.Error, TimeoutError) as exc:
                self._last.pop(subject, None)
                raise NatsUnavailable(f"publish to {subject} failed: {exc!r}") from exc
            self._last[subject] = (ack.seq, raw_seq) if not ack.duplicate else (seq, raw_seq)
            self._stored()
            return True
        raise PublishFailed(f"{subject} keeps moving under concurrent writers; is the partition owned twice?")

    def _check_room(self, exc: nats.js.errors.APIError, what: str) -> None:
        """Raise StoreFull, reported until a publish is stored again, when JetStream refused for want of room."""
        if full := self._conditions.no_room(exc, self._stream, what):
            raise full from exc

    def _stored(self) -> None:
        self._conditions.room()

    def forget(self) -> None:
        self._last.clear()


def raw_stream_tag(stream_id: str) -> str:
    """The `Binlake-Raw-Stream` header of a BINLAKE_RAW identity: short, as it travels on every message."""
    return hashlib.blake2s(stream_id.encode(), digest_size=6).hexdigest()

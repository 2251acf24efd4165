"""Publish to a CDC table subject in raw order, fenced against any other writer.

Every publish carries `Nats-Expected-Last-Subject-Sequence` (the subject's last stored
sequence) and `Binlake-Raw-Seq` (the raw stream sequence it came from). Writers of a
subject process its raw messages in order, so what a subject holds is always a prefix of
its raw messages: a writer that finds the subject moved (error 10071: another worker, or
an old owner that has not noticed it lost the partition) re-reads the last stored raw
sequence and skips what is already there. A stale worker therefore can never interleave
with the new owner, and a replay after a crash never duplicates.
"""

from __future__ import annotations

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from shared.errors import NatsUnavailable, PublishFailed
from shared.jetstream import header, last_msg

RAW_SEQ = "Binlake-Raw-Seq"
EXPECTED_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = 10071


class SubjectFence:
    def __init__(self, js: JetStreamContext, stream: str, timeout_s: float) -> None:
        self._js = js
        self._stream = stream
        self._timeout = timeout_s
        self._last: dict[str, tuple[int, int]] = {}  # subject -> (stream seq, raw seq) of its last message
        self.skipped = 0

    async def _position(self, subject: str) -> tuple[int, int]:
        pos = self._last.get(subject)
        if pos is None:
            msg = await last_msg(self._js, self._stream, subject)
            pos = (msg.seq or 0, int(header(msg, RAW_SEQ) or 0)) if msg is not None else (0, 0)
            self._last[subject] = pos
        return pos

    async def publish(self, subject: str, data: bytes, headers: dict[str, str], raw_seq: int) -> bool:
        """Publish unless the subject already holds `raw_seq`; True when stored now."""
        for _ in range(3):
            seq, stored_raw = await self._position(subject)
            if raw_seq <= stored_raw:
                self.skipped += 1
                return False
            hdrs = {**headers, EXPECTED_SUBJECT_SEQ: str(seq), RAW_SEQ: str(raw_seq)}
            try:
                ack = await self._js.publish(subject, data, timeout=self._timeout, headers=hdrs)
            except nats.js.errors.APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise PublishFailed(f"JetStream refused {subject} raw seq {raw_seq}: {exc}") from exc
                self._last.pop(subject, None)  # someone else wrote: learn where the subject stands
                continue
            except (nats.errors.TimeoutError, nats.errors.Error, TimeoutError) as exc:
                self._last.pop(subject, None)
                raise NatsUnavailable(f"publish to {subject} failed: {exc!r}") from exc
            self._last[subject] = (ack.seq, raw_seq) if not ack.duplicate else (seq, raw_seq)
            return True
        raise PublishFailed(f"{subject} keeps moving under concurrent writers; is the partition owned twice?")

    def forget(self) -> None:
        self._last.clear()

"""A sink partition's cursor as the cursors bucket stores it (`keys.partition_cursor`): shared by
the sink, which writes it, and the CLI (`binlake status`, `binlake rewind --sink-partition`).

`seq` is the last BINLAKE_RAW sequence whose message is handled, `seen` how far an idle
partition found nothing of its own left, `stream_id` the identity of the BINLAKE_RAW these
sequences count in (`shared.jetstream.StreamIdentity`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from shared import kv_values

MAX_SEQ = 1 << 63  # JetStream's sequences are unsigned 64-bit; a cursor beyond is no one's


@dataclass(frozen=True)
class PartitionCursor:
    seq: int = 0
    seen: int = 0
    stream_id: str = ""

    @property
    def handled(self) -> int:
        return max(self.seq, self.seen)

    def encode(self) -> bytes:
        return json.dumps({"seq": self.seq, "seen": self.seen, "stream_id": self.stream_id,
                           "updated_ms": int(time.time() * 1000)}).encode()

    @classmethod
    def decode(cls, value: bytes | None, key: str, bucket: str) -> PartitionCursor:
        """The stored cursor; ForeignValue when binlake cannot have written it."""
        return cls.from_dict(kv_values.load_json(value, key, bucket), key, bucket)

    @classmethod
    def from_dict(cls, decoded: Any, key: str, bucket: str) -> PartitionCursor:
        """The stored cursor already parsed from JSON; ForeignValue when binlake cannot have written it."""
        d = kv_values.checked(decoded, key, bucket)
        try:
            seq, seen = int(d.get("seq", 0)), int(d.get("seen", 0))
        except (TypeError, ValueError, OverflowError):
            seq = seen = -1
        if not (0 <= seq < MAX_SEQ and 0 <= seen < MAX_SEQ):
            raise kv_values.foreign(json.dumps(d).encode(), key, bucket, "its seq or seen is no stream sequence")
        return cls(seq, seen, str(d.get("stream_id", "")))

"""A batch-protocol client's state as meta stores it (shared by store, meta and the CLI).

`acked` and `delivered` are BINLAKE_CDC stream sequences; `batches` are the end sequences
of the batches delivered but not yet acked, oldest first (the batch id is its end
sequence, so ids grow and "already acked" is simply `id <= acked`). `min_ts` / `min_scn`
come from a rewind: events before that point are not delivered again. `stream` is the identity
(`shared.jetstream.StreamIdentity.id`) of the BINLAKE_CDC these sequences count in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from shared.patterns import MAX_PATTERN

MAX_NAME = 128  # characters of a client name; it travels in NATS control lines and keys
MAX_FILTER = MAX_PATTERN  # characters of a client's table filter (an RE2 pattern)
_NAME = re.compile(rf"[^\x00-\x1f\x7f]{{1,{MAX_NAME}}}")


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a client (None: it can)."""
    if _NAME.fullmatch(name) and name.strip():
        return None
    if not name.strip():
        return "a client name must not be empty"
    if len(name) > MAX_NAME:
        return f"a client name has at most {MAX_NAME} characters, got {len(name)}"
    return f"a client name has no control characters (tabs, newlines...), got {name[:40]!r}"


@dataclass(frozen=True)
class ClientState:
    client: str
    filter: str = ".*"
    acked: int = 0
    delivered: int = 0
    batches: tuple[int, ...] = field(default_factory=tuple)
    min_ts: int = 0
    min_scn: int = 0
    epoch: int = 0
    stream: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"client": self.client, "filter": self.filter, "acked": self.acked, "delivered": self.delivered,
                "batches": list(self.batches), "min_ts": self.min_ts, "min_scn": self.min_scn, "epoch": self.epoch,
                "stream_id": self.stream, "seq": self.acked}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClientState:
        return cls(client=d["client"], filter=d.get("filter", ".*"), acked=int(d.get("acked", 0)),
                   delivered=int(d.get("delivered", 0)), batches=tuple(int(b) for b in d.get("batches", ())),
                   min_ts=int(d.get("min_ts", 0)), min_scn=int(d.get("min_scn", 0)), epoch=int(d.get("epoch", 0)),
                   stream=str(d.get("stream_id", "")))

    def rolled_back(self) -> ClientState:
        """Every unacked batch comes again, from the last ack."""
        return replace(self, delivered=self.acked, batches=(), epoch=self.epoch + 1)

    def rewound(self, seq: int, *, stream: str, min_ts: int = 0, min_scn: int = 0) -> ClientState:
        """At `seq` of the stream definition `stream` (a rewind is also how a client resumes deliberately
        on a stream defined again)."""
        return replace(self, acked=seq, delivered=seq, batches=(), min_ts=min_ts, min_scn=min_scn,
                       epoch=self.epoch + 1, stream=stream)

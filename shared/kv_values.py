"""Is this KV value binlake's own? The one check before a reader trusts a cursor, a state or a progress.

NATS does not check reply subjects. Whoever may publish to any JetStream subject can name
`$KV.<bucket>.<key>` as the reply, and the server stores its answer there: a publish ack
`{"stream": "KV_...", "seq": 6}`, or a JetStream API response `{"type": "io.nats.jetstream.api.v1...",
...}` / `{"error": {"code": ..., "description": ...}}`. Read as a cursor, that ack would skip
six messages. Every value binlake writes into its buckets is a JSON object that has no top-level
`stream`, no `type` starting with `io.nats.` and no `error` that is a map (a snapshot's `error`
is text or null), so anything else is refused: the reader halts and says what to do.
"""

from __future__ import annotations

import json
from typing import Any

from shared.errors import ForeignValue

SHOWN = 80  # bytes of a refused value the error message quotes


def load_json(value: bytes | None, key: str, bucket: str | None = None) -> dict[str, Any]:
    """The JSON object stored at `key`; ForeignValue when binlake cannot have written it."""
    try:
        decoded = json.loads(value) if value else None
    except (ValueError, RecursionError):  # UnicodeDecodeError too; RecursionError: nested too deep
        raise foreign(value, key, bucket, "not JSON") from None
    return checked(decoded, key, bucket, value or b"")


def checked(decoded: Any, key: str, bucket: str | None = None, raw: bytes | None = None) -> dict[str, Any]:
    """`decoded` (a stored value already parsed, e.g. by meta) if it is binlake's own; ForeignValue if not."""
    if not isinstance(decoded, dict):
        kind = "null" if decoded is None else type(decoded).__name__
        reason = "empty" if raw == b"" else f"a JSON {kind}, not an object"
        raise foreign(raw if raw is not None else _dumped(decoded), key, bucket, reason)
    made = server_made(decoded)
    if made is not None:
        raise foreign(raw if raw is not None else _dumped(decoded), key, bucket,
                      f"{made}: the NATS server's answer to a request made with this key's subject as its reply")
    return decoded


def server_made(value: dict[str, Any]) -> str | None:
    """What marks `value` as a NATS server reply (None: nothing does)."""
    kind = value.get("type")
    if isinstance(kind, str) and kind.startswith("io.nats."):
        return f"a JetStream API response ({kind[:60]})"
    if isinstance(value.get("error"), dict):
        return "a JetStream error reply"
    if "stream" in value:
        return "a JetStream publish ack"
    return None


def foreign(raw: bytes | None, key: str, bucket: str | None, reason: str) -> ForeignValue:
    """The error for a value at `key` that binlake did not write."""
    b = bucket or "<bucket>"
    shown = (raw or b"")[:SHOWN]
    more = "..." if raw is not None and len(raw) > SHOWN else ""
    return ForeignValue(
        f"KV key {key!r}{f' in bucket {bucket}' if bucket else ''} holds a value binlake did not write ({reason}): "
        f"{shown!r}{more}. Something other than binlake wrote it, most likely a NATS user that may publish to a "
        f"JetStream subject and named $KV.{b}.{key} as its reply subject (NATS does not check reply subjects). "
        "Reading it could skip or replay data, so this stops here. Find who wrote it (`nats kv history "
        f"{b} {key}` shows the revision and time it was written) and stop them, then delete the key "
        f"(`nats kv del {b} {key}`) or put binlake's last good value back from that history, and restart")


def _dumped(value: Any) -> bytes:
    return json.dumps(value, default=repr).encode()

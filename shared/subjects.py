"""Every subject, stream and bucket name binlake uses, derived from one prefix.

Database and table names become subject tokens through `escape_token`: every byte outside
`[A-Za-z0-9_-]` (so `.`, `*`, `>`, spaces, `$`, `%` and all non-ASCII) is written as `%XX`
of its UTF-8 encoding, which is reversible by `unescape_token`. A token that starts with `$`
can therefore never be a table, and `$binlake` marks binlake's own subjects (heartbeats,
DDL that names no table).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_PARTITIONS = 16
STREAMS = ("raw", "cdc", "dlq")
"""binlake's streams, as settings name them (BINLAKE_RAW_MAX_AGE_S, ...); `Names` has their names."""
INTERNAL_TOKEN = "$binlake"
HEARTBEAT_TABLE = "heartbeat"
DDL_TABLE = "ddl"

INBOX_PREFIX = r"_INBOX(?:_[A-Za-z0-9%_-]+)?"
"""A reply-subject prefix (BINLAKE_NATS_INBOX): `_INBOX`, or a user's own `_INBOX_<escaped user>`."""

_SAFE = re.compile(r"[A-Za-z0-9_-]*")
_SAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def escape_token(name: str) -> str:
    """Make `name` a single subject token, reversibly (`a.b` -> `a%2Eb`)."""
    if name and _SAFE.fullmatch(name):
        return name
    if not name:
        return "%"  # the empty name; never produced for any other input
    return "".join(chr(b) if b in _SAFE_BYTES else f"%{b:02X}" for b in name.encode("utf-8"))


def unescape_token(token: str) -> str:
    """Inverse of `escape_token`."""
    if "%" not in token:
        return token
    if token == "%":
        return ""
    out = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "%":
            out.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(ch))
            i += 1
    return out.decode("utf-8")


def fnv1a32(data: bytes) -> int:
    """FNV-1a 32-bit, the hash of nats-server's `partition()` subject transform."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a last `>` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def subject_matcher(pattern: str) -> Callable[[str], bool]:
    """`subject_matches` for one pattern, made once: a plain `a.b.>` is a prefix test (a reader
    checks every message it gets)."""
    head = pattern[:-1]
    if pattern.endswith(".>") and "*" not in head and ">" not in head:
        return lambda subject: subject.startswith(head) and len(subject) > len(head)
    return lambda subject: subject_matches(pattern, subject)


def kv_stream(bucket: str) -> str:
    """The stream nats-server keeps a KV bucket in."""
    return f"KV_{bucket}"


def kv_subject(bucket: str, key: str) -> str:
    """The subject of a key (or a `>` filter) in a KV bucket's stream."""
    return f"$KV.{bucket}.{key}"


def partition(n: int, *tokens: str) -> int:
    """The partition nats-server assigns: FNV-1a over the concatenated tokens, mod n."""
    return fnv1a32("".join(tokens).encode("utf-8")) % n


@dataclass(frozen=True)
class Names:
    """Subjects, streams and buckets for one deployment (`prefix` defaults to `binlake`)."""

    prefix: str = "binlake"

    @property
    def raw_stream(self) -> str:
        return f"{self.prefix.upper()}_RAW"

    @property
    def cdc_stream(self) -> str:
        return f"{self.prefix.upper()}_CDC"

    @property
    def dlq_stream(self) -> str:
        return f"{self.prefix.upper()}_DLQ"

    @property
    def cursors_bucket(self) -> str:
        return f"{self.prefix}_cursors"

    @property
    def schema_bucket(self) -> str:
        return f"{self.prefix}_schema"

    @property
    def members_bucket(self) -> str:
        return f"{self.prefix}_members"

    @property
    def leases_bucket(self) -> str:
        return f"{self.prefix}_leases"

    @property
    def raw_objects_bucket(self) -> str:
        """Raw messages larger than max_payload (`shared.objects`), read like BINLAKE_RAW."""
        return f"{self.prefix}_raw_objects"

    @property
    def cdc_objects_bucket(self) -> str:
        """CDC messages larger than max_payload (`shared.objects`), read like BINLAKE_CDC."""
        return f"{self.prefix}_cdc_objects"

    @property
    def raw_all(self) -> str:
        """Every raw subject: BINLAKE_RAW's subjects."""
        return f"{self.prefix}.raw.>"

    @property
    def cdc_all(self) -> str:
        return f"{self.prefix}.cdc.>"

    @property
    def dlq_all(self) -> str:
        return f"{self.prefix}.dlq.>"

    def meta_rpc(self, verb: str) -> str:
        """Request subject of a meta verb (`cursor.get`, `rewind`, ...), served in queue group `meta`."""
        return f"{self.prefix}.meta.{verb}"

    def store_rpc(self, source: str, verb: str) -> str:
        """Request subject of a store verb (`subscribe`, `get`, `ack`, ...) for one source (any client)."""
        return f"{self.prefix}.store.{escape_token(source)}.{verb}"

    def store_client_rpc(self, source: str, verb: str, client: str) -> str:
        """The same verb on a subject of its own per client: a NATS user can be allowed only its own."""
        return f"{self.store_rpc(source, verb)}.{escape_token(client)}"

    def client_of_store_rpc(self, subject: str) -> str | None:
        """The client a store request subject names (None: the any-client subject)."""
        parts = subject.split(".")
        return unescape_token(parts[4]) if len(parts) == 5 else None

    def raw(self, source: str, db: str, table: str) -> str:
        """Subject the parser publishes to (before the stream's partition transform)."""
        return f"{self.prefix}.raw.{escape_token(source)}.{escape_token(db)}.{escape_token(table)}"

    def raw_internal(self, source: str, kind: str) -> str:
        return f"{self.prefix}.raw.{escape_token(source)}.{INTERNAL_TOKEN}.{kind}"

    def raw_source_filter(self, source: str) -> str:
        """Every stored raw subject of one source (after the transform)."""
        return f"{self.prefix}.raw.{escape_token(source)}.>"

    def raw_partition_filter(self, source: str, part: int) -> str:
        return f"{self.prefix}.raw.{escape_token(source)}.{part}.>"

    def raw_transform(self, partitions: int) -> tuple[str, str]:
        """(source, destination) of BINLAKE_RAW's subject transform."""
        return (
            f"{self.prefix}.raw.*.*.*",
            f"{self.prefix}.raw.{{{{wildcard(1)}}}}.{{{{partition({partitions},1,2,3)}}}}"
            f".{{{{wildcard(2)}}}}.{{{{wildcard(3)}}}}",
        )

    def raw_stored_filter(self, subject: str) -> str:
        """Every stored subject (any partition) of the raw subject `subject` the parser publishes to."""
        parts = subject.split(".")
        if len(parts) != 5 or parts[0] != self.prefix or parts[1] != "raw":
            raise ValueError(f"not a raw subject: {subject!r}")
        return f"{self.prefix}.raw.{parts[2]}.*.{parts[3]}.{parts[4]}"

    def raw_stored(self, source: str, db: str, table: str, partitions: int) -> str:
        """The subject a raw message is stored under, computed the way the server does."""
        s, d, t = escape_token(source), escape_token(db), escape_token(table)
        return f"{self.prefix}.raw.{s}.{partition(partitions, s, d, t)}.{d}.{t}"

    def cdc(self, source: str, db: str, table: str) -> str:
        return f"{self.prefix}.cdc.{escape_token(source)}.{escape_token(db)}.{escape_token(table)}"

    def cdc_internal(self, source: str, kind: str) -> str:
        """A CDC subject of binlake's own (never delivered to clients), e.g. a partition's filter markers."""
        return f"{self.prefix}.cdc.{escape_token(source)}.{INTERNAL_TOKEN}.{kind}"

    def dlq(self, source: str) -> str:
        return f"{self.prefix}.dlq.{escape_token(source)}"

    def cdc_from_raw_stored(self, subject: str) -> str:
        """The CDC subject of a stored raw subject, keeping its (already escaped) tokens."""
        parts = subject.split(".")
        if len(parts) != 6 or parts[0] != self.prefix or parts[1] != "raw":
            raise ValueError(f"not a stored raw subject: {subject!r}")
        return f"{self.prefix}.cdc.{parts[2]}.{parts[4]}.{parts[5]}"

    def cdc_source_filter(self, source: str) -> str:
        return f"{self.prefix}.cdc.{escape_token(source)}.>"

    def parse_raw_stored(self, subject: str) -> tuple[str, int, str, str]:
        """(source, partition, db, table) of a stored raw subject."""
        parts = subject.split(".")
        if len(parts) != 6 or parts[0] != self.prefix or parts[1] != "raw":
            raise ValueError(f"not a stored raw subject: {subject!r}")
        return unescape_token(parts[2]), int(parts[3]), unescape_token(parts[4]), unescape_token(parts[5])

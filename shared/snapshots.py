"""Snapshot requests and per-table progress as they live in the cursor bucket.

Shared by the parser (which runs snapshots and writes progress after every chunk) and the
CLI (`binlake snapshot` files requests and draws progress, `binlake status` lists it).

Keys: `snapshot.<source>.request.<id>` for a request, `snapshot.<source>.table.<db>.<table>`
for a table's progress; names are escaped with `=XX` like client keys.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from shared import kv_values
from shared.patterns import cached

PENDING, RUNNING, DONE, FAILED, DROPPED = "pending", "running", "done", "failed", "dropped"
FINISHED = frozenset({DONE, FAILED, DROPPED})


def _pack_key(values: list[Any] | None) -> list[Any] | None:
    if values is None:
        return None
    return [{"hex": v.hex()} if isinstance(v, bytes) else v for v in values]


def _unpack_key(values: list[Any] | None) -> list[Any] | None:
    if values is None:
        return None
    return [bytes.fromhex(v["hex"]) if isinstance(v, dict) else v for v in values]


@dataclass(frozen=True)
class TableProgress:
    """One table's snapshot: where it stands and what it has emitted so far."""

    db: str
    table: str
    run: str
    state: str = PENDING
    chunks: int = 0
    last_key: list[Any] | None = None  # keyset parameters after the last finished chunk
    rows: int = 0  # rows emitted as op "r"
    estimate: int = 0
    key: list[str] = field(default_factory=list)
    key_kind: str = ""
    key_sig: str = ""  # key columns' names, types and collations when last_key was read
    retries: int = 0
    requested_ms: int = 0
    started_ms: int = 0
    updated_ms: int = 0
    finished_ms: int = 0
    error: str | None = None

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def to_json(self) -> bytes:
        d = asdict(self)
        d["last_key"] = _pack_key(self.last_key)
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, data: bytes, key: str = "snapshot.<source>.table.<db>.<table>",
                  bucket: str | None = None) -> TableProgress:
        """Progress as stored at `key`; ForeignValue when binlake did not write it (a relayed server reply)."""
        d = kv_values.load_json(data, key, bucket)
        d["last_key"] = _unpack_key(d.get("last_key"))
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def advanced(self, *, last_key: list[Any] | None, rows: int, now_ms: int, done: bool) -> TableProgress:
        return replace(self, state=DONE if done else RUNNING, chunks=self.chunks + 1, last_key=last_key,
                       rows=self.rows + rows, updated_ms=now_ms, finished_ms=now_ms if done else 0,
                       estimate=max(self.estimate, self.rows + rows) if done else self.estimate)


@dataclass(frozen=True)
class SnapshotRequest:
    """`binlake snapshot <pattern>...`: the parser expands the patterns and answers here."""

    id: str
    patterns: list[str]
    created_ms: int
    state: str = "new"  # new | accepted | failed
    tables: list[str] = field(default_factory=list)  # table keys (table_key) it started or joined
    error: str | None = None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes, key: str = "snapshot.<source>.request.<id>",
                  bucket: str | None = None) -> SnapshotRequest:
        """A request as stored at `key`; ForeignValue when binlake did not write it (its `error` is text)."""
        d = kv_values.load_json(data, key, bucket)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


def matches(patterns: list[str], db: str, table: str) -> bool:
    """A pattern is an RE2 regular expression over `db.table` (`shared.patterns`); `shop.orders`
    also matches itself literally. PatternError when one is not RE2."""
    name = f"{db}.{table}"
    return any(p == name or cached(p).fullmatch(name) for p in patterns)

"""How far each stage is behind, per table: rows and seconds (`binlake status`).

A stage's backlog is what its stream holds after the reader's position: a sink partition's
messages of BINLAKE_RAW after its cursor, a store client's of BINLAKE_CDC after its acked
sequence. Only the headers are read (`Binlake-Table`, `Binlake-Rows`, `Binlake-Ts`), through
an ephemeral consumer from that position, and at most `limit` messages per stage: beyond it
the counts are lower bounds (`capped`), the totals exact (the server's pending count).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from shared import envelope
from shared.errors import NatsUnavailable
from shared.ordered_reader import OrderedReader
from shared.patterns import PatternError, compile_pattern

SCAN_LIMIT = 50_000  # messages read per stage at most
READ_S = 10.0  # a scan that gets nothing for this long, though something waits, gives up (a lower bound)


@dataclass
class Behind:
    """A backlog: messages and rows not yet handled, and the source commit time of the oldest."""

    messages: int = 0
    rows: int = 0
    oldest_ts_ms: int | None = None

    def add(self, rows: int, ts_ms: int | None, messages: int = 1) -> None:
        self.messages += messages
        self.rows += rows
        if ts_ms is not None and (self.oldest_ts_ms is None or ts_ms < self.oldest_ts_ms):
            self.oldest_ts_ms = ts_ms

    def merge(self, other: Behind) -> None:
        self.add(other.rows, other.oldest_ts_ms, other.messages)

    def seconds(self, now_ms: int) -> float:
        return 0.0 if self.oldest_ts_ms is None else max(0.0, (now_ms - self.oldest_ts_ms) / 1000)


@dataclass
class Backlog:
    """One stage's backlog of one reader: per table, the total, and whether the scan stopped early."""

    tables: dict[str, Behind] = field(default_factory=dict)
    total: Behind = field(default_factory=Behind)
    capped: bool = False

    def merge(self, other: Backlog) -> None:
        for name, behind in other.tables.items():
            self.tables.setdefault(name, Behind()).merge(behind)
        self.total.merge(other.total)
        self.capped = self.capped or other.capped


async def backlog(js: JetStreamContext, stream: str, subject: str, after_seq: int, *,
                  wanted: Callable[[Mapping[str, str]], bool] = lambda _: True, limit: int = SCAN_LIMIT,
                  read_s: float = READ_S) -> Backlog:
    """The messages of `stream` on `subject` after `after_seq` that `wanted` takes (by their headers),
    per `db.table`. A scan that ends early (`limit`, or nothing delivered for `read_s`) is `capped`."""
    out = Backlog()
    try:  # one request says whether anything waits: a consumer would wait its fetch out for nothing
        await js.get_msg(stream, seq=after_seq + 1, subject=subject, next=True)
    except nats.js.errors.NotFoundError:
        return out
    except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
        raise NatsUnavailable(f"stream {stream}: {exc!r}") from exc
    reader = OrderedReader(js, stream, subject, after_seq + 1, min(limit, 1000), headers_only=True)
    try:
        scanned = 0
        quiet_since = time.monotonic()
        latest = now_ms() + 60_000  # the source's clock may run a little ahead of ours
        while scanned < limit:
            msgs = await reader.fetch(wait_s=0.5)
            if not msgs:
                if time.monotonic() - quiet_since > read_s:  # found above, yet not delivered: a lower bound
                    out.capped = True
                    break
                continue
            quiet_since = time.monotonic()
            for m in msgs:
                scanned += 1
                headers = m.headers or {}
                table = headers.get(envelope.TABLE_HEADER, "")
                if not table or not wanted(headers):
                    continue
                rows = max(0, _int(headers.get(envelope.ROWS_HEADER)))
                ts_ms = _int(headers.get(envelope.TS_HEADER))
                ts = ts_ms if 0 < ts_ms <= latest else None  # a time no commit can have had says nothing
                out.tables.setdefault(table, Behind()).add(rows, ts)
                out.total.add(rows, ts)
            if reader.drained:
                break
        if scanned >= limit and reader.pending > 0:
            out.capped = True
            out.total.messages += reader.pending  # not read: counted, not split by table
    finally:
        await reader.close()
    return out


def client_wants(pattern: str | None, min_ts: int = 0, min_scn: int = 0) -> Callable[[Mapping[str, str]], bool]:
    """What the store hands a client, by a message's headers (`services.store.batches.wanted`): its
    tables (RE2 over db.table), nothing before a rewind's time or order key."""
    try:
        compiled = compile_pattern(pattern or ".*")
    except PatternError:  # the store refused it at subscribe: nothing reaches such a client
        return lambda _: False

    def wanted(headers: Mapping[str, str]) -> bool:
        if min_ts and _int(headers.get(envelope.TS_HEADER)) < min_ts:
            return False
        if min_scn and _int(headers.get(envelope.SCN_HEADER)) < min_scn:
            return False
        return compiled.fullmatch(headers.get(envelope.TABLE_HEADER, "")) is not None

    return wanted


def now_ms() -> int:
    return int(time.time() * 1000)


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0

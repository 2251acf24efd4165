"""Rewind a client to a timestamp, a binlog position or a GTID set (DTS-style seek).

The CDC stream interleaves tables, so no single sequence splits "before" from "after": the
client's cursor goes to just before the first event at or after the point, and the point
itself (`min_ts` / `min_scn`) filters out the older events that follow it in the stream.
For a timestamp the scan starts at the first message JetStream stored at or after it (an
event is always stored after its commit); for a position it starts at the beginning. A GTID
set (MySQL's `uuid:1-5,uuid:tag:1-3`, or MariaDB's GTID state `0-1-100,1-2-7`) names what the
client already has: it goes back to the first transaction not in it. Only headers are read.
`to_start` puts the client at the stream's first message. Every rewind records the stream's
current identity in the client's state: it is also how a client resumes deliberately after
BINLAKE_CDC was defined again (`shared.jetstream.StreamIdentity`).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from services.meta.backend import Conflict, MetaBackend
from shared import cas, envelope, jetstream, keys
from shared.clients import ClientState
from shared.gtid import GtidError, GtidSet
from shared.rpc import BadRequest, RpcError
from shared.subjects import Names


class Rewinder:
    def __init__(self, js: JetStreamContext, names: Names, backend: MetaBackend) -> None:
        self._js = js
        self._names = names
        self._backend = backend

    async def to_timestamp(self, source: str, client: str, ts_ms: int) -> dict[str, Any]:
        try:
            start = dt.datetime.fromtimestamp(ts_ms / 1000, dt.UTC)
        except (ValueError, OverflowError, OSError):
            raise BadRequest(f"timestamp {ts_ms} is not a time in epoch milliseconds") from None
        seq, stream = await self._first(source, lambda h: int(h.get(envelope.TS_HEADER, 0)) >= ts_ms, start_time=start)
        return await self._apply(source, client, seq, stream, min_ts=ts_ms)

    async def to_start(self, source: str, client: str) -> dict[str, Any]:
        """To the first message BINLAKE_CDC holds."""
        ident = await jetstream.stream_identity(self._js, self._names.cdc_stream)
        return await self._apply(source, client, max(1, ident.first_seq), ident.id)

    async def to_position(self, source: str, client: str, position: str) -> dict[str, Any]:
        file, _, offset = position.rpartition(":")
        if not file or not offset.isdigit():
            raise BadRequest(f"position must look like mysql-bin.000042:1234, got {position!r}")
        # A position of the server the parser reads now: its epoch is the parser's (a failover
        # raised it; `services.parser.failover`).
        cursor = await self._backend.get(keys.parser_cursor(source))
        epoch = cursor.value.get("epoch") if cursor is not None else 0
        try:
            target = envelope.scn(file, int(offset), epoch if isinstance(epoch, int) and not isinstance(epoch, bool)
                                  else 0)
        except envelope.EnvelopeError as exc:
            raise BadRequest(str(exc)) from None
        seq, stream = await self._first(source, lambda h: int(h.get(envelope.SCN_HEADER, 0)) >= target)
        return await self._apply(source, client, seq, stream, min_scn=target)

    async def to_gtid(self, source: str, client: str, gtids: str) -> dict[str, Any]:
        """Back to the first message (in stream order) of a transaction not in `gtids`. No order-key
        filter: the stream interleaves tables, so messages after it with lower keys may also be
        missing from the set; those in it come again (at least once, never lost)."""
        has = gtid_set_member(gtids)

        def reached(h: dict[str, str]) -> bool:
            tag = envelope.txn_tag(h)
            return tag is not None and not has(tag[0])

        return await self._apply(source, client, *await self._first(source, reached))

    async def _first(self, source: str, reached: Any, start_time: dt.datetime | None = None) -> tuple[int, str]:
        """The first CDC sequence whose headers satisfy `reached` (or the next sequence to come), and
        the identity of the stream it counts in."""
        ident = await jetstream.stream_identity(self._js, self._names.cdc_stream)
        return await self._scan(source, reached, ident.last_seq, start_time), ident.id

    async def _scan(self, source: str, reached: Any, end: int, start_time: dt.datetime | None) -> int:
        policy = DeliverPolicy.BY_START_TIME if start_time else DeliverPolicy.ALL
        cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=policy, opt_start_time=start_time,
                             headers_only=True, mem_storage=True, inactive_threshold=30.0,
                             filter_subject=self._names.cdc_source_filter(source))
        sub = await self._js.pull_subscribe(cfg.filter_subject or ">", stream=self._names.cdc_stream, config=cfg)
        try:
            while True:
                try:
                    msgs = await sub.fetch(1000, timeout=1.0)
                except nats.errors.TimeoutError:
                    return end + 1
                for m in msgs:
                    if reached(m.headers or {}):
                        return int(m.metadata.sequence.stream)
                if msgs and msgs[-1].metadata.sequence.stream >= end:
                    return end + 1
        finally:
            await sub.unsubscribe()

    async def _apply(self, source: str, client: str, seq: int, stream: str, *, min_ts: int = 0,
                     min_scn: int = 0) -> dict[str, Any]:
        key = keys.client_cursor(source, client)

        async def attempt() -> dict[str, Any]:
            entry = await self._backend.get(key)
            if entry is None:
                raise RpcError("unknown_client", f"client {client!r} has never subscribed to source {source!r}")
            state = ClientState.from_dict(entry.value).rewound(seq - 1, stream=stream, min_ts=min_ts,
                                                                  min_scn=min_scn)
            await self._backend.put(key, state.to_dict(), entry.revision)
            return {"seq": seq, "acked": state.acked}

        return await cas.retry_on_conflict(attempt, conflict=Conflict, tries=10,
                                           what=f"client {client!r} (during the rewind)")





_MARIADB_STATE = re.compile(r"\s*\d+-\d+-\d+\s*(,\s*\d+-\d+-\d+\s*)*")


def gtid_set_member(text: str) -> Callable[[str], bool]:
    """Whether a transaction id (its GTID) is in `text`: a MariaDB GTID state or a MySQL GTID set.

    BadRequest for text that is neither, and for a transaction without a GTID of that kind (a
    source without GTIDs cannot be rewound by GTID).
    """
    if _MARIADB_STATE.fullmatch(text):
        state = {int(d): int(n) for d, _, n in (part.strip().split("-") for part in text.split(","))}

        def mariadb(txn: str) -> bool:
            parts = txn.split("-")
            if len(parts) != 3 or not all(p.isdigit() for p in parts):
                raise BadRequest(f"transaction {txn!r} in the stream has no MariaDB GTID to compare with {text!r}")
            return int(parts[2]) <= state.get(int(parts[0]), 0)

        return mariadb
    try:
        have = GtidSet.parse(text)
    except GtidError as exc:
        raise BadRequest(f"not a GTID set: {exc}") from None

    def mysql(txn: str) -> bool:
        try:
            return have.has(txn)
        except GtidError:
            raise BadRequest(f"transaction {txn!r} in the stream has no MySQL GTID to compare with the set") from None

    return mysql

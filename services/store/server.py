"""The batch protocol over NATS request-reply: subscribe, get, ack, rollback, unsubscribe.

Subjects `<prefix>.store.<source>.<verb>` in queue group `store`. Every client's state
lives in meta (compare-and-set on each change), so any store process can answer any
request and a restarted store loses nothing: clients continue from their last ack. The
only memory is a cache of read positions, checked against meta on every get.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from services.store import batches
from shared import cas, envelope, jetstream, keys, objects
from shared.clients import ClientState
from shared.errors import StreamRedefined
from shared.health import Conditions
from shared.meta_client import Conflict, MetaClient
from shared.metrics import Registry
from shared.ordered_reader import OrderedReader
from shared.rpc import STREAM_REDEFINED, BadRequest, RpcError, require, require_client, serve
from shared.subjects import Names, unescape_token

FETCH = 500
IDLE_S = 300.0  # a client's read-ahead (its consumer and buffer) is dropped after this long unused
STUCK_S = 30.0  # a transaction that stays incomplete this long is handed out in parts (a halted partition)
# To end where no transaction is open, a batch may grow past its row limit, and up to this many
# times its bytes: sink partitions publish in bulk, so a backlog interleaves many transactions.
EXTEND = 4
SPLIT_KEPT = 10_000  # ids of transactions handed out in parts, remembered per client


@dataclass
class _Position:
    """A client's prefetched read position (a cache; meta is the truth)."""

    reader: OrderedReader
    stream: str  # the identity of the BINLAKE_CDC it reads
    buffer: deque[Msg] = field(default_factory=deque)
    used: float = field(default_factory=time.monotonic)
    stuck: float | None = None  # since when gets found only incomplete transactions
    split: set[str] = field(default_factory=set)  # transactions handed out in parts: no longer waited for
    _split_order: deque[str] = field(default_factory=deque)

    def remember_split(self, txn_ids: Iterable[str]) -> None:
        for txn_id in txn_ids:
            if txn_id not in self.split:
                self.split.add(txn_id)
                self._split_order.append(txn_id)
        while len(self._split_order) > SPLIT_KEPT:
            self.split.discard(self._split_order.popleft())

    @property
    def next_seq(self) -> int:
        return self.buffer[0].metadata.sequence.stream if self.buffer else self.reader.next_seq


class StoreServer:
    def __init__(self, nc: NATS, js: JetStreamContext, names: Names, source: str, meta: MetaClient,
                 registry: Registry, max_batch_rows: int, *, max_batch_bytes: int = 64 * 1024 * 1024,
                 prefetch_bytes: int | None = None, health: Conditions | None = None) -> None:
        """`health`: where requests it cannot answer (its stream unreadable, meta away) are reported."""
        self._nc = nc
        self._health = health
        self._js = js
        self._names = names
        self._source = source
        self._meta = meta
        self._max_rows = max_batch_rows
        self._max_bytes = max_batch_bytes
        self._prefetch_bytes = prefetch_bytes
        self._positions: dict[str, _Position] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._swept = time.monotonic()
        self._subs: list[Subscription] = []
        self._batches = registry.counter("store_batches_total", "Batches delivered")
        self._rows = registry.counter("store_rows_total", "Rows delivered in batches")
        self._acks = registry.counter("store_acks_total", "Batches acked")
        self._gaps = registry.counter("store_retention_gaps_total",
                                      "Gets refused: messages a client had not read were removed")
        self._redefined = registry.counter("store_stream_redefined_total",
                                           "Gets refused: BINLAKE_CDC was defined again since the client's position")
        self._errors = registry.counter("store_protocol_errors_total", "Requests refused")
        self.log = structlog.get_logger().bind(actor="store")

    async def start(self) -> None:
        for verb, handler in (("subscribe", self.subscribe), ("ack", self.ack), ("rollback", self.rollback),
                              ("unsubscribe", self.unsubscribe), ("get", self.get)):
            base = self._names.store_rpc(self._source, verb)
            split = ("events", "seqs") if verb == "get" else ()
            # `<verb>` serves any client (operators' tools); `<verb>.<client>` only the client it
            # names, so that NATS permissions can give an application just its own subjects.
            self._subs.append(await serve(self._nc, base, self._counted(handler), queue="store", split_fields=split,
                                          health=self._health))
            self._subs.append(await serve(self._nc, f"{base}.*", self._counted(handler), queue="store",
                                          split_fields=split, bind=self._own_client,
                                          caller=self._names.client_of_store_rpc, health=self._health))

    def _own_client(self, subject: str, req: dict[str, Any]) -> dict[str, Any]:
        named = self._names.client_of_store_rpc(subject)
        if "client" not in req and named is not None:
            return {**req, "client": named}
        if req.get("client") != named:
            raise BadRequest(f"the request names client {str(req.get('client'))[:40]!r} on the subject of client "
                             f"{str(named)[:40]!r}")
        return req

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        for pos in self._positions.values():
            await pos.reader.close()

    def _counted(self, handler: Any) -> Any:
        async def wrapped(req: dict[str, Any]) -> dict[str, Any]:
            try:
                return dict(await handler(req))
            except RpcError:
                self._errors.inc()
                raise
        return wrapped

    # -- state --------------------------------------------------------------------------

    async def _load(self, client: str) -> tuple[ClientState, int]:
        entry = await self._meta.get(keys.client_cursor(self._source, client))
        if entry is None:
            raise RpcError("unknown_client", f"client {client!r} is not subscribed; call subscribe first")
        return ClientState.from_dict(entry.value), entry.revision

    async def _save(self, state: ClientState, revision: int | None, *, rewind: bool = False) -> None:
        await self._meta.put(keys.client_cursor(self._source, state.client), state.to_dict(), revision, order="seq",
                             rewind=rewind)

    def _lock(self, client: str) -> asyncio.Lock:
        return self._locks.setdefault(client, asyncio.Lock())

    async def _sweep(self) -> None:
        """Forget the read-ahead of clients gone quiet (a cache: meta holds their state)."""
        now = time.monotonic()
        if now - self._swept < IDLE_S / 10:
            return
        self._swept = now
        for client, pos in list(self._positions.items()):
            if now - pos.used > IDLE_S and not self._lock(client).locked():
                del self._positions[client]
                await pos.reader.close()

    # -- verbs --------------------------------------------------------------------------

    async def subscribe(self, req: dict[str, Any]) -> dict[str, Any]:
        """Create the client, or re-subscribe: keep its last ack, change its filter, roll back."""
        client = require_client(req)
        pattern = str(req.get("filter") or ".*")
        batches.compile_filter(pattern)
        start = req.get("start", "earliest")
        _check_start(start)
        async with self._lock(client):
            entry = await self._meta.get(keys.client_cursor(self._source, client))
            if entry is not None and not req.get("reset"):
                state = ClientState.from_dict(entry.value)
                new = ClientState(client, pattern, state.acked, state.acked, (), state.min_ts, state.min_scn,
                                  state.epoch + 1, state.stream)
                await self._save(new, entry.revision)
                return {"acked": new.acked, "created": False}
            seq, rewind_to, stream = await self._start_seq(start)
            new = ClientState(client, pattern, seq, seq, (), 0, 0, (ClientState.from_dict(entry.value).epoch + 1
                                                                    if entry else 0), stream)
            await self._save(new, entry.revision if entry else None, rewind=True)
        if rewind_to is not None:
            result = await self._meta.rewind(self._source, client, **rewind_to)
            return {"acked": result["acked"], "created": True}
        return {"acked": seq, "created": True}

    async def _start_seq(self, start: Any) -> tuple[int, dict[str, Any] | None, str]:
        """Where a new client starts: (acked sequence, the rewind that moves it, the stream's identity)."""
        _check_start(start)
        ident = await jetstream.stream_identity(self._js, self._names.cdc_stream)
        if start == "earliest":
            return 0, None, ident.id
        if start == "latest":
            return ident.last_seq, None, ident.id
        if isinstance(start, dict) and isinstance(start.get("timestamp"), int):
            return 0, {"timestamp_ms": start["timestamp"]}, ident.id
        if isinstance(start, dict) and isinstance(start.get("position"), str):
            return 0, {"position": start["position"]}, ident.id
        raise BadRequest("start must be 'earliest', 'latest', {'timestamp': ms} or {'position': 'file:offset'}")

    async def get(self, req: dict[str, Any]) -> dict[str, Any]:
        client = require_client(req)
        max_rows = require({"max_rows": 1000, **req}, "max_rows", int)
        max_wait = float(require({"max_wait": 1.0, **req}, "max_wait", (int, float)))
        max_bytes = require({"max_bytes": self._max_bytes, **req}, "max_bytes", int)
        if max_rows < 1:
            raise BadRequest("max_rows must be at least 1")
        if max_bytes < 1:
            raise BadRequest("max_bytes must be at least 1")
        # The store's own bounds (BINLAKE_MAX_BATCH_ROWS, BINLAKE_MAX_BATCH_BYTES) hold whatever a client asks.
        max_rows = min(max_rows, self._max_rows)
        max_bytes = min(max_bytes, self._max_bytes)
        if not 0 <= max_wait <= 60:
            raise BadRequest("max_wait must be 0..60 seconds")

        async def attempt() -> dict[str, Any]:
            state, revision = await self._load(client)
            await self._check_stream(state)
            events, seqs, rows, end, partial, full = await self._read(state, max_rows, max_wait, max_bytes)
            if end == state.delivered:
                return {"batch_id": None, "events": [], "seqs": [], "rows": 0, "stream_id": state.stream}
            if not events and not state.batches:
                new = ClientState(state.client, state.filter, end, end, (), state.min_ts, state.min_scn, state.epoch,
                                  state.stream)
                batch_id = None
            else:
                new, batch_id = batches.delivered(state, end), end
            await self._save(new, revision)
            if batch_id is not None:
                self._batches.inc()
                self._rows.inc(rows)
            reply: dict[str, Any] = {"batch_id": batch_id, "events": events, "seqs": seqs, "rows": rows,
                                     "stream_id": state.stream}
            if partial:
                reply["partial"] = True  # it ends inside a source transaction
            if full:
                reply["full"] = True  # it ended at a limit, not at the wait: more was there
            return reply

        async def forget_position() -> None:  # what it read ahead belongs to the state that lost
            stale = self._positions.pop(client, None)
            if stale is not None:
                await stale.reader.close()

        async with self._lock(client):
            return await cas.retry_on_conflict(attempt, conflict=Conflict, tries=5, what=f"client {client!r}",
                                               on_conflict=forget_position)

    async def _check_stream(self, state: ClientState) -> None:
        """Refuse a get while BINLAKE_CDC is not the stream the client's position counts in (defined
        again since, or ending before it): its sequences would name other messages."""
        ident = await jetstream.stream_identity(self._js, self._names.cdc_stream)
        try:
            ident.check(self._names.cdc_stream, state.stream, state.delivered, f"client {state.client!r}",
                        f"binlake rewind {state.client} --to-start (or --to-timestamp / --to-position)")
        except StreamRedefined as exc:
            self._redefined.inc()
            stale = self._positions.pop(state.client, None)
            if stale is not None:
                await stale.reader.close()
            raise RpcError(STREAM_REDEFINED, str(exc)) from None

    async def _read(self, state: ClientState, max_rows: int, max_wait: float,
                    max_bytes: int) -> tuple[list[bytes], list[int], int, int, bool, bool]:
        """Events after `state.delivered` for this client: (envelopes, their CDC sequences, rows, the
        last sequence the batch covers, whether it ends inside a source transaction, whether it
        ended at a limit rather than at the wait).

        A batch ends at `max_rows` rows or once its events hold `max_bytes` (at least one event),
        then at the last place where no source transaction is open (`batches.OpenTxns`). To get
        there it may grow past `max_rows` and up to EXTEND times `max_bytes`; transactions larger
        than that, or one still incomplete after STUCK_S (a halted partition), are handed out in
        parts, marked `partial`. An object reference (a message too large for NATS) counts by its
        object's size (`objects.resolved_size`): the client fetches every object of its batch, so
        that is what it holds, while the store itself only ever holds the small references.
        """
        await self._sweep()
        pos = self._positions.get(state.client)
        if pos is None or pos.next_seq != state.delivered + 1 or pos.stream != state.stream:
            if pos is not None:
                await pos.reader.close()
            reader = OrderedReader(self._js, self._names.cdc_stream, self._names.cdc_source_filter(self._source),
                                   state.delivered + 1, FETCH, max_bytes=self._prefetch_bytes)
            pos = self._positions[state.client] = _Position(reader, state.stream)
        opens = pos.reader.opens
        pos.used = time.monotonic()
        pattern = batches.compile_filter(state.filter)
        events: list[bytes] = []  # the batch so far: up to the last place where no transaction is open
        seqs: list[int] = []
        rows = size = 0
        pending: list[tuple[Msg, bool]] = []  # read since then, and whether each goes to this client
        pending_rows = pending_size = held = 0  # `held`: bytes of everything pending, wanted or not
        open_txns = batches.OpenTxns()
        full = False  # a limit is reached: only open transactions may go on
        taken = end = state.delivered
        deadline = time.monotonic() + max_wait
        while True:
            grown = held + size >= EXTEND * max_bytes  # what it holds, wanted by this client or not
            if grown or rows + pending_rows >= max_rows or size + pending_size >= max_bytes:
                full = True
            if full and (not open_txns or grown):
                break
            if not pos.buffer:
                # Wait up to max_wait for the batch to fill (Canal's get(batchSize, timeout)).
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                pos.buffer.extend(await pos.reader.fetch(wait_s=max(0.01, remaining)))
                continue
            m = pos.buffer[0]
            headers = m.headers or {}
            parts = m.subject.split(".")
            wanted = batches.wanted((unescape_token(parts[-2]), unescape_token(parts[-1]))
                                    if parts[-2] != "$binlake" else ("$binlake", parts[-1]), headers, state, pattern)
            cost = objects.resolved_size(m.data) if wanted else len(m.data)
            if (events or pending) and held + size + cost > EXTEND * max_bytes:
                full = True  # not past what a batch may grow to (an object can be as large as a batch)
                break
            pos.buffer.popleft()
            seq = m.metadata.sequence.stream
            # One source per prefix: the source's subjects are the whole stream, so its sequences
            # are contiguous. A jump is retention (or a removal) ahead of this client. A client
            # that never read anything starts wherever the stream starts.
            if seq != end + 1 and end > 0:
                self._gaps.inc()
                await pos.reader.close()
                self._positions.pop(state.client, None)
                raise batches.RetentionGap(state.client, end + 1, seq, self._names.cdc_stream)
            end = seq
            tag = envelope.txn_tag(headers)
            open_txns.add(None if tag is None or tag[0] in pos.split else tag)
            pending.append((m, wanted))
            held += cost
            if wanted:
                pending_size += cost
                pending_rows += int(headers.get(envelope.ROWS_HEADER, 0))
            if not open_txns:  # a transaction boundary: what is pending belongs to the batch
                for pm, pw in pending:
                    if pw:
                        events.append(pm.data)
                        seqs.append(pm.metadata.sequence.stream)
                taken, rows, size = seq, rows + pending_rows, size + pending_size
                pending, pending_rows, pending_size, held = [], 0, 0, 0
        partial = False
        if pending:
            now = time.monotonic()
            if taken > state.delivered:
                pass  # the rest waits for its transactions' other messages
            elif full or (pos.stuck is not None and now - pos.stuck >= STUCK_S):
                # Larger than a batch may grow, or waiting for a halted partition (or for messages
                # before this client's start): handed out in parts; those transactions count as
                # split from now on, so their other messages do not hold up later batches.
                partial = True
                pos.remember_split(open_txns.seen)
                self.log.warning("store.partial_batch", client=state.client, open_transactions=len(open_txns.seen),
                                 reason="too large for one batch" if full else f"incomplete for {STUCK_S:g}s")
                events += [pm.data for pm, pw in pending if pw]
                seqs += [pm.metadata.sequence.stream for pm, pw in pending if pw]
                taken, rows = end, rows + pending_rows
                pending = []
            else:
                pos.stuck = pos.stuck if pos.stuck is not None else now
        if pending:
            pos.buffer.extendleft(pm for pm, _ in reversed(pending))
        if taken > state.delivered:
            pos.stuck = None
        if pos.reader.opens > max(opens, 1):  # a consumer made during this get may read a stream defined again
            await self._check_stream(state)
        return events, seqs, rows, taken, partial, full

    async def ack(self, req: dict[str, Any]) -> dict[str, Any]:
        client = require_client(req)
        batch_id = require(req, "batch_id", int)

        async def attempt() -> dict[str, Any]:
            state, revision = await self._load(client)
            new = batches.acked(state, batch_id)
            await self._save(new, revision)
            self._acks.inc()
            return {"acked": new.acked}

        async with self._lock(client):
            return await cas.retry_on_conflict(attempt, conflict=Conflict, tries=5, what=f"client {client!r}")

    async def rollback(self, req: dict[str, Any]) -> dict[str, Any]:
        client = require_client(req)

        async def attempt() -> dict[str, Any]:
            state, revision = await self._load(client)
            new = state.rolled_back()
            await self._save(new, revision)
            return {"acked": new.acked}

        async with self._lock(client):
            return await cas.retry_on_conflict(attempt, conflict=Conflict, tries=5, what=f"client {client!r}")

    async def unsubscribe(self, req: dict[str, Any]) -> dict[str, Any]:
        client = require_client(req)
        await self._meta.delete(keys.client_cursor(self._source, client))
        pos = self._positions.pop(client, None)
        if pos is not None:
            await pos.reader.close()
        return {}


def _check_start(start: Any) -> None:
    ok = start in ("earliest", "latest") or (
        isinstance(start, dict) and len(start) == 1
        and (isinstance(start.get("timestamp"), int) or isinstance(start.get("position"), str)))
    if not ok:
        raise BadRequest("start must be 'earliest', 'latest', {'timestamp': ms} or {'position': 'file:offset'}")

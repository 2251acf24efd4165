"""Pure: the batch protocol's rules on a client's state (DESIGN §6, Canal's get/ack/rollback).

A batch id is the CDC sequence its batch ends at; ids of one client grow, so "already
acked" is `id <= acked`, and only the oldest unacked batch may be acked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shared import envelope
from shared.clients import MAX_FILTER, ClientState
from shared.patterns import Pattern, PatternError, compile_pattern
from shared.rpc import RETENTION_GAP, BadRequest, RpcError


class ProtocolError(RpcError):
    """The client broke the protocol (ack out of order, unknown batch...)."""


class RetentionGap(RpcError):
    """BINLAKE_CDC no longer holds messages this client has not read: never skip them silently."""

    def __init__(self, client: str, first_missing: int, next_held: int, stream: str) -> None:
        super().__init__(
            RETENTION_GAP,
            f"{stream} no longer holds sequences {first_missing}..{next_held - 1}, which client {client!r} has not "
            f"read (removed by the stream's limits, BINLAKE_CDC_MAX_AGE_S / BINLAKE_CDC_MAX_BYTES, or by hand): "
            "those changes are lost to this client. Load the affected tables again (binlake snapshot) and "
            "rewind the client past the gap (binlake rewind), or raise the limits so it cannot happen again")


def compile_filter(pattern: str) -> Pattern:
    """A client's table filter, in RE2 (`shared.patterns`): no client's pattern (`(.|.)*Z`) can
    stall the store's event loop for the others."""
    if len(pattern) > MAX_FILTER:
        raise BadRequest(f"filter has {len(pattern)} characters; at most {MAX_FILTER}")
    try:
        return compile_pattern(pattern)
    except PatternError as exc:
        raise BadRequest(f"filter {exc}") from None


def delivered(state: ClientState, end: int) -> ClientState:
    """Record a new batch that ends at CDC sequence `end`."""
    if end <= state.delivered:
        raise ValueError(f"batch end {end} is not after delivered {state.delivered}")
    return replace(state, delivered=end, batches=(*state.batches, end))


def acked(state: ClientState, batch_id: int) -> ClientState:
    """Ack the oldest unacked batch; anything else is a ProtocolError naming the problem."""
    if batch_id <= state.acked:
        raise ProtocolError("already_acked", f"batch {batch_id} is already acked (acked up to {state.acked})")
    if batch_id not in state.batches:
        raise ProtocolError("unknown_batch", f"batch {batch_id} is unknown to client {state.client!r} "
                                             "(never delivered, or rolled back)")
    first = state.batches[0]
    if batch_id != first:
        raise ProtocolError("out_of_order", f"batch {batch_id} is not the first unacked batch; ack {first} first")
    return replace(state, acked=batch_id, batches=state.batches[1:])


def wanted(subject_tokens: tuple[str, str], headers: dict[str, str], state: ClientState,
           pattern: Pattern) -> bool:
    """Whether an event (by its CDC subject's db/table and headers) goes to this client."""
    db, table = subject_tokens
    if db == "$binlake":
        return False  # heartbeats and table-less DDL are binlake's own business
    if state.min_ts and int(headers.get(envelope.TS_HEADER, 0)) < state.min_ts:
        return False
    if state.min_scn and int(headers.get(envelope.SCN_HEADER, 0)) < state.min_scn:
        return False
    return pattern.fullmatch(f"{db}.{table}") is not None


@dataclass
class OpenTxns:
    """Source transactions with some of their messages seen and not all (`Binlake-Txn` headers).

    A transaction's messages reach BINLAKE_CDC through several sink partitions, interleaved with
    other transactions; it is whole once it has as many messages as its last one's index says
    (the sink stands a marker for every message its rules drop). A batch may end only where
    nothing is open, so the lake never shows half a transaction.
    """

    seen: dict[str, int] = field(default_factory=dict)
    expected: dict[str, int] = field(default_factory=dict)

    def add(self, tag: tuple[str, int, bool] | None) -> None:
        if tag is None:
            return  # a heartbeat, or a message from before the header: a transaction of its own
        txn_id, i, last = tag
        n = self.seen.get(txn_id, 0) + 1
        if last:
            self.expected[txn_id] = i + 1
        if n >= self.expected.get(txn_id, n + 1):
            self.seen.pop(txn_id, None)
            self.expected.pop(txn_id, None)
        else:
            self.seen[txn_id] = n

    def __bool__(self) -> bool:
        return bool(self.seen)

    def copy(self) -> OpenTxns:
        return OpenTxns(dict(self.seen), dict(self.expected))

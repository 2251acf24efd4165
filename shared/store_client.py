"""Async client of the store's batch protocol (Canal's streaming API over NATS).

```python
async with await StoreClient.connect("nats://127.0.0.1:4222", client="my-app") as c:
    await c.subscribe(filter=r"shop\\..*", start="earliest")
    async for batch in c.batches(max_rows=5000):
        for event in batch.events:
            handle(event)              # the DESIGN §4 envelope, decoded
        await c.ack(batch.id)          # strictly in order; or c.rollback() to get them again
```

Several `get`s may be outstanding; `ack` must name the oldest unacked batch. A client that
disconnects without acking gets its unacked batches again after `subscribe`. An event larger
than a NATS message comes from the CDC objects bucket (`shared.objects`): `get` fetches it, so
`raw` always holds whole envelopes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from nats.aio.client import Client as NATS

from shared import clients, envelope, jetstream, objects
from shared.errors import ConfigError, StreamRedefined
from shared.rpc import STREAM_REDEFINED, RpcError, call, call_parts
from shared.subjects import Names


@dataclass(frozen=True)
class Batch:
    """A batch of events; `id` is None for an empty batch (nothing to ack)."""

    id: int | None
    raw: list[bytes]
    rows: int
    seqs: list[int]  # the BINLAKE_CDC sequence of each event
    partial: bool = False  # it ends inside a source transaction (one too large for a batch, or stuck)
    stream: str = ""  # the identity of the BINLAKE_CDC `seqs` count in (`shared.jetstream.StreamIdentity`)
    full: bool = False  # it ended at a limit (rows, bytes), not at the wait: more was waiting in the store

    @property
    def events(self) -> list[dict[str, Any]]:
        return [envelope.as_dict(envelope.decode(e)) for e in self.raw]


class StoreClient:
    def __init__(self, nc: NATS, client: str, *, source: str = "main", prefix: str = "binlake",
                 timeout_s: float = 10.0, own_connection: bool = False, api_prefix: str = "$JS.API") -> None:
        """`api_prefix`: the JetStream API's subjects in this user's account (`$JS.binlake.API` in
        binlake's client accounts, shared.permissions), for events larger than a NATS message."""
        if problem := clients.name_problem(client):
            raise ConfigError(f"client {client[:40]!r}: {problem}")
        self._nc = nc
        self.client = client
        self._names = Names(prefix)
        self._source = source
        self._timeout = timeout_s
        self._own = own_connection
        self._js = nc.jetstream(prefix=api_prefix)

    @classmethod
    async def connect(cls, nats_url: str, client: str, **kwargs: Any) -> StoreClient:
        nc = await jetstream.connect(nats_url, name=f"binlake-client-{client}")
        return cls(nc, client, own_connection=True, **kwargs)

    async def __aenter__(self) -> StoreClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own:
            await self._nc.drain()

    async def _call(self, verb: str, req: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return await call(self._nc, self._names.store_client_rpc(self._source, verb, self.client),
                          {"client": self.client, **req}, timeout or self._timeout)

    async def subscribe(self, filter: str = ".*", start: str | dict[str, Any] = "earliest", *,
                        reset: bool = False) -> int:
        """Start (or resume) reading; returns the acked CDC sequence the client continues after.

        `start`: "earliest", "latest", {"timestamp": ms} or {"position": "mysql-bin.000042:1234"};
        it applies when the client is new or `reset` is set, otherwise the client resumes at its last ack.
        """
        reply = await self._call("subscribe", {"filter": filter, "start": start, "reset": reset}, self._timeout * 3)
        return int(reply["acked"])

    async def get(self, max_rows: int = 1000, max_wait: float = 1.0, max_bytes: int | None = None) -> Batch:
        """The next batch: at most `max_rows` rows, and at most `max_bytes` of events when given
        (at least one event; up to 4 times that to end on a transaction boundary), an event larger
        than a message counted by its object's size, since it is fetched here.
        StreamRedefined when BINLAKE_CDC was defined again since the client's position."""
        req: dict[str, Any] = {"client": self.client, "max_rows": max_rows, "max_wait": max_wait}
        if max_bytes is not None:
            req["max_bytes"] = max_bytes
        try:
            reply = await call_parts(self._nc, self._names.store_client_rpc(self._source, "get", self.client), req,
                                     ("events", "seqs"), timeout=self._timeout + max_wait)
        except RpcError as exc:
            if exc.code == STREAM_REDEFINED:
                raise StreamRedefined(str(exc)) from None
            raise
        raw = list(reply.get("events") or [])
        for i, data in enumerate(raw):
            if objects.maybe_reference(data):
                raw[i] = await objects.resolve(self._js, data, self._names.cdc_objects_bucket)
        return Batch(reply.get("batch_id"), raw, int(reply.get("rows", 0)), [int(s) for s in reply.get("seqs") or []],
                     bool(reply.get("partial")), str(reply.get("stream_id") or ""), bool(reply.get("full")))

    async def ack(self, batch_id: int) -> int:
        return int((await self._call("ack", {"batch_id": batch_id}))["acked"])

    async def rollback(self) -> int:
        return int((await self._call("rollback", {}))["acked"])

    async def unsubscribe(self) -> None:
        await self._call("unsubscribe", {})

    async def batches(self, max_rows: int = 1000, max_wait: float = 1.0,
                      max_bytes: int | None = None) -> AsyncIterator[Batch]:
        """Non-empty batches, forever; the caller acks each one."""
        while True:
            batch = await self.get(max_rows, max_wait, max_bytes)
            if batch.id is not None:
                yield batch

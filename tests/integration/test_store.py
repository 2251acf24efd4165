"""The store's batch protocol end to end (DESIGN §6).

MariaDB -> parser -> BINLAKE_RAW -> sink -> BINLAKE_CDC -> store (+ meta for the client
cursors), every service a real process; the test is a client through
`shared.store_client.StoreClient`. What a client receives is compared with the content of
BINLAKE_CDC for its filter: same events, same order, each exactly once.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS

from services.launcher.processes import ServiceProcess
from services.launcher.servers import free_port
from services.ops import status
from services.store.config import StoreConfig
from services.store.server import EXTEND
from shared import envelope, jetstream
from shared.errors import NatsUnavailable, StreamRedefined
from shared.meta_client import MetaClient
from shared.rpc import RpcError
from shared.store_client import Batch, StoreClient
from shared.subjects import Names
from tests.integration.conftest import ParserFactory
from tests.integration.support import StoredMsg, binlake_cli, http_get, read_stream
from tests.servers import MariaDB, NatsServer

T = TypeVar("T")
MAX_BATCH_ROWS = 1_000_000  # the store's default limit
DEFAULT_BATCH_BYTES = StoreConfig.max_batch_bytes


@dataclass
class Stack:
    nats_url: str
    nc: NATS
    mariadb: MariaDB
    db: str
    meta: ServiceProcess
    store: ServiceProcess
    store_port: int = 0  # of /metrics and /healthz

    def table_filter(self, table: str = "t") -> str:
        return rf"{re.escape(self.db)}\.{table}"

    def client(self, name: str, timeout_s: float = 20.0) -> StoreClient:
        return StoreClient(self.nc, name, timeout_s=timeout_s)

    async def sql(self, *statements: str) -> None:
        await asyncio.to_thread(self.mariadb.execute, *statements)

    async def cdc(self, table: str | None = "t") -> list[StoredMsg]:
        """This test's events in BINLAKE_CDC (of one table, or of every table), in stream order."""
        return [m for m in await read_stream(self.nats_url, "BINLAKE_CDC")
                if m.env.get("db") == self.db and (table is None or m.env.get("table") == table)]

    async def wait_cdc(self, rows: int, table: str | None = "t", timeout: float = 90) -> list[StoredMsg]:
        """Wait until BINLAKE_CDC holds `rows` row changes of the table; return its events."""
        async def enough() -> list[StoredMsg] | None:
            msgs = await self.cdc(table)
            return msgs if msgs and sum(len(m.env.get("rows") or ()) for m in msgs) >= rows else None

        return await wait_for(enough, timeout, f"{rows} rows of {self.db}.{table} in BINLAKE_CDC")  # type: ignore[no-any-return]


async def wait_for(check: Callable[[], Awaitable[Any]], timeout: float, what: str, interval: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
        except (NatsUnavailable, RpcError, nats.errors.Error, OSError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last!r})")
        await asyncio.sleep(interval)


async def retrying(op: Callable[[], Awaitable[T]], what: str, timeout: float = 120) -> T:
    """Run `op` until it does not fail with unavailable (a service is down or restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await op()
        except NatsUnavailable:
            pass
        except RpcError as exc:
            if exc.code != "unavailable":
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still unavailable after {timeout}s")
        await asyncio.sleep(0.3)


async def raw_request(nc: NATS, verb: str, data: bytes, timeout: float = 15) -> dict[str, Any]:
    reply = await nc.request(Names().store_rpc("main", verb), data, timeout=timeout)
    body: dict[str, Any] = msgpack.unpackb(reply.data, raw=False)
    return body


async def wait_services(nc: NATS, meta: ServiceProcess, store: ServiceProcess | None = None) -> None:
    """Until meta (and the store) answer (an unknown client is a fine answer)."""
    async def answers() -> bool:
        for p in (meta, store):
            assert p is None or p.running, p.output[-3000:]
        await MetaClient(nc).get("probe")
        if store is not None:
            try:
                await StoreClient(nc, "probe").rollback()
            except RpcError as exc:
                if exc.code != "unknown_client":
                    raise
        return True

    await wait_for(answers, 60, "meta and store to answer")


@pytest.fixture
async def services(
        mariadb: MariaDB, database: str, service_factory: Callable[..., ServiceProcess],
        nats_url: str) -> AsyncIterator[Stack]:
    """meta and store only (BINLAKE_CDC stays empty)."""
    meta = service_factory("services.meta", "meta")
    nc = await nats.connect(nats_url)
    try:
        # meta creates BINLAKE_CDC first: started together, the store may crash on the creation race
        # (see test_store_retention_survives_the_stream_creation_race)
        await wait_services(nc, meta)
        port = free_port()
        store = service_factory("services.store", "store", BINLAKE_METRICS_PORT=str(port))
        await wait_services(nc, meta, store)
        yield Stack(nats_url, nc, mariadb, database, meta, store, port)
    finally:
        await nc.close()


@pytest.fixture
async def stack(services: Stack, parser_factory: ParserFactory, sink_factory: Callable[..., ServiceProcess]) -> Stack:
    """The whole pipeline: parser and one sink in front of meta and store."""
    await asyncio.to_thread(parser_factory)
    sink_factory("sink")
    return services


def key(env: dict[str, Any]) -> tuple[Any, ...]:
    return (env["table"], env["op"], env["scn"], env.get("chunk", 0))


def keys(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [key(e) for e in events]


def cdc_keys(msgs: list[StoredMsg]) -> list[tuple[Any, ...]]:
    return [key(m.env) for m in msgs]


def row_count(events: list[dict[str, Any]]) -> int:
    return sum(len(e.get("rows") or ()) for e in events)


def ids_of(events: list[dict[str, Any]]) -> list[int]:
    """The `id` column of every row, in order."""
    return [(r.get("after") or r["before"])["id"] for e in events for r in e.get("rows") or ()]


def inserts(db: str, first: int, count: int, rows_per: int = 1, phase: int = 0, table: str = "t") -> list[str]:
    out = []
    for i in range(count):
        start = first + i * rows_per
        values = ", ".join(f"({n}, {phase}, 'n{n}')" for n in range(start, start + rows_per))
        out.append(f"INSERT INTO `{db}`.`{table}` (id, phase, note) VALUES {values}")
    return out


def create(db: str, table: str = "t") -> str:
    return f"CREATE TABLE `{db}`.`{table}` (id INT PRIMARY KEY, phase INT, note VARCHAR(40))"


async def drain(c: StoreClient, max_rows: int = 1000, *, ack: bool = True, max_wait: float = 0.5,
                idle: int = 2, max_bytes: int | None = None) -> list[Batch]:
    """Get batches until `idle` gets in a row bring no events; ack each one if `ack`."""
    out: list[Batch] = []
    quiet = 0
    while quiet < idle:
        b = await c.get(max_rows, max_wait, max_bytes)
        if b.id is not None:
            out.append(b)
            if ack:
                assert await c.ack(b.id) == b.id
        quiet = 0 if b.events else quiet + 1
    return [b for b in out if b.events or not ack]


def events_of(batches: list[Batch]) -> list[dict[str, Any]]:
    return [e for b in batches for e in b.events]


def check_batch(b: Batch, max_rows: int) -> None:
    """Rows are counted, and a batch only goes past max_rows with its last (whole) message."""
    events = b.events
    assert b.rows == row_count(events)
    if events:
        assert b.rows - len(events[-1].get("rows") or ()) < max_rows


async def refused(op: Awaitable[Any], code: str, text: str) -> RpcError:
    with pytest.raises(RpcError) as info:
        await op
    assert info.value.code == code, (info.value.code, str(info.value))
    assert text in str(info.value), str(info.value)
    return info.value


# -- subscribe and get ------------------------------------------------------------------------


@pytest.mark.timeout(240)
async def test_subscribe_starts_and_batches(stack: Stack) -> None:
    db = stack.db
    await stack.sql(create(db, "t"), create(db, "u"),
                    *inserts(db, 1, 10, rows_per=3), *inserts(db, 1000, 5, table="u"))
    await stack.wait_cdc(5, "u")
    msgs = await stack.wait_cdc(30)
    assert [m.env["op"] for m in msgs] == ["ddl"] + ["i"] * 10

    # earliest, with a table filter (full match: t, not u), small batches, acked one by one
    c = stack.client("early")
    assert await c.subscribe(filter=stack.table_filter("t"), start="earliest") == 0
    batches = await drain(c, max_rows=7)
    for b in batches:
        check_batch(b, 7)
    assert [b.id for b in batches] == sorted({b.id or 0 for b in batches})  # ids grow
    assert keys(events_of(batches)) == cdc_keys(msgs)
    assert events_of(batches) == [m.env for m in msgs]  # whole envelopes, unchanged
    assert ids_of(events_of(batches)) == list(range(1, 31))

    # max_rows=1 with 3-row messages: a message is never split, one message per batch
    one = stack.client("one")
    await one.subscribe(filter=stack.table_filter("t"))
    singles = await drain(one, max_rows=1)
    rows_only = [b for b in singles if b.rows]
    assert [len([e for e in b.events if e.get("rows")]) for b in rows_only] == [1] * 10
    assert all(b.rows == 3 for b in rows_only)
    assert keys(events_of(singles)) == cdc_keys(msgs)

    # max_bytes=1: one message per batch, whatever max_rows allows
    small = stack.client("small")
    await small.subscribe(filter=stack.table_filter("t"))
    by_bytes = await drain(small, max_rows=1000, max_bytes=1)
    assert [len(b.events) for b in by_bytes if b.rows] == [1] * 10
    assert keys(events_of(by_bytes)) == cdc_keys(msgs)

    # a filter on every table of the database gets both tables, in stream order
    both = stack.client("both")
    await both.subscribe(filter=rf"{re.escape(db)}\..*")
    all_msgs = await stack.cdc(None)
    assert keys(events_of(await drain(both, max_rows=50))) == cdc_keys(all_msgs)

    # several gets in flight, then acks in order
    many = stack.client("many")
    await many.subscribe(filter=stack.table_filter("t"))
    got = await asyncio.gather(*(many.get(max_rows=5, max_wait=2) for _ in range(4)))
    got = sorted((b for b in got if b.id is not None), key=lambda b: b.id or 0)
    assert len(got) == 4 and len({b.id for b in got}) == 4
    for b in got:
        check_batch(b, 5)
    prefix = events_of(got)
    assert keys(prefix) == cdc_keys(msgs)[:len(prefix)]
    for b in got:
        assert await many.ack(b.id) == b.id  # type: ignore[arg-type]
    rest = await drain(many, max_rows=5)
    assert keys(prefix + events_of(rest)) == cdc_keys(msgs)

    # latest: only what comes after the subscribe
    late = stack.client("late")
    await late.subscribe(filter=stack.table_filter("t"), start="latest")
    assert events_of(await drain(late, idle=1)) == []
    await stack.sql(*inserts(db, 100, 4, rows_per=2, phase=2))
    msgs = await stack.wait_cdc(38)
    late_events = events_of(await drain(late, max_rows=3))
    assert ids_of(late_events) == list(range(100, 108))
    assert keys(late_events) == cdc_keys(msgs)[-4:]

    # position: from the first event at or after a binlog position
    target = msgs[5].env
    pos = f"{target['pos']['file']}:{target['pos']['offset']}"
    assert target["scn"] == envelope.scn(target["pos"]["file"], target["pos"]["offset"])
    at_pos = stack.client("at-pos")
    await at_pos.subscribe(filter=stack.table_filter("t"), start={"position": pos})
    assert keys(events_of(await drain(at_pos))) == cdc_keys(msgs)[5:]

    # timestamp: from the first event committed at or after it (here: everything, it is old)
    at_ts = stack.client("at-ts")
    await at_ts.subscribe(filter=stack.table_filter("t"), start={"timestamp": msgs[0].env["ts"] - 1000})
    assert keys(events_of(await drain(at_ts))) == cdc_keys(msgs)
    future = stack.client("future")
    await future.subscribe(filter=stack.table_filter("t"), start={"timestamp": int(time.time() * 1000) + 3_600_000})
    assert events_of(await drain(future, idle=1)) == []

    # re-subscribing resumes at the last ack, whatever start says; reset starts over
    assert await c.subscribe(filter=stack.table_filter("t"), start="latest") >= batches[-1].id  # type: ignore[operator]
    assert ids_of(events_of(await drain(c))) == list(range(100, 108))
    await c.subscribe(filter=stack.table_filter("t"), start="earliest", reset=True)
    assert keys(events_of(await drain(c, max_rows=100))) == cdc_keys(msgs)

    # unsubscribe forgets the client
    await c.unsubscribe()
    await refused(c.get(), "unknown_client", "is not subscribed; call subscribe first")


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
async def test_protocol_errors_are_clear(stack: Stack) -> None:
    db = stack.db
    await stack.sql(create(db), *inserts(db, 1, 12, rows_per=2))
    msgs = await stack.wait_cdc(24)

    # unknown client: every verb but subscribe
    ghost = stack.client("ghost")
    for op in (ghost.get(max_wait=0), ghost.ack(5), ghost.rollback()):
        await refused(op, "unknown_client", "client 'ghost' is not subscribed; call subscribe first")

    c = stack.client("strict")
    await c.subscribe(filter=stack.table_filter())
    b1 = await c.get(max_rows=4)
    b2 = await c.get(max_rows=4)
    b3 = await c.get(max_rows=4)
    assert b1.id is not None and b2.id is not None and b3.id is not None and b1.id < b2.id < b3.id
    # out of order
    for wrong in (b2.id, b3.id):
        await refused(c.ack(wrong), "out_of_order", f"batch {wrong} is not the first unacked batch; ack {b1.id} first")
    # unknown: never delivered, between two batches, in the future
    between = [i for i in range(b1.id + 1, b3.id) if i != b2.id][:1]
    for unknown in (*between, b3.id + 10_000, 2**40):
        await refused(c.ack(unknown), "unknown_batch", f"batch {unknown} is unknown to client 'strict'")
    assert await c.ack(b1.id) == b1.id
    # already acked
    for old in (b1.id, b1.id - 1, 0):
        await refused(c.ack(old), "already_acked", f"batch {old} is already acked (acked up to {b1.id})")
    assert await c.ack(b2.id) == b2.id
    await refused(c.ack(b2.id), "already_acked", f"acked up to {b2.id}")
    # rolled back batches are unknown
    assert await c.rollback() == b2.id
    await refused(c.ack(b3.id), "unknown_batch", "never delivered, or rolled back")
    # after all that, the client still reads everything exactly once
    rest = await drain(c, max_rows=4)
    assert keys(b1.events + b2.events + events_of(rest)) == cdc_keys(msgs)

    # malformed requests, sent raw: each verb answers bad_request with the reason
    nc = stack.nc
    for verb in ("subscribe", "get", "ack", "rollback", "unsubscribe"):
        for data, text in ((b"\xc1", "request is not msgpack"), (b"\x92\x01\x02", "request must be a msgpack map"),
                           (msgpack.packb("client"), "request must be a msgpack map"),
                           (msgpack.packb({}), "missing field 'client'"),
                           (msgpack.packb({"client": 5}), "field 'client' must be str, got int"),
                           (msgpack.packb({"client": None}), "field 'client' must be str, got NoneType"),
                           (msgpack.packb({"client": b"x"}), "field 'client' must be str, got bytes")):
            body = await raw_request(nc, verb, data)
            assert body["ok"] is False and body["code"] == "bad_request", (verb, data, body)
            assert text in body["error"], (verb, body)
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("ack", {"client": "strict"}, "missing field 'batch_id'"),
        ("ack", {"client": "strict", "batch_id": "7"}, "field 'batch_id' must be int, got str"),
        ("ack", {"client": "strict", "batch_id": True}, "field 'batch_id' must be int, got bool"),
        ("ack", {"client": "strict", "batch_id": 1.5}, "field 'batch_id' must be int, got float"),
        ("subscribe", {"client": "new1", "filter": "("}, "filter '(' is not a valid RE2 regular expression"),
        ("subscribe", {"client": "strict", "filter": "[a-"}, "is not a valid RE2 regular expression"),
        ("subscribe", {"client": "new1", "filter": "x" * 1001}, "filter has 1001 characters; at most 1000"),
        ("subscribe", {"client": "n" * 9000}, "a client name has at most 128 characters, got 9000"),
        ("get", {"client": "tab\tname"}, "a client name has no control characters"),
        ("ack", {"client": "", "batch_id": 1}, "a client name must not be empty"),
        ("subscribe", {"client": "new2", "start": "yesterday"}, "start must be 'earliest', 'latest', {'timestamp'"),
        ("subscribe", {"client": "new3", "start": {"timestamp": "1"}}, "start must be"),
        ("subscribe", {"client": "new4", "start": {"position": 5}}, "start must be"),
        ("subscribe", {"client": "new5", "start": {}}, "start must be"),
        ("subscribe", {"client": "new6", "start": 7}, "start must be"),
        ("get", {"client": "strict", "max_rows": 0}, "max_rows must be at least 1"),
        ("get", {"client": "strict", "max_rows": -5}, "max_rows must be at least 1"),
        ("get", {"client": "ghost", "max_rows": 0}, "max_rows must be"),
        ("get", {"client": "strict", "max_wait": -1}, "max_wait must be 0..60 seconds"),
        ("get", {"client": "strict", "max_wait": 61}, "max_wait must be 0..60 seconds"),
    ]
    for verb, req, text in cases:
        body = await raw_request(nc, verb, msgpack.packb(req))
        assert body["ok"] is False and body["code"] == "bad_request", (verb, req, body)
        assert text in body["error"], (verb, req, body)
    # more rows than the store's bound: served, with at most its bound (as bytes are)
    await stack.client("big").subscribe(filter=stack.table_filter())
    body = await raw_request(nc, "get", msgpack.packb({"client": "big", "max_rows": MAX_BATCH_ROWS + 1}))
    assert body["ok"] is True and 0 < body["rows"] <= MAX_BATCH_ROWS and "full" not in body, body  # ended at the wait
    # a batch that ended at its limit says so (the loader grows its batches while they do)
    await stack.client("small").subscribe(filter=stack.table_filter())
    body = await raw_request(nc, "get", msgpack.packb({"client": "small", "max_rows": 1}))
    assert body["ok"] is True and body["full"] is True, body
    # a refused subscribe creates nothing
    for name in ("new1", "new2", "new3", "new4", "new5", "new6"):
        await refused(stack.client(name).get(max_wait=0), "unknown_client", "is not subscribed")
    # and the protocol errors as raw replies
    body = await raw_request(nc, "ack", msgpack.packb({"client": "strict", "batch_id": 0}))
    assert body == {"ok": False, "code": "already_acked", "error": body["error"]}
    body = await raw_request(nc, "get", msgpack.packb({"client": "nobody"}))
    assert body["ok"] is False and body["code"] == "unknown_client"

    # rewind through meta: bad requests too
    meta = MetaClient(nc)
    await refused(meta.rewind("main", "strict", position="mysql-bin"), "bad_request", "position must look like")
    await refused(meta.rewind("main", "strict", position="nonumber:12"), "bad_request", "binlog file name")
    await refused(meta.rewind("main", "strict"), "bad_request", "give exactly one of 'timestamp'")
    await refused(meta.rewind("main", "c" * 9000, timestamp_ms=1), "bad_request", "at most 128 characters")
    await refused(meta.rewind("main", "strict", timestamp_ms=1, position="mysql-bin.000001:4"), "bad_request",
                  "give exactly one of")
    await refused(meta.rewind("main", "ghost", timestamp_ms=1), "unknown_client", "has never subscribed")
    await refused(meta.rewind("main", "strict", timestamp_ms=1732000000000000 * 1000), "bad_request",
                  "is not a time in epoch milliseconds")  # microseconds by mistake, and then some


# -- rollback and dead clients ------------------------------------------------------------------


@pytest.mark.timeout(240)
async def test_rollback_redelivers_every_unacked_batch_in_order(stack: Stack) -> None:
    db = stack.db
    await stack.sql(create(db), *inserts(db, 1, 20, rows_per=2))
    msgs = await stack.wait_cdc(40)
    c = stack.client("rb")
    await c.subscribe(filter=stack.table_filter())
    first = [await c.get(max_rows=6) for _ in range(4)]
    assert all(b.id is not None for b in first)
    assert await c.ack(first[0].id) == first[0].id  # type: ignore[arg-type]
    unacked = events_of(first[1:])
    assert len(unacked) >= 6
    assert await c.rollback() == first[0].id
    again = await drain(c, max_rows=6, ack=False, idle=2)
    again_events = events_of(again)
    # the unacked batches come again, same events, same order, then the rest
    assert again_events[:len(unacked)] == unacked
    assert keys(first[0].events + again_events) == cdc_keys(msgs)
    # roll back again with nothing acked since: everything after the first batch again
    assert await c.rollback() == first[0].id
    third = await drain(c, max_rows=100)
    assert keys(events_of(third)) == keys(again_events)
    # nothing more after all is acked; a rollback now redelivers nothing
    assert await c.rollback() >= third[-1].id  # type: ignore[operator]
    assert events_of(await drain(c, idle=1)) == []


async def test_messages_removed_before_a_client_read_them_halt_it_loudly(stack: Stack) -> None:
    """Retention (here a purge) ahead of a client: its next get names the gap, never skips it."""
    db = stack.db
    await stack.sql(create(db), *inserts(db, 1, 30))
    msgs = await stack.wait_cdc(30)
    c = stack.client("gap")
    await c.subscribe(filter=stack.table_filter())
    first = await c.get(max_rows=5)
    assert first.id is not None
    await c.ack(first.id)
    keep = msgs[20].seq
    await stack.nc.jetstream().purge_stream("BINLAKE_CDC", seq=keep)  # everything before `keep` is gone
    stack.store.kill()  # what it had read ahead goes with it: the next get reads the stream again
    stack.store.start()
    await wait_services(stack.nc, stack.meta, stack.store)
    err = await refused(c.get(max_rows=5), "retention_gap", f"no longer holds sequences {first.id + 1}..{keep - 1}")
    assert "binlake snapshot" in str(err)
    await refused(c.get(max_rows=5), "retention_gap", "which client 'gap' has not read")  # and stays halted
    # A new client starts where the stream starts now: nothing was owed to it.
    fresh = stack.client("fresh")
    await fresh.subscribe(filter=stack.table_filter(), start="earliest")
    assert ids_of(events_of(await drain(fresh)))[0] == msgs[20].env["rows"][0]["after"]["id"]


@pytest.mark.timeout(300)
async def test_a_client_ahead_of_a_stream_defined_again_halts_until_rewound_to_its_start(stack: Stack) -> None:
    """BINLAKE_CDC deleted and defined again (sequences restart at 1) while a client's position is
    past what the new stream holds: its gets name the redefinition, never skip; `binlake rewind
    --to-start` resumes it deliberately at the new stream's first message."""
    db = stack.db
    await stack.sql(create(db), *inserts(db, 1, 30))
    await stack.wait_cdc(30)
    c = stack.client("reset")
    await c.subscribe(filter=stack.table_filter())
    assert row_count(events_of(await drain(c))) == 30
    js = stack.nc.jetstream()
    healthz = f"http://127.0.0.1:{stack.store_port}/healthz"
    assert await asyncio.to_thread(http_get, healthz) == (200, "ok\n")
    await js.delete_stream("BINLAKE_CDC")
    with pytest.raises(RpcError) as away:  # the store cannot read its stream: /healthz says so
        await c.get(max_rows=5)
    assert away.value.code == "unavailable" and "BINLAKE_CDC does not exist" in str(away.value), away.value
    code, body = await asyncio.to_thread(http_get, healthz)
    assert code == 503 and "BINLAKE_CDC does not exist" in body, body
    await jetstream.ensure_stream(js, jetstream.cdc_stream_config(Names()))  # as `binlake init` does
    await stack.sql(*inserts(db, 31, 5))
    after = await stack.wait_cdc(5)
    assert after[-1].seq < 30  # the new stream's sequences are all at or below the client's position
    for _ in range(2):  # and it stays halted
        with pytest.raises(StreamRedefined) as err:
            await c.get(max_rows=5)
        assert "BINLAKE_CDC was deleted and defined again" in str(err.value)
        assert "binlake rewind reset --to-start" in str(err.value)
    # The store reads its stream again: the client's own state is for `binlake status` to name.
    assert await asyncio.to_thread(http_get, healthz) == (200, "ok\n")
    shown = await status.collect(stack.nats_url, "binlake", "main", None)
    assert any("client reset counts in an earlier BINLAKE_CDC" in p for p in status.problems(shown)), shown
    done = await asyncio.to_thread(binlake_cli, stack.nats_url, "rewind", "reset", "--to-start")
    assert done.returncode == 0, done.stderr
    assert ids_of(events_of(await drain(c))) == list(range(31, 36))


@pytest.mark.timeout(240)
async def test_a_client_that_dies_without_acking_gets_the_same_events_again(stack: Stack) -> None:
    db = stack.db
    await stack.sql(create(db), *inserts(db, 1, 15, rows_per=3))
    msgs = await stack.wait_cdc(45)

    async def connect() -> StoreClient:
        return await StoreClient.connect(stack.nats_url, "mortal", timeout_s=20)

    c1 = await connect()
    await c1.subscribe(filter=stack.table_filter())
    seen = events_of([await c1.get(max_rows=7) for _ in range(3)])
    assert row_count(seen) >= 21
    await c1.close()  # dies: nothing acked

    c2 = await connect()
    try:
        assert await c2.subscribe(filter=stack.table_filter()) == 0
        redo = [await c2.get(max_rows=7)]
        while len(events_of(redo)) < len(seen):
            redo.append(await c2.get(max_rows=7))
        assert keys(events_of(redo))[:len(seen)] == keys(seen)
        assert await c2.ack(redo[0].id) == redo[0].id  # type: ignore[arg-type]
    finally:
        await c2.close()  # dies with batches unacked

    c3 = await connect()
    try:
        assert await c3.subscribe(filter=stack.table_filter()) == redo[0].id
        rest = await drain(c3, max_rows=7)
        assert keys(events_of(rest))[:len(events_of(redo[1:]))] == keys(events_of(redo[1:]))
        assert keys(redo[0].events + events_of(rest)) == cdc_keys(msgs)
    finally:
        await c3.close()


# -- crashes ------------------------------------------------------------------------------------


class Consumer:
    """A careful client: retries while services restart, rolls back after a lost get,
    and keeps the events of the batches whose ack was confirmed."""

    def __init__(self, c: StoreClient) -> None:
        self.c = c
        self.pending: list[Batch] = []
        self.acked: list[dict[str, Any]] = []
        self.acked_batches = 0
        self.lost_gets = 0

    async def get(self, max_rows: int) -> Batch | None:
        try:
            b = await self.c.get(max_rows, max_wait=0.5)
        except NatsUnavailable:
            b = None
        except RpcError as exc:
            if exc.code != "unavailable":
                raise
            b = None
        if b is None:  # the reply is lost; the batch may have been recorded: start again from the last ack
            self.lost_gets += 1
            await retrying(self.c.rollback, "rollback")
            self.pending.clear()
            return None
        if b.id is not None:
            self.pending.append(b)
        return b

    async def ack_oldest(self) -> None:
        b = self.pending.pop(0)
        assert b.id is not None

        async def ack() -> None:
            try:
                await self.c.ack(b.id)  # type: ignore[arg-type]
            except RpcError as exc:
                if exc.code != "already_acked":  # an earlier try went through, its reply was lost
                    raise

        await retrying(ack, f"ack {b.id}")
        self.acked.extend(b.events)
        self.acked_batches += 1


@pytest.mark.timeout(300)
async def test_kill_9_of_store_and_meta_mid_stream_loses_no_cursor(stack: Stack) -> None:
    db = stack.db
    await stack.sql(create(db))
    await stack.wait_cdc(0)
    total_rows = 0
    statements = []
    for i in range(160):
        rows_per = 1 + i % 4
        statements += inserts(db, 1 + total_rows, 1, rows_per=rows_per)
        total_rows += rows_per

    def write() -> None:
        for s in statements:
            stack.mariadb.execute(s)
            time.sleep(0.02)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()

    c = stack.client("survivor", timeout_s=8)
    await c.subscribe(filter=stack.table_filter())
    con = Consumer(c)
    kills: list[str] = []
    deadline = time.monotonic() + 200
    expected: list[StoredMsg] | None = None
    while True:
        assert time.monotonic() < deadline, f"consumed {len(con.acked)} events, kills {kills}"
        b = await con.get(max_rows=15)
        if b is not None and b.id is not None:
            check_batch(b, 15)
        if b is None or b.id is None or not b.events:
            while con.pending:
                await con.ack_oldest()
        elif len(con.pending) >= 2:
            await con.ack_oldest()
        n = con.acked_batches
        if con.pending and n >= 3 and "store" not in kills:
            # a batch is out, unacked: the store dies and comes back; the ack still works
            kills.append("store")
            stack.store.kill()
            stack.store.start()
        elif con.pending and n >= 8 and "meta" not in kills:
            # meta dies with a batch out; acks are refused (unavailable) until it is back
            kills.append("meta")
            stack.meta.kill()
            with pytest.raises(RpcError) as info:
                await c.ack(con.pending[0].id)  # type: ignore[arg-type]
            assert info.value.code == "unavailable", info.value
            assert "meta" in str(info.value), str(info.value)
            stack.meta.start()  # the next acks are retried until it answers
        elif n >= 12 and "store-in-get" not in kills:
            # the store dies while a get is in flight: its reply is lost
            kills.append("store-in-get")
            get = asyncio.create_task(con.get(max_rows=15))
            await asyncio.sleep(0.1)
            stack.store.kill()
            stack.store.start()
            await get
        elif n >= 16 and "both" not in kills:
            kills.append("both")
            stack.meta.kill()
            stack.store.kill()
            stack.meta.start()
            stack.store.start()
        if not writer.is_alive() and expected is None:
            expected = await stack.wait_cdc(total_rows)
        if expected is not None and len(con.acked) >= len(expected) and not con.pending:
            break
    assert kills == ["store", "meta", "store-in-get", "both"], kills
    # nothing more to come
    for _ in range(3):
        b = await retrying(lambda: c.get(max_rows=100, max_wait=0.5), "get")
        assert b.events == []
    assert expected is not None
    assert sum(len(m.env.get("rows") or ()) for m in expected) == total_rows
    got = keys(con.acked)
    assert len(got) == len(set(got)), "an event was acked twice"
    assert got == cdc_keys(expected)
    assert ids_of(con.acked) == list(range(1, total_rows + 1))


@pytest.mark.timeout(240)
async def test_nats_restart_mid_stream_loses_no_cursor(stack: Stack, nats_server: NatsServer) -> None:
    db = stack.db
    await stack.sql(create(db), *inserts(db, 1, 40, rows_per=2))
    expected = await stack.wait_cdc(80)
    c = stack.client("through-restart", timeout_s=8)
    await c.subscribe(filter=stack.table_filter())
    con = Consumer(c)

    async def consume(until: int) -> None:
        deadline = time.monotonic() + 150
        while True:
            while con.pending:
                await con.ack_oldest()
            if len(con.acked) >= until:
                return
            assert time.monotonic() < deadline, f"consumed {len(con.acked)} of {until} events"
            await con.get(max_rows=10)

    await consume(10)
    while not con.pending:  # a batch is out, unacked, when NATS goes down
        await con.get(max_rows=10)
    await asyncio.to_thread(nats_server.stop)
    await asyncio.to_thread(nats_server.start)
    await consume(len(expected))
    assert keys(con.acked) == cdc_keys(expected)
    # the pipeline still works after the restart
    await stack.sql(*inserts(db, 1000, 2))
    expected = await stack.wait_cdc(82)
    await consume(len(expected))
    assert keys(con.acked) == cdc_keys(expected)


# -- rewind -------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
async def test_rewind_to_a_timestamp_a_position_and_a_gtid_state(stack: Stack) -> None:
    db = stack.db
    await stack.sql(create(db))
    await stack.sql(*inserts(db, 100, 5, phase=1))
    await asyncio.sleep(1.5)  # envelope ts has second resolution: the phases get different seconds
    await stack.sql(*inserts(db, 200, 5, phase=2))
    await asyncio.sleep(1.5)
    await stack.sql(*inserts(db, 300, 5, phase=3))
    msgs = await stack.wait_cdc(15)
    phase2 = [m for m in msgs if m.env["op"] == "i" and m.env["rows"][0]["after"]["phase"] == 2]
    assert len(phase2) == 5
    ts2 = phase2[0].env["ts"]
    assert all(m.env["ts"] < ts2 for m in msgs if m.env["op"] == "i" and m.env["rows"][0]["after"]["phase"] == 1)
    from_phase2 = [m for m in msgs if m.env["op"] == "i" and m.env["rows"][0]["after"]["phase"] >= 2]

    c = stack.client("rewinder")
    await c.subscribe(filter=stack.table_filter())
    everything = await drain(c, max_rows=4)
    assert keys(events_of(everything)) == cdc_keys(msgs)
    last_ack = everything[-1].id

    meta = MetaClient(stack.nc, timeout_s=20)
    reply = await meta.rewind("main", "rewinder", timestamp_ms=ts2)
    assert reply["acked"] < last_ack
    after = await drain(c, max_rows=4)
    events = events_of(after)
    assert [e["rows"][0]["after"]["phase"] for e in events[:1]] == [2]
    assert ids_of(events) == [*range(200, 205), *range(300, 305)]
    assert keys(events) == cdc_keys(from_phase2)

    # new changes after the rewind arrive; phase 1 never comes back, even after a rollback
    await stack.sql(*inserts(db, 400, 3, phase=4))
    await stack.wait_cdc(18)
    first = await c.get(max_rows=100, max_wait=2)
    assert first.id is not None and ids_of(first.events) == [400, 401, 402]
    await c.rollback()
    assert ids_of(events_of(await drain(c, max_rows=100))) == [400, 401, 402]

    # a position in the middle of phase 2: from that event on
    target = phase2[2].env
    position = f"{target['pos']['file']}:{target['pos']['offset']}"
    out = await asyncio.to_thread(binlake_cli, stack.nats_url, "rewind", "rewinder", "--to-position", position)
    assert out.returncode == 0 and re.fullmatch(r"client rewinder rewound: next event is CDC sequence \d+\n",
                                                out.stdout), out.stdout + out.stderr
    events = events_of(await drain(c, max_rows=3))
    assert ids_of(events) == [202, 203, 204, *range(300, 305), 400, 401, 402]
    assert keys(events)[0] == key(target)

    # a GTID state that holds every transaction before that event: the same
    domain, server, seq = target["txn"]["id"].split("-")  # MariaDB: its GTID
    await meta.rewind("main", "rewinder", gtid=f"{domain}-{server}-{int(seq) - 1}")
    events = events_of(await drain(c, max_rows=3))
    assert ids_of(events) == [202, 203, 204, *range(300, 305), 400, 401, 402]

    # a new client starting at phase 2's timestamp sees the same
    fresh = stack.client("fresh")
    await fresh.subscribe(filter=stack.table_filter(), start={"timestamp": ts2})
    assert ids_of(events_of(await drain(fresh))) == [*range(200, 205), *range(300, 305), 400, 401, 402]
    # rewinding to the future: nothing until something new happens
    future = "2999-01-01T00:00:00Z"
    out = await asyncio.to_thread(binlake_cli, stack.nats_url, "rewind", "fresh", "--to-timestamp", future)
    assert out.returncode == 0, out.stderr
    assert events_of(await drain(fresh, idle=1)) == []
    bad = await asyncio.to_thread(binlake_cli, stack.nats_url, "rewind", "fresh", "--to-timestamp", "yesterday")
    assert bad.returncode == 1 and "--to-timestamp must be epoch ms or ISO-8601, got 'yesterday'" in bad.stderr, \
        bad.stderr


# -- bugs -------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
async def test_get_with_a_non_numeric_max_rows_is_a_bad_request(services: Stack) -> None:
    await StoreClient(services.nc, "typed").subscribe()
    for req in ({"client": "typed", "max_rows": "many"}, {"client": "typed", "max_wait": "long"},
                {"client": "typed", "max_rows": None}):
        try:
            body = await raw_request(services.nc, "get", msgpack.packb(req), timeout=5)
        except nats.errors.TimeoutError:
            pytest.fail(f"no reply at all to {req}")
        assert body["ok"] is False and body["code"] == "bad_request", body


@pytest.mark.timeout(120)
async def test_a_bad_start_is_refused_for_a_known_client_too(services: Stack) -> None:
    c = StoreClient(services.nc, "known")
    await c.subscribe()
    await refused(c.subscribe(start="yesterday"), "bad_request", "start must be")


@pytest.mark.timeout(120)
async def test_one_clients_long_poll_does_not_block_another_client(services: Stack) -> None:
    a, b = StoreClient(services.nc, "a"), StoreClient(services.nc, "b")
    await a.subscribe()
    await b.subscribe()
    poll = asyncio.create_task(a.get(max_wait=8))  # BINLAKE_CDC is empty: waits the full 8 s
    await asyncio.sleep(0.5)
    started = time.monotonic()
    assert (await b.get(max_wait=0)).id is None
    elapsed = time.monotonic() - started
    await poll
    assert elapsed < 3, f"b's get took {elapsed:.1f}s behind a's long poll"


@pytest.mark.timeout(60)
async def test_store_retention_survives_the_stream_creation_race(nats_url):
    from services.store.retention import apply_retention
    from shared import jetstream
    from shared.subjects import Names

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()

        class Racing:
            """The stream is missing when the store looks, and meta creates it right after."""

            raced = False

            async def stream_info(self, name: str, *args: Any, **kwargs: Any) -> Any:
                if not self.raced:
                    self.raced = True
                    await jetstream.ensure_stream(js, jetstream.cdc_stream_config(Names()))  # what meta does
                    raise nats.js.errors.NotFoundError(code=404, err_code=10059, description="stream not found")
                return await js.stream_info(name, *args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(js, name)

        info = await apply_retention(Racing(), Names(), 3600.0, -1)  # type: ignore[arg-type]
        assert info.config.max_age == 3600.0
        assert (await js.stream_info("BINLAKE_CDC")).config.max_age == 3600.0
    finally:
        await nc.close()


@pytest.mark.timeout(180)
async def test_a_pathological_filter_cannot_stall_the_store_for_other_clients(stack: Stack) -> None:
    """`(.|.)*Z` backtracks for ages in Python's re; the store matches filters with RE2."""
    long = "t" + "x" * 60  # db.table of ~75 characters: 2^75 ways for `(.|.)*` to try
    await stack.sql(create(stack.db, long), *inserts(stack.db, 0, 20, table=long))
    await stack.wait_cdc(20, long)
    evil, good = stack.client("evil"), stack.client("good")
    await evil.subscribe(filter=r"(.|.)*Z")
    await good.subscribe(filter=stack.table_filter(long))
    assert events_of(await drain(evil, idle=1)) == []  # every table name is tried, none matches
    assert ids_of(events_of(await drain(good))) == list(range(20))


async def test_batches_hold_whole_source_transactions(services: Stack, parser_factory: ParserFactory,
                                                      sink_factory: Callable[..., ServiceProcess]) -> None:
    """Transactions over four tables, spread over two sink workers (so their messages reach
    BINLAKE_CDC interleaved), one table dropped by the sink's rules: no batch ends inside one."""
    db = services.db
    await asyncio.to_thread(parser_factory)
    for name in ("s1", "s2"):
        sink_factory(name, BINLAKE_EXCLUDE=rf"{re.escape(db)}\.hidden")
    tables = ("t", "u", "v", "hidden")
    await services.sql(*(create(db, t) for t in tables))

    def write() -> None:
        conn = services.mariadb.connect()
        try:
            with conn.cursor() as cur:
                for n in range(1, 81):
                    cur.execute("BEGIN")
                    for t in tables:
                        cur.execute(f"INSERT INTO `{db}`.{t} VALUES ({n}, 0, 'x')")
                    cur.execute("COMMIT")
        finally:
            conn.close()

    await asyncio.to_thread(write)
    await services.wait_cdc(80, "v")
    c = services.client("whole")
    await c.subscribe(filter=rf"{re.escape(db)}\..*")
    got = await drain(c, max_rows=2)  # a transaction has 3 rows for this client: more than a batch's limit
    by_txn: dict[str, set[int | None]] = defaultdict(set)
    for b in got:
        assert not b.partial
        for e in b.events:
            if e["op"] == "i":
                by_txn[e["txn"]["id"]].add(b.id)
    assert len(by_txn) == 80 and all(len(ids) == 1 for ids in by_txn.values()), "a transaction split across batches"
    assert sorted(ids_of(events_of(got))) == sorted([n for n in range(1, 81) for _ in range(3)])
    assert all(e["table"] != "hidden" for e in events_of(got))


def held(b: Batch) -> int:
    """The bytes of a batch's events as its client holds them (objects fetched)."""
    return sum(len(e) for e in b.raw)


def blob(key: int, size: int) -> bytes:
    """What `SUBSTRING(REPEAT(SHA2('<key>', 256), ...), 1, size)` makes: bytes that differ along the value."""
    digest = hashlib.sha256(str(key).encode()).hexdigest().encode()
    return (digest * (size // len(digest) + 1))[:size]


async def test_a_transaction_of_rows_larger_than_a_message_comes_whole(stack: Stack) -> None:
    """An UPDATE of two LONGBLOB rows, each row larger than NATS's max_payload (so each travels as an
    object): a client gets the transaction in one batch, byte-exact, also when it is larger than the
    client's `max_bytes` (a batch may grow to 4 times that to end on a transaction boundary); a
    transaction larger than 4 times `max_bytes` is handed out in parts, as documented."""
    db, size = stack.db, 3 * 1024 * 1024
    await stack.sql(f"CREATE TABLE `{db}`.blobs (id INT PRIMARY KEY, b LONGBLOB, note VARCHAR(20))",
                    *(f"INSERT INTO `{db}`.blobs VALUES ({k}, SUBSTRING(REPEAT(SHA2('{k}', 256), {size // 64 + 1}), "
                      f"1, {size}), 'n{k}')" for k in (1, 2)),
                    f"UPDATE `{db}`.blobs SET note = 'changed'")
    cdc = await stack.wait_cdc(4, "blobs", timeout=120)
    update_txn = next(m.env["txn"]["id"] for m in cdc if m.env["op"] == "u")
    refs = [m for m in await read_stream(stack.nats_url, "BINLAKE_CDC", resolve=False)
            if m.env.get("db") == db and "Binlake-Object" in m.headers]
    assert len(refs) == 4, "every row of the test travels as an object"
    txn_bytes = sum(m.env["ref"]["size"] for m in refs if m.env["txn"]["id"] == update_txn)

    for name, max_bytes in (("default", None), ("grown", txn_bytes // 3)):
        c = stack.client(name)
        await c.subscribe(filter=stack.table_filter("blobs"))
        got = await drain(c, max_bytes=max_bytes)
        assert not any(b.partial for b in got), name
        assert all(held(b) <= EXTEND * (max_bytes or DEFAULT_BATCH_BYTES) for b in got), name
        updates = [b for b in got if any(e["op"] == "u" for e in b.events)]
        assert len(updates) == 1, f"{name}: the UPDATE came in {len(updates)} batches"
        rows = [r for e in updates[0].events if e["txn"]["id"] == update_txn for r in e["rows"]]
        assert sorted((r["after"]["id"], r["after"]["note"],
                       r["after"]["b"] == r["before"]["b"] == blob(r["after"]["id"], size)) for r in rows) == [
            (1, "changed", True), (2, "changed", True)], name

    small = stack.client("small")
    await small.subscribe(filter=stack.table_filter("blobs"))
    got = await drain(small, max_bytes=txn_bytes // 5)
    assert all(held(b) <= EXTEND * (txn_bytes // 5) or len(b.raw) == 1 for b in got), "bounded, but for one event"
    parts = [b for b in got if any(e["op"] == "u" for e in b.events)]
    assert len(parts) == 2 and parts[0].partial, "a transaction larger than a batch may grow comes in parts"
    assert sorted(r["after"]["id"] for b in parts for e in b.events if e["op"] == "u" for r in e["rows"]) == [1, 2]


@pytest.mark.timeout(240)
async def test_status_shows_each_stages_backlog_per_table_in_rows_and_seconds(
        services: Stack, parser_factory: ParserFactory, sink_factory: Callable[..., ServiceProcess]) -> None:
    db = services.db
    await asyncio.to_thread(parser_factory)
    sink = sink_factory("sink")
    await services.sql(create(db), *inserts(db, 1, 30, rows_per=2))
    await services.wait_cdc(60)
    c = services.client("behind")
    await c.subscribe(filter=services.table_filter())
    sink.stop()  # the sink stage falls behind too
    await services.sql(*inserts(db, 61, 5, rows_per=3))

    async def shown() -> dict[str, Any] | None:
        s = await status.collect(services.nats_url, "binlake", "main", None)
        return s if s["lag"]["tables"].get(f"{db}.t", {}).get(status.SINK_STAGE) == 15 else None

    s = await wait_for(shown, 60, "the sink stage's backlog")
    table = s["lag"]["tables"][f"{db}.t"]
    assert table[status.client_stage("behind")] == 60, table  # it has read nothing yet
    assert table["seconds"] > 0
    assert s["lag"]["stages"][status.client_stage("behind")]["rows"] == 60
    text = status.render(s)
    assert "CDC → behind" in text and f"{db}.t" in text and "tables behind" in text, text
    assert "problems" in text and "no sink worker owns partitions" in text, text  # the stopped sink
    await drain(c)
    s = await status.collect(services.nats_url, "binlake", "main", None)
    assert status.client_stage("behind") not in s["lag"]["tables"][f"{db}.t"]  # read and acked: nothing behind

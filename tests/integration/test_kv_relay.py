"""A NATS server reply relayed into binlake's buckets, against a real nats-server.

NATS does not check reply subjects: a user that may publish to any JetStream subject can name
`$KV.<bucket>.<key>` as the reply, and the server stores its publish ack or its API response
there. Every reader of such a key must refuse it loudly (a pub ack's `seq` read as a cursor
skips data), and membership must not count a key no sink worker wrote.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import nats
import pytest
import structlog
from nats.aio.client import Client
from nats.js.kv import KeyValue

from services.meta.kv_backend import KvBackend
from services.parser.position import saved_position
from services.parser.schema_recorder import SchemaRecorder
from services.sink.membership import Membership
from services.sink.partition import PartitionSettings, PartitionWorker
from services.sink.rules import Rules
from shared import jetstream, keys
from shared import snapshots as snap
from shared.actor import Latest
from shared.errors import ForeignValue
from shared.metrics import Registry
from shared.subjects import Names, kv_subject

NAMES = Names()
SOURCE = "main"
TTL_S = 3.0


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


@pytest.fixture
async def cursors(nc: Client) -> KeyValue:
    return await jetstream.ensure_kv(nc.jetstream(), NAMES.cursors_bucket, history=16)


async def relay(nc: Client, kv: KeyValue, bucket: str, key: str, *, api: str | None = None,
                refused: bool = False) -> bytes:
    """Make the server store its answer at `key`: the publish ack of the loader's own lease put (its
    error reply when `refused`), or (with `api`) the response to a JetStream API request. What a
    user may do with publish rights only."""
    before = await _revision(kv, key)
    if api is None:
        await jetstream.ensure_kv(nc.jetstream(), NAMES.leases_bucket)
        subject = kv_subject(NAMES.leases_bucket, keys.loader_lease(SOURCE, "lake"))
        headers = {"Nats-Expected-Last-Subject-Sequence": "999999"} if refused else None
        await nc.publish(subject, b"loader-1", reply=kv_subject(bucket, key), headers=headers)
    else:
        await nc.publish(api, b"", reply=kv_subject(bucket, key))
    deadline = time.monotonic() + 5
    while (revision := await _revision(kv, key)) == before:
        assert time.monotonic() < deadline, f"the server stored no answer at {key}"
        await asyncio.sleep(0.05)
    entry = await kv.get(key, revision)
    assert entry.value is not None
    return entry.value


async def _revision(kv: KeyValue, key: str) -> int | None:
    try:
        return (await kv.get(key)).revision
    except nats.js.errors.KeyNotFoundError:
        return None


async def test_a_relayed_pub_ack_is_no_partition_cursor(nc: Client, cursors: KeyValue) -> None:
    key = keys.partition_cursor(SOURCE, 3)
    await cursors.put(key, json.dumps({"seq": 2, "seen": 0, "updated_ms": 1}).encode())
    stored = await relay(nc, cursors, NAMES.cursors_bucket, key)
    ack = json.loads(stored)
    assert ack["stream"] == "KV_" + NAMES.leases_bucket and ack["seq"] >= 1  # read as a cursor: skips data
    worker = PartitionWorker(nc.jetstream(), NAMES, cursors, Rules(), PartitionSettings(SOURCE, 3, 100, 1.0, 5.0),
                             Registry())
    with pytest.raises(ForeignValue) as err:
        await worker.run()
    message = str(err.value)
    assert key in message and '"stream"' in message and f"nats kv history {NAMES.cursors_bucket} {key}" in message


async def test_relayed_api_responses_are_refused_by_every_cursor_reader(nc: Client, cursors: KeyValue) -> None:
    js = nc.jetstream()
    recorder_key, parser_key = keys.schema_recorder(SOURCE), keys.parser_cursor(SOURCE)
    stored = await relay(nc, cursors, NAMES.cursors_bucket, recorder_key, api="$JS.API.INFO")
    assert json.loads(stored)["type"] == "io.nats.jetstream.api.v1.account_info_response"
    recorder = SchemaRecorder(js, NAMES, SOURCE, cursors, meta=None, registry=Registry())  # type: ignore[arg-type]
    with pytest.raises(ForeignValue, match="account_info_response"):
        await recorder._load()

    stored = await relay(nc, cursors, NAMES.cursors_bucket, parser_key, api="$JS.API.STREAM.INFO.NO_SUCH_STREAM")
    assert isinstance(json.loads(stored)["error"], dict)  # {"type": ..., "error": {"code": 404, ...}}
    with pytest.raises(ForeignValue, match="stream_info_response"):
        await saved_position(cursors, SOURCE)

    client_key = keys.client_cursor(SOURCE, "app")
    await relay(nc, cursors, NAMES.cursors_bucket, client_key)
    backend = KvBackend(js, NAMES.cursors_bucket, NAMES.schema_bucket)
    await backend.start()
    with pytest.raises(ForeignValue, match="publish ack"):
        await backend.get(client_key)  # what the store's requests and a rewind read the client's state through

    table_key = keys.snapshot_table(SOURCE, "shop", "orders")
    stored = await relay(nc, cursors, NAMES.cursors_bucket, table_key, refused=True)
    assert json.loads(stored)["error"]["err_code"] == 10071, stored  # wrong last sequence
    with pytest.raises(ForeignValue, match="JetStream error reply"):
        snap.TableProgress.from_json(stored, table_key, NAMES.cursors_bucket)


async def test_membership_ignores_a_relayed_phantom_member(nc: Client) -> None:
    js = nc.jetstream()
    members = await jetstream.ensure_kv(js, NAMES.members_bucket, ttl_s=TTL_S)
    view_a: Latest[frozenset[str]] = Latest()
    a = Membership(js, NAMES.members_bucket, SOURCE, "a", TTL_S, view_a)
    b = Membership(js, NAMES.members_bucket, SOURCE, "b", TTL_S, Latest())
    ghost = keys.member(SOURCE, "ghost")
    with structlog.testing.capture_logs() as logs:
        tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
        try:
            both = frozenset({a.key, b.key})
            await _until(lambda: view_a.peek() == both, "both members in a's view")
            seen: list[frozenset[str]] = []
            for _ in range(4):  # renewed like a member would, for longer than a TTL
                await relay(nc, members, NAMES.members_bucket, ghost)
                seen.append(view_a.peek() or frozenset())
                await asyncio.sleep(TTL_S / 3)
            assert all(ghost not in v for v in seen), seen
            assert view_a.peek() == both
            assert (await members.get(ghost)).value is not None  # it is there, and ignored
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    foreign = [e for e in logs if e["event"] == "membership.foreign_entry"]
    assert [e["key"] for e in foreign] == [ghost, ghost]  # once per key and watcher (a and b)
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await members.get(a.key)  # a stopped worker still leaves at once


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)

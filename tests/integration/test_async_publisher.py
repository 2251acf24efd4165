"""shared.async_publisher against a real nats-server: acks, refusals, no stream, a restricted user."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig

from shared.async_publisher import AsyncPublisher, send
from tests.servers import start_nats


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


async def new_stream(nc: Client) -> str:
    name = f"PUB_{secrets.token_hex(4)}"
    await nc.jetstream().add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"],
                                                 storage=StorageType.MEMORY, duplicate_window=60.0))
    return name


async def test_every_message_gets_its_own_ack_in_order(nc: Client) -> None:
    stream = await new_stream(nc)
    pub = AsyncPublisher(nc)
    await pub.start()
    futures = [await pub.publish(f"{stream.lower()}.t{i % 3}", f"m{i}".encode(), {"Nats-Msg-Id": f"id{i}"})
               for i in range(5000)]
    acks = await asyncio.wait_for(asyncio.gather(*futures), 30)
    assert [a.seq for a in acks] == list(range(1, 5001))
    assert {a.stream for a in acks} == {stream} and not any(a.duplicate for a in acks)
    assert pub.pending == 0
    again = await (await pub.publish(f"{stream.lower()}.t0", b"m0", {"Nats-Msg-Id": "id0"}))
    assert again.duplicate and again.seq == 1
    await pub.close()


async def test_a_refusal_and_a_subject_without_a_stream_are_errors(nc: Client) -> None:
    stream = await new_stream(nc)
    pub = AsyncPublisher(nc)
    await pub.start()
    await (await pub.publish(f"{stream.lower()}.a", b"1", {"Nats-Msg-Id": "one"}))
    refused = await pub.publish(f"{stream.lower()}.a", b"2", {"Nats-Msg-Id": "two",
                                                              "Nats-Expected-Last-Msg-Id": "not-one"})
    with pytest.raises(nats.js.errors.APIError) as err:
        await asyncio.wait_for(refused, 10)
    assert err.value.err_code == 10070  # wrong last msg id
    nobody = await pub.publish("no.stream.here", b"x")
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await asyncio.wait_for(nobody, 10)
    await pub.close()


async def test_cancel_all_ends_every_pending_future(nc: Client) -> None:
    pub = AsyncPublisher(nc)
    await pub.start()
    # A plain subscriber that never answers: the acks stay due.
    async def ignore(_: Msg) -> None:
        pass

    await nc.subscribe("silent.>", cb=ignore)
    futures = [await pub.publish("silent.x", b"x") for _ in range(10)]
    await asyncio.sleep(0.2)
    assert pub.pending == 10 and not any(f.done() for f in futures)
    pub.cancel_all()
    assert pub.pending == 0 and all(f.cancelled() for f in futures)
    await pub.close()


async def test_acks_reach_a_user_limited_to_its_own_inbox(tmp_path: Path) -> None:
    """The acks arrive under the connection's inbox prefix, which is all a restricted user may read."""
    conf = tmp_path / "users.conf"
    conf.write_text(
        'authorization { users = [\n'
        '  { user: admin, password: a }\n'
        '  { user: pub, password: p, permissions: { publish: { allow: ["pub.>"] },'
        ' subscribe: { allow: ["_INBOX_pub.>"] } } }\n'
        ']}\n')
    server = start_nats(tmp_path / "nats", extra_args=["-c", str(conf)])
    try:
        admin = await nats.connect(server.url, user="admin", password="a")
        await admin.jetstream().add_stream(StreamConfig(name="PUB", subjects=["pub.>"], storage=StorageType.MEMORY))
        await admin.close()
        conn = await nats.connect(server.url, user="pub", password="p", inbox_prefix=b"_INBOX_pub")
        pub = AsyncPublisher(conn)
        await pub.start()
        ack = await asyncio.wait_for(await pub.publish("pub.a", b"x"), 10)
        assert ack.seq == 1
        await pub.close()
        await conn.close()
    finally:
        server.stop()


@pytest.mark.parametrize("headers", [
    {"Nats-Msg-Id": "main:000001:000000000004:0", "Binlake-Raw-Seq": "17"},
    {"Binlake-Schema": "  padded  ", "X-Name": "ünïcødé 表"},
    {"Bad": "line\r\nPUB evil 1\r\nx"},  # nats-py replaces CR/LF: send hands it over
    {"bad key": "v"},
    {},
])
@pytest.mark.parametrize("reply", ["", "_INBOX.abc.1"])
async def test_send_writes_what_nats_py_writes(nc: Client, monkeypatch: pytest.MonkeyPatch,
                                               headers: dict[str, str], reply: str) -> None:
    sent: list[bytes] = []

    async def capture(cmd: bytes, priority: bool = False) -> None:
        sent.append(cmd)

    monkeypatch.setattr(nc, "_send_command", capture)
    outcomes = []
    for publish in (nc.publish("a.b.c", b"payload\x00\xff", reply=reply, headers=headers or None),
                    send(nc, "a.b.c", b"payload\x00\xff", headers, reply)):
        try:
            await publish
            outcomes.append("ok")
        except nats.errors.Error as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1]
    assert len(sent) == outcomes.count("ok") and len(set(sent)) <= 1, sent

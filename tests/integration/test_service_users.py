"""The whole pipeline on a locked-down deployment: NATS with TLS and a user per service
(`shared.permissions`), a source that only takes TLS. The changes reach a client and the lake
(`binlake verify` agrees, over TLS); what an app's user, or a service's user, tries beyond its
role is refused by NATS, and the pipeline keeps its data."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgpack
import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, StreamConfig, StreamSource

from services.launcher.processes import ROOT, ServiceProcess, clean_env
from services.ops import init
from shared import objects, permissions
from shared.config import NatsSettings
from shared.errors import NatsUnavailable
from shared.jetstream import login_options
from shared.rpc import RpcError
from shared.store_client import StoreClient
from shared.subjects import Names
from tests.integration.certs import Certs, make_certs
from tests.integration.support import parser_env, read_stream, sink_env, wait_until
from tests.integration.test_mysql_tls import tls_only_server
from tests.servers import MariaDB, NatsServer, start_nats

NAMES = Names()
PASSWORDS = {role: f"{role}-pw" for role in (*permissions.ROLES, "app1")}


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "certs")


@pytest.fixture
def bus(tmp_path: Path, certs: Certs) -> Iterator[NatsServer]:
    conf = tmp_path / "nats.conf"
    conf.write_text(permissions.server_config(
        NAMES, {r: f'"{PASSWORDS[r]}"' for r in permissions.ROLES}, {"app1": f'"{PASSWORDS["app1"]}"'})
        + certs.nats_tls())
    ns = start_nats(tmp_path / "nats", extra_args=["-c", str(conf)])
    yield ns
    ns.stop()


def login(user: str, certs: Certs) -> NatsSettings:
    return NatsSettings(nats_user=user, nats_password=PASSWORDS[user], nats_tls_ca=str(certs.ca),
                        nats_inbox=permissions.inbox(user))


def role_env(role: str, url: str, certs: Certs) -> dict[str, str]:
    return {"BINLAKE_NATS_URL": url, "BINLAKE_NATS_USER": role, "BINLAKE_NATS_PASSWORD": PASSWORDS[role],
            "BINLAKE_NATS_TLS_CA": str(certs.ca), **permissions.login_env(role)}


class Conn:
    """A raw nats-py connection as one user, keeping the server's permission errors."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc = NATS()

    @classmethod
    async def open(cls, url: str, auth: NatsSettings) -> Conn:
        conn = cls()

        async def on_error(exc: Exception) -> None:
            conn.errors.append(str(exc))

        conn.nc = await nats.connect(url, error_cb=on_error, max_reconnect_attempts=2, **login_options(auth, [url]))
        return conn

    async def violation(self, subject: str) -> bool:
        """Whether the server reported a permissions violation naming `subject`."""
        for _ in range(50):
            if any("permissions violation" in e.lower() and subject.lower() in e.lower() for e in self.errors):
                return True
            await asyncio.sleep(0.1)
        return False

    async def refused_request(self, subject: str, body: bytes = b"{}") -> bool:
        with pytest.raises((nats.errors.Error, TimeoutError)):
            await self.nc.request(subject, body, timeout=2)
        return await self.violation(subject)


@pytest.mark.timeout(600)
async def test_the_pipeline_runs_as_its_users_and_nothing_else_gets_through(
        bus: NatsServer, mariadb_factory: Callable[..., MariaDB], certs: Certs, tmp_path: Path) -> None:
    source = tls_only_server(mariadb_factory, certs)
    url = f"tls://127.0.0.1:{bus.port}"
    procs: list[ServiceProcess] = []

    def start(module: str, role: str, env: dict[str, str]) -> ServiceProcess:
        proc = ServiceProcess(module, {**env, **role_env(role, url, certs)}, tmp_path / f"{role}.log").start()
        procs.append(proc)
        return proc

    source_url = source.dsn() + "/?ssl-ca=" + quote(str(certs.ca))
    source.execute("CREATE TABLE shop.big (id INT PRIMARY KEY, b LONGTEXT)")
    # The services' users may not define streams or buckets: `binlake init` does, as admin.
    assert "BINLAKE_CDC" in await init.init(url, login("admin", certs), {})
    start("services.meta", "meta", sink_env(url))
    start("services.store", "store", sink_env(url))
    start("services.parser", "parser", parser_env(source, url, BINLAKE_SOURCE_URL=source_url, BINLAKE_START="earliest"))
    sink = start("services.sink", "sink", sink_env(url, BINLAKE_INSTANCE="s1"))
    lake = {"BINLAKE_DATA_DIR": str(tmp_path / "data"), "BINLAKE_FLUSH_S": "1", "BINLAKE_MASTER": "local[2]"}
    start("services.loader", "loader", sink_env(url, **lake))
    app = await Conn.open(url, login("app1", certs))
    try:
        client = StoreClient(app.nc, "app1", timeout_s=5, api_prefix=permissions.ROLE_API)
        await _until(lambda: client.subscribe(start="earliest"), procs)
        source.execute(*(f"INSERT INTO shop.t VALUES ({i})" for i in range(1, 51)), ssl={"ca": str(certs.ca)})
        # Rows that make the store's reply larger than a message: it comes in parts, all allowed.
        # And one larger than a message: the parser, the sink and app1 go through the object buckets.
        source.execute(*(f"INSERT INTO shop.big VALUES ({i}, REPEAT('x', 400000))" for i in (1001, 1002, 1003)),
                       "INSERT INTO shop.big VALUES (1004, REPEAT('y', 3000000))", ssl={"ca": str(certs.ca)})
        seen = await _read_ids(client, 54, procs)  # in order per table; the tables' order may interleave
        assert [i for i in seen if i < 1000] == list(range(1, 51)) and [i for i in seen if i > 1000] == [1001, 1002,
                                                                                                         1003, 1004]

        # An app's user: no other client, no meta, no stream, bucket, RAW subject or other inbox.
        # (All at once: each refused request waits out its timeout.)
        refused = await asyncio.gather(
            *(app.refused_request(NAMES.store_client_rpc("main", verb, "loader"))
              for verb in ("subscribe", "rollback", "unsubscribe", "ack", "get")),
            app.refused_request(NAMES.store_rpc("main", "subscribe")),
            app.refused_request(NAMES.meta_rpc("cursor.put"),
                                msgpack.packb({"key": "sink.main.p14", "value": {"seq": 10**9}})),
            app.refused_request(NAMES.meta_rpc("rewind")),
            app.refused_request("$JS.API.STREAM.INFO.BINLAKE_RAW"),
            app.refused_request(f"$JS.API.STREAM.INFO.{objects.object_stream(NAMES.raw_objects_bucket)}"),
            app.refused_request("$KV.binlake_cursors.sink.main.p14", b'{"seq": 1000000000}'))
        assert all(refused), (refused, app.errors)
        await app.nc.publish("binlake.raw.main.3.a.b.c", b"x")
        assert await app.violation("binlake.raw.main.3.a.b.c")
        for subject in ("binlake.raw.>", "binlake.cdc.>", "_INBOX.>", f"{permissions.inbox('loader')}.>"):
            await app.nc.subscribe(subject)
            assert await app.violation(subject), app.errors
        # Its own subject with a reply subject in RAW or a bucket: the answer goes back into app1's
        # own account, where nothing listens there (test_bus_escalation.py tries every such reply).
        for reply in ("binlake.raw.main.shop.t", "$KV.binlake_cursors.sink.main.p0"):
            await app.nc.publish(NAMES.store_client_rpc("main", "get", "app1"), b"\x80", reply=reply)
        await asyncio.sleep(1)

        # Only the parser and the sink read BINLAKE_RAW; nobody but the admin defines a stream.
        await asyncio.gather(*(_no_raw_and_no_streams(url, login(role, certs)) for role in ("store", "meta", "loader")))

        source.execute(*(f"INSERT INTO shop.t VALUES ({i})" for i in range(51, 61)), ssl={"ca": str(certs.ca)})
        assert await _read_ids(client, 10, procs) == list(range(51, 61))
        # The loader, as its user, landed it all: `binlake verify` (over TLS to the source) agrees.
        verify_env = {**clean_env(), **lake,
                      "BINLAKE_SOURCE_URL": source_url}

        def verified() -> bool:
            out = subprocess.run([sys.executable, "-m", "services.loader.verify", "shop.t"], env=verify_env,
                                 cwd=ROOT, capture_output=True, text=True, timeout=300)
            return out.returncode == 0 and "OK    shop.t: 60 rows" in out.stdout
        wait_until(verified, 300, "binlake verify to find shop.t equal", interval=5)
        assert sink.running and all(p.running for p in procs), "\n".join(p.output[-3000:] for p in procs)
        raw = await read_stream(url, NAMES.raw_stream, auth=login("admin", certs))
        assert raw and all("v" in m.env for m in raw), [m.env for m in raw if "v" not in m.env]
    finally:
        await app.nc.close()
        for p in procs:
            p.stop()


async def _no_raw_and_no_streams(url: str, auth: NatsSettings) -> None:
    """A service's user that is not the parser's or the sink's reads no BINLAKE_RAW and defines no stream."""
    other = await Conn.open(url, auth)
    try:
        js = other.nc.jetstream()
        with pytest.raises((nats.errors.Error, TimeoutError)):
            await js.add_consumer(NAMES.raw_stream, ConsumerConfig(), timeout=2)
        assert await other.violation(f"$JS.API.CONSUMER.CREATE.{NAMES.raw_stream}"), (auth.nats_user, other.errors)
        with pytest.raises((nats.errors.Error, TimeoutError)):
            await js.add_stream(StreamConfig(name="COPY", subjects=["copy.>"],
                                             sources=[StreamSource(name=NAMES.raw_stream)]))
        assert await other.violation("$JS.API.STREAM.CREATE.COPY"), (auth.nats_user, other.errors)
        for stream in (NAMES.cdc_stream, "KV_binlake_leases"):  # a source added to one it reads
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.update_stream(StreamConfig(name=stream, sources=[StreamSource(name=NAMES.raw_stream)]))
            assert await other.violation(f"$JS.API.STREAM.UPDATE.{stream}"), (auth.nats_user, other.errors)
    finally:
        await other.nc.close()


async def _until(attempt: Callable[[], Any], procs: list[ServiceProcess], timeout_s: float = 90) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await attempt()
        except (RpcError, NatsUnavailable, nats.errors.Error, TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError("\n".join(p.output[-3000:] for p in procs)) from None
            await asyncio.sleep(0.5)


async def _read_ids(client: StoreClient, count: int, procs: list[ServiceProcess]) -> list[int]:
    ids: list[int] = []
    deadline = asyncio.get_running_loop().time() + 90
    while len(ids) < count:
        assert asyncio.get_running_loop().time() < deadline, "\n".join(p.output[-3000:] for p in procs)
        batch = await client.get(max_wait=1)
        if batch.id is None:
            continue
        ids += [r["after"]["id"] for e in batch.events for r in e.get("rows") or () if r.get("after")]
        await client.ack(batch.id)
    return ids

"""A store client confined by NATS's own permissions to its subjects: it reads and acks as
itself, and can neither act for another client nor reach the streams or buckets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from services.launcher.processes import ServiceProcess
from services.ops import init
from shared import permissions
from shared.config import NatsSettings
from shared.errors import NatsUnavailable
from shared.jetstream import connect
from shared.rpc import RpcError, call
from shared.store_client import StoreClient
from shared.subjects import Names
from tests.integration.support import wait_until
from tests.servers import NatsServer, start_nats


@pytest.fixture
def bus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NatsServer]:
    """The shipped users (the file is checked to be this function's output below) and client app1."""
    for role in permissions.ROLES:  # nats-server reads $VARS from its environment
        monkeypatch.setenv(f"BINLAKE_{role.upper()}_PASSWORD", f"{role}-pw")
    conf = tmp_path / "nats.conf"
    conf.write_text(permissions.server_config(
        Names(), {role: f"$BINLAKE_{role.upper()}_PASSWORD" for role in permissions.ROLES}, {"app1": '"app1-pw"'}))
    ns = start_nats(tmp_path / "nats", extra_args=["-c", str(conf)])
    yield ns
    ns.stop()


@pytest.mark.timeout(180)
async def test_a_client_user_acts_only_as_itself(bus: NatsServer, tmp_path: Path) -> None:
    def env(role: str) -> dict[str, str]:
        return {"BINLAKE_NATS_URL": bus.url, "BINLAKE_NATS_PASSWORD": f"{role}-pw", **permissions.login_env(role),
                "BINLAKE_METRICS_PORT": "-1"}
    await init.init(bus.url, NatsSettings(nats_user="admin", nats_password="admin-pw"), {})  # streams, as admin
    meta = ServiceProcess("services.meta", env("meta"), tmp_path / "meta.log").start()
    store = ServiceProcess("services.store", env("store"), tmp_path / "store.log").start()
    app = await connect(bus.url, "app1", auth=NatsSettings(nats_user="app1", nats_password="app1-pw",
                                                           nats_inbox=permissions.inbox("app1")))
    try:
        c = StoreClient(app, "app1", timeout_s=5, api_prefix=permissions.ROLE_API)

        async def subscribed() -> bool:
            try:
                await c.subscribe()
                return True
            except (RpcError, NatsUnavailable, nats.errors.Error, TimeoutError):
                return False

        deadline = asyncio.get_running_loop().time() + 60
        while not await subscribed():
            assert asyncio.get_running_loop().time() < deadline, meta.output + store.output
            await asyncio.sleep(0.5)
        assert (await c.get(max_wait=0)).id is None  # its own subjects work

        names = Names()
        # Another client's subject, and the any-client subject: NATS drops the request.
        for subject, body in ((names.store_client_rpc("main", "rollback", "app2"), {"client": "app2"}),
                              (names.store_rpc("main", "unsubscribe"), {"client": "app2"}),
                              (names.meta_rpc("rewind"), {"source": "main", "client": "app2", "timestamp": 0})):
            with pytest.raises(NatsUnavailable, match="no answer"):
                await call(app, subject, body, 2)
        # Its own subject with another client in the body: refused by the store.
        with pytest.raises(RpcError, match="names client 'app2' on the subject of client 'app1'"):
            await call(app, names.store_client_rpc("main", "ack", "app1"), {"client": "app2", "batch_id": 1}, 5)
        # No stream, bucket or JetStream API either.
        with pytest.raises((nats.errors.Error, TimeoutError)):
            await app.request("$JS.API.STREAM.INFO.BINLAKE_CDC", b"", timeout=2)
        with pytest.raises((nats.errors.Error, TimeoutError)):
            sub = await app.subscribe("binlake.cdc.>")
            await app.flush(timeout=2)
            await sub.next_msg(timeout=1)
        wait_until(lambda: meta.running and store.running, 1, "the services to be up")
    finally:
        await app.close()
        store.stop()
        meta.stop()


"""When nats-server drops a service's connection, meta and the store come back without a restart.

An operator's kick (`$SYS.REQ.SERVER.<id>.KICK`) closes the socket: nats.py reconnects and
the same processes serve again. A protocol error (`-ERR 'Maximum Control Line Exceeded'`)
makes nats.py close the connection for good, as every NATS client does: the service then
exits non-zero for its supervisor to restart it, instead of living on deaf. A client that
sends a 9,000-character client name (issue 14) gets an error, or loses its own connection,
and the services keep serving everybody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from services.launcher.processes import ServiceProcess
from shared.config import NatsSettings
from shared.errors import NatsUnavailable
from shared.jetstream import connect
from shared.meta_client import MetaClient
from shared.rpc import RpcError, call
from shared.store_client import StoreClient
from shared.subjects import Names
from tests.servers import NatsServer, start_nats

SERVICE_USER, SERVICE_PASSWORD = "binlake", "svc-pw"
SYS_USER, SYS_PASSWORD = "sys", "sys-pw"
ACCOUNT = "BINLAKE"
LIVENESS_S = 30.0  # a generous bound for "serves again", not a measurement

CONF = """
# A service account with JetStream, and the system account an operator kicks clients with.
accounts {{
  {account}: {{ jetstream: enabled, users: [ {{ user: {user}, password: {password} }} ] }}
  SYS: {{ users: [ {{ user: {sys_user}, password: {sys_password} }} ] }}
}}
system_account: SYS
{extra}
"""


def write_conf(path: Path, extra: str = "") -> None:
    path.write_text(CONF.format(account=ACCOUNT, user=SERVICE_USER, password=SERVICE_PASSWORD, sys_user=SYS_USER,
                                sys_password=SYS_PASSWORD, extra=extra))


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[tuple[NatsServer, Path]]:
    conf = tmp_path / "nats.conf"
    write_conf(conf)
    ns = start_nats(tmp_path / "nats", extra_args=["-c", str(conf)])
    yield ns, conf
    ns.stop()


def service_env(url: str) -> dict[str, str]:
    return {"BINLAKE_NATS_URL": url, "BINLAKE_NATS_USER": SERVICE_USER, "BINLAKE_NATS_PASSWORD": SERVICE_PASSWORD,
            "BINLAKE_METRICS_PORT": "-1", "BINLAKE_RESTART_BASE_DELAY_S": "0.2"}


async def app_connection(url: str, name: str) -> NATS:
    return await connect(url, name, auth=NatsSettings(nats_user=SERVICE_USER, nats_password=SERVICE_PASSWORD))


async def eventually(what: str, check: Callable[[], Awaitable[Any]], procs: list[ServiceProcess],
                     timeout: float = LIVENESS_S) -> Any:
    """`check()`'s result once it stops raising a bus error; fails after `timeout` or when a service dies."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await check()
        except (RpcError, NatsUnavailable, nats.errors.Error, TimeoutError) as exc:
            last = exc
        for p in procs:
            assert p.running, f"{p.module} exited ({p.returncode}) while waiting for {what}:\n{p.output}"
        if loop.time() > deadline:
            logs = "\n".join(f"--- {p.module}\n{p.output}" for p in procs)
            raise AssertionError(f"no {what} within {timeout:.0f}s (last: {last!r})\n{logs}")
        await asyncio.sleep(0.5)


class Operator:
    """A system-account connection: lists and kicks the connections of the service account."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        info = getattr(nc, "_server_info", {})
        self.server_id = str(info["server_id"])

    @classmethod
    async def open(cls, url: str) -> Operator:
        return cls(await nats.connect(url, user=SYS_USER, password=SYS_PASSWORD, name="operator"))

    async def _request(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        msg = await self.nc.request(f"$SYS.REQ.SERVER.{self.server_id}.{verb}", json.dumps(body).encode(), timeout=5)
        reply: dict[str, Any] = json.loads(msg.data)
        assert "error" not in reply, reply
        return reply

    async def cids(self, name: str) -> list[int]:
        """The ids of the open connections named `name`."""
        reply = await self._request("CONNZ", {"acc": ACCOUNT, "limit": 1024})
        return [int(c["cid"]) for c in reply["data"]["connections"] or [] if c.get("name") == name]

    async def kick(self, cid: int) -> None:
        await self._request("KICK", {"cid": cid})


async def serving(meta: MetaClient, store: StoreClient) -> None:
    """Both services answer: a meta cursor read, and the store's subscribe and get of a client."""
    await meta.get("reconnect-probe")
    await store.subscribe()
    await store.get(max_wait=0)


@pytest.mark.timeout(240)
async def test_meta_and_store_reconnect_after_the_server_kicks_them(bus: tuple[NatsServer, Path],
                                                                     tmp_path: Path) -> None:
    ns, _ = bus
    env = service_env(ns.url)
    meta_proc = ServiceProcess("services.meta", env, tmp_path / "meta.log").start()
    store_proc = ServiceProcess("services.store", env, tmp_path / "store.log").start()
    procs = [meta_proc, store_proc]
    app = await app_connection(ns.url, "app1")
    operator = await Operator.open(ns.url)
    try:
        meta = MetaClient(app, timeout_s=5)
        store = StoreClient(app, "app1", timeout_s=5)
        await eventually("meta and store serving", lambda: serving(meta, store), procs, timeout=90)
        pids = [p.proc.pid for p in procs if p.proc is not None]

        for round_ in range(2):  # a second kick finds the reconnected connection just as well
            before = {}
            for service in ("meta", "store"):
                cids = await operator.cids(f"binlake-{service}-main")
                assert len(cids) == 1, (service, cids)
                before[service] = cids[0]
                await operator.kick(cids[0])
            for service, cid in before.items():
                async def reconnected(service: str = service, cid: int = cid) -> None:
                    cids = await operator.cids(f"binlake-{service}-main")
                    if not cids or cid in cids:
                        raise NatsUnavailable(f"{service} has no new connection yet: {cids}")
                await eventually(f"{service} reconnected (round {round_})", reconnected, procs)
            await eventually(f"meta and store serving after the kick (round {round_})",
                             lambda: serving(meta, store), procs)

        assert [p.proc.pid for p in procs if p.proc is not None] == pids  # the same processes: no restart
        assert meta_proc.running and store_proc.running
        assert "nats.reconnected" in meta_proc.output and "nats.reconnected" in store_proc.output
    finally:
        await operator.nc.close()
        await app.close()
        store_proc.stop()
        meta_proc.stop()


@pytest.mark.timeout(240)
async def test_a_service_that_loses_nats_for_good_exits_nonzero(bus: tuple[NatsServer, Path],
                                                                tmp_path: Path) -> None:
    """A protocol error closes the connection for good: meta exits 1 (its supervisor restarts it), never deaf."""
    ns, conf = bus
    env = service_env(ns.url)
    meta_proc = ServiceProcess("services.meta", env, tmp_path / "meta.log").start()
    app = await app_connection(ns.url, "app1")
    try:
        meta = MetaClient(app, timeout_s=5)
        await eventually("meta serving", lambda: meta.get("k"), [meta_proc], timeout=90)

        # Every control line longer than 48 bytes is now a protocol error: the short request
        # below passes, the JetStream requests meta makes to answer it do not, and the server
        # closes meta's connection with -ERR.
        assert ns.proc is not None
        write_conf(conf, "max_control_line: 48")
        ns.proc.send_signal(signal.SIGHUP)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LIVENESS_S
        while not cut_off(ns, "binlake-meta-main"):
            assert loop.time() < deadline, ns.log_file.read_text()[-3000:]
            if not app.is_closed:  # our own longer lines are cut off as well
                await app.publish("binlake.meta.cursor.get", b"\x81\xa3key\xa1k", reply="_INBOX.r")
            await asyncio.sleep(0.2)
        write_conf(conf)
        ns.proc.send_signal(signal.SIGHUP)

        try:
            code = await asyncio.to_thread(meta_proc.wait, 60)  # generous; it must not live on deaf
        except Exception:
            raise AssertionError(f"meta lives on without its connection:\n{meta_proc.output}") from None
        assert code == 1, meta_proc.output
        # One clear line, not a traceback of the clean-up that failed on the closed connection.
        assert "binlake meta: NatsUnavailable: the NATS connection was closed for good" in meta_proc.output, \
            meta_proc.output

        # What its supervisor does: start it again, and it serves.
        meta_proc.start()
        app2 = await app_connection(ns.url, "app2")
        try:
            await eventually("the restarted meta serving", lambda: MetaClient(app2, timeout_s=5).get("k"),
                             [meta_proc], timeout=90)
        finally:
            await app2.close()
    finally:
        await app.close()
        meta_proc.stop()


@pytest.mark.timeout(240)
async def test_a_9000_character_client_name_does_not_cut_off_meta_or_the_store(bus: tuple[NatsServer, Path],
                                                                               tmp_path: Path) -> None:
    ns, _ = bus
    env = service_env(ns.url)
    meta_proc = ServiceProcess("services.meta", env, tmp_path / "meta.log").start()
    store_proc = ServiceProcess("services.store", env, tmp_path / "store.log").start()
    procs = [meta_proc, store_proc]
    app = await app_connection(ns.url, "app1")
    attacker = await app_connection(ns.url, "attacker")
    try:
        meta = MetaClient(app, timeout_s=5)
        store = StoreClient(app, "app1", timeout_s=5)
        await eventually("meta and store serving", lambda: serving(meta, store), procs, timeout=90)

        names, long_name = Names(), "x" * 9000
        # In the body, on subjects of normal length: refused with a clear error.
        for subject, body in (
                (names.meta_rpc("rewind"), {"source": "main", "client": long_name, "timestamp": 0}),
                (names.store_rpc("main", "subscribe"), {"client": long_name, "filter": ".*", "start": "earliest"}),
                (names.store_rpc("main", "get"), {"client": long_name, "max_rows": 1, "max_wait": 0}),
                (names.store_rpc("main", "ack"), {"client": long_name, "batch_id": 1}),
                (names.store_rpc("main", "unsubscribe"), {"client": long_name})):
            with pytest.raises(RpcError, match="at most 128 characters") as refused:
                await call(attacker, subject, body, 10)
            assert refused.value.code == "bad_request"
        # A long name that still fits a control line, as the client token of the subject: refused too.
        mid_name = "y" * 3000
        with pytest.raises(RpcError, match="at most 128 characters"):
            await call(attacker, names.store_client_rpc("main", "subscribe", mid_name), {"client": mid_name}, 10)

        # As the client token of the subject, 9,000 characters: past nats-server's max_control_line,
        # so the server drops the attacker's own connection; the request never reaches a service.
        # (nats.py then closes it for good, or reconnects when the reset came before the -ERR.)
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await attacker.publish(names.store_client_rpc("main", "subscribe", long_name), b"\x81\xa6client\xa1x",
                                   reply="r")
            await attacker.flush(timeout=5)

        async def attacker_cut_off() -> None:
            if not cut_off(ns, "attacker"):
                raise NatsUnavailable("the server has not dropped the attacker yet")

        await eventually("the server dropping the attacker's connection", attacker_cut_off, procs)

        # Everybody else is still served, by the same processes.
        await eventually("meta and store serving after the attack", lambda: serving(meta, store), procs)
        assert meta_proc.running and store_proc.running
        assert "nats.disconnected" not in meta_proc.output + store_proc.output
        assert not cut_off(ns, "binlake-meta-main") and not cut_off(ns, "binlake-store-main")
    finally:
        await attacker.close()
        await app.close()
        store_proc.stop()
        meta_proc.stop()


def cut_off(ns: NatsServer, name: str) -> bool:
    """Whether nats-server closed a connection named `name` for a control line over max_control_line."""
    return any(f':{name}"' in line and "maximum control line exceeded" in line
               for line in ns.log_file.read_text(errors="replace").splitlines())

"""Every service and command logs in to NATS the way the server demands: user and password,
token, TLS with a private CA and a client certificate. A refused login says what to set."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from services.launcher.processes import ROOT, ServiceProcess, clean_env
from services.launcher.servers import free_port, start_nats_cluster
from shared.config import NatsSettings
from shared.errors import ConfigError
from shared.jetstream import connect
from tests.integration.certs import Certs, make_certs
from tests.integration.support import wait_until
from tests.servers import NatsServer, start_nats


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=ROOT,
                          env=clean_env(**env), capture_output=True, text=True, timeout=60)


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[NatsServer]:
    ns = start_nats(tmp_path / "nats", extra_args=request.param)
    yield ns
    ns.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.mark.parametrize("server", [["--user", "binlake", "--pass", "S3cret-pw"]], indirect=True)
def test_user_and_password_from_a_file(server: NatsServer, tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("S3cret-pw\n")
    env = {"BINLAKE_NATS_URL": server.url, "BINLAKE_NATS_USER": "binlake", "BINLAKE_NATS_PASSWORD_FILE": str(secret)}
    meta = ServiceProcess("services.meta", {**env, "BINLAKE_METRICS_PORT": "-1"}, tmp_path / "meta.log").start()
    try:
        wait_until(lambda: "BINLAKE_CDC:" in (r := cli(env, "status")).stdout and r, 60,
                   "meta to create the streams, seen by `binlake status`")
        assert meta.running, meta.output
    finally:
        meta.stop()
    refused = cli({"BINLAKE_NATS_URL": server.url}, "status")
    assert refused.returncode != 0
    assert "refused the login" in refused.stderr and "BINLAKE_NATS_USER" in refused.stderr, refused.stderr
    wrong = cli({**env, "BINLAKE_NATS_PASSWORD_FILE": "", "BINLAKE_NATS_PASSWORD": "nope"}, "status")
    assert wrong.returncode != 0 and "refused the login" in wrong.stderr, wrong.stderr
    assert "S3cret-pw" not in refused.stderr + wrong.stderr + meta.output


@pytest.mark.parametrize("server", [["--auth", "t0ken-S3cret"]], indirect=True)
def test_token(server: NatsServer) -> None:
    ok = cli({"BINLAKE_NATS_URL": server.url, "BINLAKE_NATS_TOKEN": "t0ken-S3cret"}, "status")
    assert "refused" not in ok.stderr, ok.stderr
    refused = cli({"BINLAKE_NATS_URL": server.url, "BINLAKE_NATS_TOKEN": "other"}, "status")
    assert "refused the login" in refused.stderr, refused.stderr


def test_tls_with_a_private_ca_and_a_client_certificate(tmp_path: Path, certs: Certs) -> None:
    conf = tmp_path / "tls.conf"
    conf.write_text(certs.nats_tls(verify=True))
    ns = start_nats(tmp_path / "nats", extra_args=["-c", str(conf)])
    try:
        url = f"tls://127.0.0.1:{ns.port}"
        env = {"BINLAKE_NATS_URL": url, "BINLAKE_NATS_TLS_CA": str(certs.ca),
               "BINLAKE_NATS_TLS_CERT": str(certs.client_cert), "BINLAKE_NATS_TLS_KEY": str(certs.client_key)}
        meta = ServiceProcess("services.meta", {**env, "BINLAKE_METRICS_PORT": "-1"}, tmp_path / "meta.log").start()
        try:
            wait_until(lambda: "BINLAKE_CDC:" in (r := cli(env, "status")).stdout and r, 60,
                       "meta over TLS, seen by `binlake status` over TLS")
        finally:
            meta.stop()
        unknown_ca = cli({"BINLAKE_NATS_URL": url}, "status")  # the system CAs do not know ours
        assert unknown_ca.returncode != 0 and "BINLAKE_NATS_TLS_CA" in unknown_ca.stderr, unknown_ca.stderr
        no_cert = cli({"BINLAKE_NATS_URL": url, "BINLAKE_NATS_TLS_CA": str(certs.ca)}, "status")
        assert no_cert.returncode != 0, no_cert.stdout
        bad = cli({**env, "BINLAKE_NATS_TLS_KEY": ""}, "status")
        assert "BINLAKE_NATS_TLS_CERT and BINLAKE_NATS_TLS_KEY go together" in bad.stderr, bad.stderr
    finally:
        ns.stop()


class PlainPeer:
    """A fake NATS server without TLS that says it wants none, and keeps every byte it is sent."""

    INFO = (b'INFO {"server_id":"fake","version":"2.10.0","proto":1,"tls_required":false,'
            b'"auth_required":true,"max_payload":1048576}\r\n')

    def __init__(self, ours: str = "") -> None:
        """`ours`: the client name of the test's own client; a connection that sends another name's
        CONNECT (another test's service, reconnecting to the port it had) is not counted."""
        self.received = b""
        self.connections = 0
        self._ours = ours
        self._server: asyncio.Server | None = None

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(self.INFO)
        data = b""
        with contextlib.suppress(OSError, TimeoutError):
            data = await asyncio.wait_for(reader.read(65536), 3)
            writer.write(b"-ERR 'Unknown Protocol Operation'\r\n")  # as nats-server answers bytes it cannot parse
        writer.close()
        if self._ours and data.startswith(b"CONNECT") and f'"name": "{self._ours}"'.encode() not in data:
            return  # a freed port is reused: someone else's client, not the one under test
        self.connections += 1
        self.received += data

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


SECRET = "not-for-a-plain-peer"


async def test_tls_first_a_plain_peer_never_sees_connect_on_the_first_connection(certs: Certs) -> None:
    peer = PlainPeer()
    port = await peer.start()
    try:
        with pytest.raises(ConfigError, match="handshake_first"):
            await connect(f"tls://127.0.0.1:{port}", "t", first_connect_s=3.0, connect_timeout=1.0,
                          auth=NatsSettings(nats_user="u", nats_password=SECRET, nats_tls_ca=str(certs.ca)))
        assert peer.connections >= 1
        assert b"CONNECT" not in peer.received and SECRET.encode() not in peer.received, peer.received[:200]
    finally:
        await peer.stop()


async def test_tls_first_a_plain_peer_never_sees_connect_on_a_reconnect(tmp_path: Path, certs: Certs) -> None:
    """The real server goes away and a plain-text impostor takes its port: the client reconnects to
    it with a TLS handshake, which fails, and never sends its login or a message in clear."""
    conf = tmp_path / "tls.conf"
    conf.write_text(certs.nats_tls() + f'authorization {{ user: "u", password: "{SECRET}" }}\n')
    ns = start_nats(tmp_path / "nats", extra_args=["-c", str(conf)])
    peer = PlainPeer(ours="tls-first-probe")
    nc = await connect(f"tls://127.0.0.1:{ns.port}", "tls-first-probe",
                       auth=NatsSettings(nats_user="u", nats_password=SECRET, nats_tls_ca=str(certs.ca)))
    try:
        await nc.publish("before", b"hello")
        await nc.flush()
        ns.stop()
        await peer.start(ns.port)
        # A row to send, buffered while the client reconnects (a task: nats-py may hold the call).
        pending = asyncio.create_task(nc.publish("after", b"row data in clear?"))
        deadline = asyncio.get_running_loop().time() + 20
        while peer.connections < 3:
            assert asyncio.get_running_loop().time() < deadline, "the client never came back"
            await asyncio.sleep(0.1)
        assert b"CONNECT" not in peer.received and SECRET.encode() not in peer.received, peer.received[:200]
        assert b"row data" not in peer.received and b"PUB" not in peer.received
        pending.cancel()
    finally:
        with contextlib.suppress(TimeoutError):  # nats-py's close waits on a reconnect that cannot succeed
            await asyncio.wait_for(nc.close(), 5)
        await peer.stop()


async def test_a_route_without_the_cluster_password_is_refused(tmp_path: Path) -> None:
    """A rogue nats-server that names a node as its route gets nothing of the cluster's traffic;
    the nodes, which log in to each other, route as before."""
    cluster = start_nats_cluster(tmp_path / "cluster", 2, route_password="route-secret")
    rogue = None
    try:
        cluster.wait_healthy()
        rogue = start_nats(tmp_path / "rogue", extra_args=[
            "-n", "rogue", "--cluster_name", "binlake", "--cluster", f"nats://127.0.0.1:{free_port()}",
            "--routes", f"nats://127.0.0.1:{cluster.route_ports[0]}"])
        a = await nats.connect(cluster.nodes[0].url)
        b = await nats.connect(cluster.nodes[1].url)
        spy = await nats.connect(rogue.url)
        try:
            routed = await b.subscribe("rows.>")
            stolen = await spy.subscribe("rows.>")
            await b.flush()
            await spy.flush()
            await asyncio.sleep(1.0)  # the rogue's route attempts, and the nodes' interest, settle
            for _ in range(5):
                await a.publish("rows.t", b"a row")
                await a.flush()
                await asyncio.sleep(0.2)
            assert (await routed.next_msg(timeout=5)).data == b"a row"
            with pytest.raises(nats.errors.TimeoutError):
                await stolen.next_msg(timeout=1)
            assert "Router connection closed: Authentication Failure" in cluster.nodes[0].log_file.read_text()
        finally:
            for nc in (a, b, spy):
                await nc.close()
    finally:
        if rogue is not None:
            rogue.stop()
        cluster.stop()

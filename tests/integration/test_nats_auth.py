"""Every service and command logs in to NATS the way the server demands: user and password,
token, TLS with a private CA and a client certificate. A refused login says what to set."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher.processes import ROOT, ServiceProcess, clean_env
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
    ns = start_nats(tmp_path / "nats", extra_args=["--tls", "--tlscert", str(certs.server_cert), "--tlskey",
                                                     str(certs.server_key), "--tlscacert", str(certs.ca),
                                                     "--tlsverify"])
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


def test_tls_asked_of_a_server_without_it_is_refused(tmp_path: Path, certs: Certs) -> None:
    ns = start_nats(tmp_path / "nats")
    try:
        plain = cli({"BINLAKE_NATS_URL": f"tls://127.0.0.1:{ns.port}", "BINLAKE_NATS_TLS_CA": str(certs.ca)}, "status")
        assert plain.returncode != 0 and "does not require TLS" in plain.stderr, plain.stderr
    finally:
        ns.stop()

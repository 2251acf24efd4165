"""Helpers for integration tests: run services as real processes, read streams back."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import nats
from nats.js.api import DeliverPolicy

from services.launcher.processes import ROOT, clean_env
from shared import objects
from shared.config import NatsSettings
from shared.jetstream import login_options, server_urls
from tests.servers import MariaDB


def parser_env(mariadb: MariaDB, nats_url: str, **overrides: str) -> dict[str, str]:
    env = clean_env(
        BINLAKE_SOURCE_URL=mariadb.dsn(),
        BINLAKE_NATS_URL=nats_url,
        BINLAKE_METRICS_PORT="0",
        BINLAKE_START="current",
        BINLAKE_LEASE_TTL_S="2",
        BINLAKE_HEARTBEAT_S="1",
        BINLAKE_RESTART_BASE_DELAY_S="0.2",
    )
    env.update(overrides)
    return env


def sink_env(nats_url: str, **overrides: str) -> dict[str, str]:
    env = clean_env(
        BINLAKE_NATS_URL=nats_url,
        BINLAKE_METRICS_PORT="0",
        BINLAKE_MEMBER_TTL_S="2",
        BINLAKE_CURSOR_INTERVAL_S="0.2",
        BINLAKE_RESTART_BASE_DELAY_S="0.2",
    )
    env.update(overrides)
    return env


@dataclass
class StoredMsg:
    seq: int
    subject: str
    headers: dict[str, str]
    env: dict[str, Any]


async def read_stream(nats_url: str, stream: str = "BINLAKE_RAW", subject: str = ">", *,
                      auth: NatsSettings | None = None, resolve: bool = True) -> list[StoredMsg]:
    """Every message currently in `stream` matching `subject`, in stream order (`auth`: the login);
    `resolve`: object references replaced by the envelopes they name."""
    servers = server_urls(nats_url)
    nc = await nats.connect(servers, **(login_options(auth, servers) if auth else {}))
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            return []
        if info.state.messages == 0:
            return []
        prefix, _, kind = stream.lower().rpartition("_")
        bucket = f"{prefix}_{kind}_objects" if kind in ("raw", "cdc") else None  # a dead letter is shown as it came
        last = info.state.last_seq
        sub = await js.pull_subscribe(subject, stream=stream, config=nats.js.api.ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL, ack_policy=nats.js.api.AckPolicy.NONE,
            filter_subject=subject if subject != ">" else None, inactive_threshold=30))
        out: list[StoredMsg] = []
        unavailable = 0
        while True:
            try:
                batch = await sub.fetch(1000, timeout=1)
            except nats.errors.TimeoutError:
                break
            except nats.js.errors.ServiceUnavailableError:
                # On a cluster a new consumer's first fetch can race its interest across routes.
                unavailable += 1
                if unavailable > 50:
                    raise
                await asyncio.sleep(0.2)
                continue
            for m in batch:
                # A message too large for NATS is read whole from its object, as binlake's readers do.
                data = await objects.resolve(js, m.data, bucket) if resolve and bucket else m.data
                out.append(StoredMsg(m.metadata.sequence.stream, m.subject, dict(m.headers or {}),
                                     msgpack.unpackb(data, raw=False, strict_map_key=False)))
            if out and out[-1].seq >= last:
                break
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


def read_stream_sync(nats_url: str, stream: str = "BINLAKE_RAW", subject: str = ">", *,
                     auth: NatsSettings | None = None, resolve: bool = True) -> list[StoredMsg]:
    return asyncio.run(read_stream(nats_url, stream, subject, auth=auth, resolve=resolve))


def cli_env(nats_url: str, **settings: str) -> dict[str, str]:
    """The environment of a `binlake` command a test runs: no BINLAKE_* setting of the caller's, but
    the rest inherited (coverage's subprocess measurement travels in it)."""
    return clean_env(BINLAKE_NATS_URL=nats_url, **settings)


def binlake_cli(nats_url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`binlake <args>` against the test's NATS, its output captured."""
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=ROOT, env=cli_env(nats_url),
                          capture_output=True, text=True, timeout=timeout)


def snapshot_cli(nats_url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return binlake_cli(nats_url, "snapshot", *args, timeout=timeout)


def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def row_changes(msgs: list[StoredMsg], db: str) -> list[StoredMsg]:
    return [m for m in msgs if m.env.get("db") == db and m.env["op"] in ("i", "u", "d")]


def count_rows(msgs: list[StoredMsg], db: str) -> int:
    return sum(len(m.env["rows"]) for m in row_changes(msgs, db))


def replay(msgs: list[StoredMsg], db: str, table: str, key: str = "id") -> dict[Any, dict[str, Any]]:
    """Apply a table's change events in order to an empty dict keyed by primary key."""
    state: dict[Any, dict[str, Any]] = {}
    for m in msgs:
        env = m.env
        if env.get("db") != db or env.get("table") != table or env["op"] not in ("i", "u", "d"):
            continue
        for row in env["rows"]:
            if "before" in row:
                state.pop(row["before"][key], None)
            if "after" in row:
                state[row["after"][key]] = row["after"]
    return state


def assert_table_order(msgs: list[StoredMsg]) -> None:
    """On every table subject, (scn, chunk) strictly increases (DESIGN §8.2)."""
    last: dict[str, tuple[int, int]] = {}
    for m in msgs:
        if m.env["op"] == "hb":
            continue
        key = (m.env["scn"], m.env["chunk"])
        assert key > last.get(m.subject, (-1, -1)), f"order broken on {m.subject}: {key} after {last[m.subject]}"
        last[m.subject] = key


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def assert_nats_refuses_anonymous(port: int, host: str = "127.0.0.1") -> None:
    """The server at `port` asks for a login and refuses a client without one."""
    # The protocol by hand: a client library would leave its half-open transport to the GC.
    with socket.create_connection((host, port), timeout=5) as sock:
        info = sock.recv(4096)
        assert info.startswith(b"INFO ") and b'"auth_required":true' in info, info
        sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"-ERR 'Authorization Violation'"), answer


SPARK_INTRUDER = "intruder"  # the application name of `spark_intruder_script`'s driver
# What a driver without the secret logs when a master with spark.authenticate turns it away (Spark 3.5):
# it did reach the master, and was refused for want of authentication.
SPARK_AUTH_REFUSED = "Expected SaslMessage"


def spark_intruder_script(master_url: str) -> str:
    """Python for a driver without the cluster's secret: asks `master_url` for executors, prints what they count."""
    return ("from pyspark.sql import SparkSession\n"
            f"s = SparkSession.builder.appName({SPARK_INTRUDER!r}).master({master_url!r}).getOrCreate()\n"
            "print('COUNTED', s.range(10).count(), flush=True)\n")


def assert_spark_intruder_refused(output: str, master_json: str) -> None:
    """The intruder reached the master and was refused: it counted nothing, and the master (its web
    UI's `/json/`) never took it as an application."""
    assert "COUNTED" not in output, output[-3000:]
    assert SPARK_AUTH_REFUSED in output, f"the intruder was not refused for want of the secret:\n{output[-3000:]}"
    apps = json.loads(master_json)
    assert not [a for a in apps.get("activeapps", []) + apps.get("completedapps", [])
                if a.get("name") == SPARK_INTRUDER], apps

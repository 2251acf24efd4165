"""JetStream out of room: the parser and the sink stop publishing with a clear error, `/healthz`
says why, nothing is lost, and capture goes on by itself once there is room again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path

import nats
import nats.js.errors
import pytest
from nats.js.api import StreamConfig

from services.launcher.processes import ServiceProcess
from services.launcher.servers import NatsServer, free_port, start_nats
from shared.actor import RECOVERED_S
from tests.integration.conftest import ParserFactory
from tests.integration.support import count_rows, http_get, read_stream_sync, wait_until
from tests.servers import MariaDB

STORE_LIMIT = 4 * 1024 * 1024
FILLER = "FILLER"


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server whose JetStream may store only STORE_LIMIT bytes."""
    conf = tmp_path / "limits.conf"
    conf.write_text(f"jetstream {{ max_file_store: {STORE_LIMIT} }}\n")
    server = start_nats(tmp_path / "nats", extra_args=["-c", str(conf)])
    try:
        yield server
    finally:
        server.stop()


async def _fill(url: str) -> int:
    """Publish into a stream of its own until JetStream refuses even a small message; bytes stored."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=FILLER, subjects=["filler"]))
        for size in (64 * 1024, 4096, 256, 16):
            while True:
                try:
                    await js.publish("filler", b"x" * size)
                except nats.js.errors.APIError as exc:
                    assert exc.err_code == 10023, exc  # insufficient resources
                    break
        return int((await js.stream_info(FILLER)).state.bytes)
    finally:
        await nc.close()


async def _make_room(url: str) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().delete_stream(FILLER)
    finally:
        await nc.close()


def _unhealthy(port: int) -> str | None:
    """/healthz's reason, None while healthy or not yet listening."""
    try:
        status, body = http_get(f"http://127.0.0.1:{port}/healthz")
    except urllib.error.URLError:
        return None
    return body if status == 503 else None


@pytest.mark.timeout(240)
def test_a_full_jetstream_stops_capture_with_the_reason_and_loses_nothing(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory,
        sink_factory: Callable[..., ServiceProcess], nats_url: str) -> None:
    parser_port, sink_port = free_port(), free_port()
    parser = parser_factory(BINLAKE_METRICS_PORT=str(parser_port))
    # A member for a minute without renewal: it keeps its partitions while its bucket is full.
    sink = sink_factory(BINLAKE_METRICS_PORT=str(sink_port), BINLAKE_MEMBER_TTL_S="60")
    mariadb.execute(f"CREATE TABLE `{database}`.t (id INT PRIMARY KEY, v VARCHAR(200))",
                    f"INSERT INTO `{database}`.t VALUES (0, 'before')")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), database) == 1, 60, "the first row")

    def insert(first: int) -> None:
        mariadb.execute(*(f"INSERT INTO `{database}`.t VALUES ({first + i}, REPEAT('v', 150))" for i in range(100)))

    assert sink.proc is not None
    os.kill(sink.proc.pid, signal.SIGSTOP)  # the sink moves nothing on for now
    try:
        insert(1)
        wait_until(lambda: count_rows(read_stream_sync(nats_url), database) == 101, 60, "100 rows in BINLAKE_RAW")
        assert asyncio.run(_fill(nats_url)) > STORE_LIMIT // 2
        raw_before = len(read_stream_sync(nats_url, resolve=False))
        insert(101)  # the parser cannot store them
    finally:
        os.kill(sink.proc.pid, signal.SIGCONT)  # nor the sink the first 100

    parser_reason = wait_until(lambda: _unhealthy(parser_port), 60, "the parser's /healthz to say why")
    sink_reason = wait_until(lambda: _unhealthy(sink_port), 60, "the sink's /healthz to say why")
    for reason, stream in ((parser_reason, "BINLAKE_RAW"), (sink_reason, "BINLAKE_CDC")):
        assert "JetStream has no room for" in reason and stream in reason and "loses nothing" in reason, reason
    # It waits, healthy processes and leases (their buckets are full too), for as long as it takes.
    time.sleep(8)
    assert _unhealthy(parser_port) and _unhealthy(sink_port)
    assert parser.running and sink.running, parser.output + sink.output
    assert len(read_stream_sync(nats_url, resolve=False)) == raw_before, "nothing got into a full store"
    assert count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), database) == 1

    asyncio.run(_make_room(nats_url))
    wait_until(lambda: count_rows(read_stream_sync(nats_url, "BINLAKE_CDC"), database) >= 201, 90,
               "every row in BINLAKE_CDC once there is room")
    cdc = [m for m in read_stream_sync(nats_url, "BINLAKE_CDC") if m.env.get("db") == database
           and m.env["op"] == "i"]
    assert [row["after"]["id"] for m in cdc for row in m.env["rows"]] == list(range(201)), "each row once, in order"
    for name, port in (("parser", parser_port), ("sink", sink_port)):
        def healthy(p: int = port) -> bool:
            return _unhealthy(p) is None

        try:
            wait_until(healthy, 30 + RECOVERED_S, f"the {name} healthy again")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it says: {_unhealthy(port)}") from None
    assert parser.running and sink.running

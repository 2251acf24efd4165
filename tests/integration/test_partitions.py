"""BINLAKE_PARTITIONS reaches every service: whichever starts first creates BINLAKE_RAW with that count."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats
import nats.js.errors

from services.launcher.processes import ServiceProcess
from tests.integration.conftest import ParserFactory
from tests.integration.support import read_stream_sync, wait_until
from tests.servers import MariaDB


def raw_transform(nats_url: str) -> str | None:
    async def get() -> str | None:
        nc = await nats.connect(nats_url)
        try:
            info = await nc.jetstream().stream_info("BINLAKE_RAW")
            return info.config.subject_transform.dest if info.config.subject_transform else None
        except nats.js.errors.NotFoundError:
            return None
        finally:
            await nc.close()

    return asyncio.run(get())


def test_32_partitions_set_up_by_the_sink_then_the_parser(
        mariadb: MariaDB, database: str, parser_factory: ParserFactory,
        service_factory: Callable[..., ServiceProcess], nats_url: str) -> None:
    # The parser and the sink create BINLAKE_RAW (their NATS users may; meta's may not read it).
    sink = service_factory("services.sink", "sink", BINLAKE_PARTITIONS="32")
    dest = wait_until(lambda: raw_transform(nats_url) or not sink.running, 30, "the sink to create BINLAKE_RAW")
    assert sink.running, sink.output
    assert "partition(32," in str(dest)

    parser = parser_factory(BINLAKE_PARTITIONS="32")
    mariadb.execute(f"CREATE TABLE `{database}`.t (id INT PRIMARY KEY)", f"INSERT INTO `{database}`.t VALUES (7)")
    routed = wait_until(lambda: [m for m in read_stream_sync(nats_url, "BINLAKE_CDC")
                                 if m.env.get("db") == database and m.env["op"] == "i"], 60, "the row in BINLAKE_CDC")
    assert routed[0].env["rows"] == [{"after": {"id": 7}}]
    assert parser.running and sink.running
    parser.stop()

    other = parser_factory(wait_ready=False, log_name="parser-16.log", BINLAKE_PARTITIONS="16")
    wait_until(lambda: "partitions are fixed at creation" in other.output or not other.running, 60,
               "the parser with another partition count to refuse the stream")
    assert "partitions are fixed at creation" in other.output

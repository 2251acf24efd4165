"""Fixtures that run services as real processes against the private servers; the one Spark session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from services.launcher.processes import ServiceProcess
from tests.integration.support import parser_env, read_stream_sync, sink_env, wait_until
from tests.servers import MariaDB

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ParserFactory = Callable[..., ServiceProcess]


@pytest.fixture
def parser_factory(source: MariaDB, nats_url: str, tmp_path: Path) -> Iterator[ParserFactory]:
    """Start parser processes (`**env` overrides); all are stopped at teardown."""
    procs: list[ServiceProcess] = []

    def make(wait_ready: bool = True, log_name: str = "parser.log", **env: str) -> ServiceProcess:
        proc = ServiceProcess("services.parser", parser_env(source, nats_url, **env), tmp_path / log_name).start()
        procs.append(proc)
        if wait_ready:
            wait_until(lambda: read_stream_sync(nats_url) or not proc.running, 30, "the parser's first message")
            assert proc.running, proc.output
        return proc

    yield make
    for p in procs:
        p.stop()


@pytest.fixture
def parser(parser_factory: ParserFactory) -> ServiceProcess:
    return parser_factory()


@pytest.fixture
def sink_factory(nats_url: str, tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """Start sink worker processes (`**env` overrides); all are stopped at teardown."""
    procs: list[ServiceProcess] = []

    def make(name: str = "sink", **env: str) -> ServiceProcess:
        proc = ServiceProcess("services.sink", sink_env(nats_url, BINLAKE_INSTANCE=name, **env),
                              tmp_path / f"{name}.log").start()
        procs.append(proc)
        return proc

    yield make
    for p in procs:
        p.stop()


@pytest.fixture
def service_factory(nats_url: str, tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """Start any binlake service (`module`, log `name`, `**env`); all are stopped at teardown."""
    procs: list[ServiceProcess] = []

    def make(module: str, name: str, **env: str) -> ServiceProcess:
        proc = ServiceProcess(module, sink_env(nats_url, **env), tmp_path / f"{name}.log").start()
        procs.append(proc)
        return proc

    yield make
    for p in procs:
        p.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """The one Spark session of this test process (the loader processes have their own)."""
    from services.loader.spark import CatalogConfig, session, stop

    base = tmp_path_factory.mktemp("spark")
    s = session("tests", "local[2]", CatalogConfig(warehouse=str(base / "warehouse")))
    try:
        yield s
    finally:
        stop(s)



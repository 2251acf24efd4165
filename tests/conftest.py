"""Shared fixtures: private MariaDB, MySQL and NATS JetStream servers (never the system ones)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.servers import (
    TEST_JVM_OPTIONS,
    MariaDB,
    MySQL,
    NatsServer,
    mariadb_binaries,
    nats_server_binary,
    require_mysql,
    start_mariadb,
    start_mysql,
    start_nats,
)
from tests.tiers import TIERS, run_order, tier_of

MariaDBFactory = Callable[..., MariaDB]

# Inherited by every process a test starts; added to what the caller set (xdist's workers import this again).
if TEST_JVM_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):
    os.environ["JAVA_TOOL_OPTIONS"] = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {TEST_JVM_OPTIONS}".strip()


def _require_mariadb() -> None:
    try:
        mariadb_binaries()
    except FileNotFoundError as exc:
        pytest.skip(f"MariaDB not available: {exc}")


def _require_nats() -> None:
    try:
        nats_server_binary()
    except FileNotFoundError as exc:
        pytest.skip(f"nats-server not available: {exc}")


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    """One binlog-enabled MariaDB for the whole session (ROW / FULL image / FULL metadata)."""
    _require_mariadb()
    server = start_mariadb(tmp_path_factory.mktemp("mariadb"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mysql(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MySQL]:
    """One MySQL 9.7 for the whole session (ROW / FULL image / FULL metadata / GTID on)."""
    require_mysql()
    server = start_mysql(tmp_path_factory.mktemp("mysql"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def source(request: pytest.FixtureRequest) -> MariaDB:
    """The source server of this test: MariaDB, or MySQL under `tests.servers.BOTH_SOURCES`."""
    server: MariaDB = request.getfixturevalue(getattr(request, "param", "mariadb"))
    return server


@pytest.fixture
def database(source: MariaDB) -> Iterator[str]:
    """A fresh, uniquely named database ``t_<hex>`` on the test's source server, dropped afterwards."""
    source.start()  # no-op unless an earlier test stopped/killed the shared server
    name = f"t_{uuid.uuid4().hex[:12]}"
    source.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    try:
        yield name
    finally:
        source.start()
        source.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def mariadb_factory(tmp_path: Path) -> Iterator[MariaDBFactory]:
    """``make(log_bin=True, extra_args=()) -> MariaDB`` for specially configured servers."""
    _require_mariadb()
    created: list[MariaDB] = []

    def make(*, log_bin: bool = True, extra_args: Sequence[str] = ()) -> MariaDB:
        server = start_mariadb(tmp_path / f"mariadb{len(created)}", log_bin=log_bin, extra_args=extra_args)
        created.append(server)
        return server

    try:
        yield make
    finally:
        for server in created:
            server.stop()


@pytest.fixture
def mysql_factory(tmp_path: Path) -> Iterator[Callable[..., MySQL]]:
    """``make(server_id=1, extra_args=()) -> MySQL`` for servers of a test's own (replication, settings)."""
    require_mysql()
    created: list[MySQL] = []

    def make(*, server_id: int = 1, extra_args: Sequence[str] = ()) -> MySQL:
        server = start_mysql(tmp_path / f"mysql{len(created)}", server_id=server_id, extra_args=extra_args)
        created.append(server)
        return server

    try:
        yield make
    finally:
        for server in created:
            server.stop()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh private JetStream nats-server for this test."""
    _require_nats()
    server = start_nats(tmp_path / "nats")
    try:
        yield server
    finally:
        server.stop()  # SIGKILLs if SIGTERM does not finish within the stop timeout


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    """Client URL of the per-test nats-server."""
    return nats_server.url


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: a test of the {tier} tier (tests/tiers.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier, and run the longest modules first (parallel workers then end together)."""
    for item in items:
        item.add_marker(tier_of(item.path))
    items.sort(key=lambda item: run_order(item.path))  # stable: a module's tests stay together, in order

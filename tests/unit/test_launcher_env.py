"""`binlake up` hands its children the caller's BINLAKE_* settings, with its own servers' wiring over them."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.launcher.app import child_env
from services.launcher.config import LauncherConfig


def test_snapshot_tables_reach_the_children() -> None:
    cfg = LauncherConfig(snapshot_tables=r"shop\..*")
    env = child_env(cfg, Path("/data"), "nats://127.0.0.1:1", "mysql://root@127.0.0.1:2")
    assert env["BINLAKE_SNAPSHOT_TABLES"] == r"shop\..*"


def test_the_callers_settings_reach_the_children_under_the_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_CONFIG", "/etc/binlake.toml")  # masks configured there must apply
    monkeypatch.setenv("BINLAKE_MASKS", '{"shop.users": {"email": "hash"}}')
    monkeypatch.setenv("BINLAKE_SNAPSHOT_CHUNK_ROWS", "7")
    monkeypatch.setenv("BINLAKE_FLUSH_S", "30")
    monkeypatch.setenv("BINLAKE_NATS_URL", "nats://elsewhere:4222")  # not the bus `up` started
    monkeypatch.setenv("BINLAKE_INSTANCE", "mine")
    monkeypatch.setenv("BINLAKE_NATS_TOKEN", "for-another-bus")  # would stack on the login `up` generates
    env = child_env(LauncherConfig(), Path("/data"), "nats://127.0.0.1:1", "mysql://root@127.0.0.1:2")
    assert "BINLAKE_NATS_TOKEN" not in env
    assert env["BINLAKE_CONFIG"] == "/etc/binlake.toml" and env["BINLAKE_SNAPSHOT_CHUNK_ROWS"] == "7"
    assert env["BINLAKE_MASKS"] == '{"shop.users": {"email": "hash"}}' and env["BINLAKE_FLUSH_S"] == "30"
    assert env["BINLAKE_NATS_URL"] == "nats://127.0.0.1:1" and env["BINLAKE_DATA_DIR"] == "/data"
    assert "BINLAKE_INSTANCE" not in env


def test_no_snapshot_option_no_variable() -> None:
    env = child_env(LauncherConfig(), Path("/data"), "nats://127.0.0.1:1", "mysql://root@127.0.0.1:2")
    assert "BINLAKE_SNAPSHOT_TABLES" not in env


def test_the_option_is_read_from_the_environment() -> None:
    assert LauncherConfig.from_env({"BINLAKE_SNAPSHOT_TABLES": "a\\.b"}).snapshot_tables == "a\\.b"


def test_a_nats_cluster_of_three_gets_three_replicas() -> None:
    cfg = LauncherConfig.from_env({"BINLAKE_NATS_CLUSTER": "3"})
    assert (cfg.nats_cluster, cfg.replicas) == (3, 3)
    assert child_env(cfg, Path("/data"), "nats://a:1,nats://b:2", "mysql://x@h:3")["BINLAKE_REPLICAS"] == "3"
    assert LauncherConfig().replicas == 1 and LauncherConfig(nats_cluster=2).replicas == 1


@pytest.mark.parametrize("nodes", ["0", "6"])
def test_nats_cluster_size_is_checked(nodes: str) -> None:
    from shared.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--nats-cluster must be 1\.\.5 nodes"):
        LauncherConfig.from_env({"BINLAKE_NATS_CLUSTER": nodes})


def test_the_banner_never_shows_the_source_password() -> None:
    from services.launcher.app import _shown

    assert _shown("mysql://binlake:S3cret@db.example:3307/x") == "mysql://binlake@db.example:3307/x"
    assert "S3cret" not in _shown("mysql://u:S3cret@db:notaport")


def test_a_private_source_is_read_from_its_first_binlog_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write right after the banner, before the parser has read the position, is not skipped."""
    monkeypatch.delenv("BINLAKE_START", raising=False)
    args = (LauncherConfig(), Path("/data"), "nats://127.0.0.1:1", "mysql://root@127.0.0.1:2")
    assert child_env(*args, private_source=True)["BINLAKE_START"] == "earliest"
    assert "BINLAKE_START" not in child_env(*args)  # the user's own server: the parser's default
    monkeypatch.setenv("BINLAKE_START", "current")
    assert child_env(*args, private_source=True)["BINLAKE_START"] == "current"  # the caller's word wins

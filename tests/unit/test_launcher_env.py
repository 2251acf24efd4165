"""`binlake up` hands its children the caller's BINLAKE_* settings, with its own servers' wiring over them,
and its secrets as files only."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.launcher.app import child_env
from services.launcher.config import LauncherConfig
from shared.errors import ConfigError


def test_snapshot_tables_reach_the_children() -> None:
    cfg = LauncherConfig(snapshot_tables=r"shop\..*")
    env = child_env(cfg, Path("/data"), "nats://127.0.0.1:1")
    assert env["BINLAKE_SNAPSHOT_TABLES"] == r"shop\..*"


def test_the_callers_settings_reach_the_children_under_the_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_CONFIG", "/etc/binlake.toml")  # masks configured there must apply
    monkeypatch.setenv("BINLAKE_MASKS", '{"shop.users": {"email": "hash"}}')
    monkeypatch.setenv("BINLAKE_SNAPSHOT_CHUNK_ROWS", "7")
    monkeypatch.setenv("BINLAKE_FLUSH_S", "30")
    monkeypatch.setenv("BINLAKE_NATS_URL", "nats://elsewhere:4222")  # not the bus `up` started
    monkeypatch.setenv("BINLAKE_INSTANCE", "mine")
    monkeypatch.setenv("BINLAKE_NATS_TOKEN", "for-another-bus")  # would stack on the login `up` generates
    env = child_env(LauncherConfig(), Path("/data"), "nats://127.0.0.1:1")
    assert "BINLAKE_NATS_TOKEN" not in env
    assert env["BINLAKE_CONFIG"] == "/etc/binlake.toml" and env["BINLAKE_SNAPSHOT_CHUNK_ROWS"] == "7"
    assert env["BINLAKE_MASKS"] == '{"shop.users": {"email": "hash"}}' and env["BINLAKE_FLUSH_S"] == "30"
    assert env["BINLAKE_NATS_URL"] == "nats://127.0.0.1:1" and env["BINLAKE_DATA_DIR"] == "/data"
    assert "BINLAKE_INSTANCE" not in env


def test_no_snapshot_option_no_variable() -> None:
    env = child_env(LauncherConfig(), Path("/data"), "nats://127.0.0.1:1")
    assert "BINLAKE_SNAPSHOT_TABLES" not in env


def test_the_option_is_read_from_the_environment() -> None:
    assert LauncherConfig.from_env({"BINLAKE_SNAPSHOT_TABLES": "a\\.b"}).snapshot_tables == "a\\.b"


def test_a_nats_cluster_of_three_gets_three_replicas() -> None:
    cfg = LauncherConfig.from_env({"BINLAKE_NATS_CLUSTER": "3"})
    assert (cfg.nats_cluster, cfg.replicas) == (3, 3)
    assert child_env(cfg, Path("/data"), "nats://a:1,nats://b:2")["BINLAKE_REPLICAS"] == "3"
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
    args = (LauncherConfig(), Path("/data"), "nats://127.0.0.1:1")
    assert child_env(*args, private_source=True)["BINLAKE_START"] == "earliest"
    assert "BINLAKE_START" not in child_env(*args)  # the user's own server: the parser's default
    monkeypatch.setenv("BINLAKE_START", "current")
    assert child_env(*args, private_source=True)["BINLAKE_START"] == "current"  # the caller's word wins


def test_the_children_get_their_secrets_as_files_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source URL (from `up --source-url` too) and the NATS passwords reach the children as files."""
    from services.launcher import login, source
    from services.launcher.app import services
    from services.parser.config import ParserConfig
    from shared import permissions

    url = "mysql://app:S3cret@db.example:3306"
    monkeypatch.setenv("BINLAKE_SOURCE_URL", url)  # what `binlake up --source-url` leaves in its environment
    monkeypatch.setenv("BINLAKE_SOURCE_URL_FILE", "/elsewhere")
    monkeypatch.setenv("BINLAKE_NATS_PASSWORD", "n4ts-S3cret")
    source.record_url(tmp_path, url)
    cfg = LauncherConfig(sinks=1)
    children = services(cfg, child_env(cfg, tmp_path, "nats://127.0.0.1:1"), tmp_path)
    secrets = ["S3cret", *(login.password(tmp_path, role) for role in permissions.ROLES)]
    for child in children:
        assert "BINLAKE_SOURCE_URL" not in child.env and "BINLAKE_NATS_PASSWORD" not in child.env
        assert child.env["BINLAKE_SOURCE_URL_FILE"] == str(tmp_path / "source-url")
        assert [k for k, v in child.env.items() if any(s in v for s in secrets)] == [], child.name
    assert source.url_file(tmp_path).stat().st_mode & 0o777 == 0o600
    parser = next(c for c in children if c.name == "parser")
    assert ParserConfig.from_env(parser.env).source_url == url  # the parser reads it from the file


def test_the_banner_shows_how_to_log_in_without_a_secret(tmp_path: Path) -> None:
    from services.launcher.app import banner
    from services.launcher.servers import MariaDB, MySQL, NatsServer

    def server(kind: type[MariaDB]) -> MariaDB:
        return kind(host="127.0.0.1", port=3306, socket="", datadir=tmp_path, basedir=tmp_path, proc=None, args=[],
                    root_password="R00t-S3cret")

    nats = NatsServer(port=4222, store_dir=tmp_path, log_file=tmp_path / "log", proc=None, args=[])
    url = "mysql://binlake:B1nlake-S3cret@127.0.0.1:3306"
    text = banner(LauncherConfig(), tmp_path, nats, url, private=server(MariaDB))
    assert f"nats --context {tmp_path}/nats-context.json stream info BINLAKE_CDC" in text
    assert f"as root: mariadb --defaults-file={tmp_path}/my.cnf" in text and "mysql://binlake@127.0.0.1:3306" in text
    assert "S3cret" not in text and "--password" not in text
    mysql = banner(LauncherConfig(), tmp_path, nats, url, private=server(MySQL))
    assert f"as root: mysql --defaults-file={tmp_path}/my.cnf" in mysql
    assert "as root" not in banner(LauncherConfig(), tmp_path, nats, "mysql://app@db:3306")  # the user's server


def test_the_nats_context_file_logs_in_as_admin(tmp_path: Path) -> None:
    import json

    from services.launcher import login

    path = login.write_context(tmp_path, "nats://127.0.0.1:4222")
    assert path.stat().st_mode & 0o777 == 0o600 and path.name.endswith(".json")  # natscli loads *.json paths
    assert json.loads(path.read_text()) == {"description": "binlake up: the admin", "url": "nats://127.0.0.1:4222",
                                            "user": "admin", "password": login.password(tmp_path)}


def test_the_binlake_user_may_write_only_the_watermarks_database() -> None:
    from services.launcher import source

    assert source.grants({}) == ("REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.*",
                                 "CREATE, INSERT, UPDATE ON `binlake`.*")
    assert source.grants({"BINLAKE_WATERMARK_TABLE": "ops.marks"})[1] == "CREATE, INSERT, UPDATE ON `ops`.*"


@pytest.mark.parametrize(("setting", "size"), [("20G", 20 << 30), ("512M", 512 << 20), ("3GiB", 3 << 30),
                                               ("1048576", 1 << 20), ("2t", 2 << 40)])
def test_the_store_limit_is_a_size(setting: str, size: int, tmp_path: Path) -> None:
    from services.launcher.app import store_limit

    cfg = LauncherConfig(nats_max_store=setting)
    assert cfg.max_store_bytes == size and store_limit(cfg, tmp_path) == size


@pytest.mark.parametrize("setting", ["lots", "0", "-5G", "1.5G", "20X"])
def test_a_store_limit_that_is_no_size_is_refused(setting: str) -> None:
    with pytest.raises(ConfigError, match="BINLAKE_NATS_MAX_STORE must be a size like 20G"):
        LauncherConfig(nats_max_store=setting)


@pytest.mark.parametrize("setting", ["always", "1s", "500ms", "2m"])
def test_the_sync_interval_reaches_the_nats_configuration(setting: str, tmp_path: Path) -> None:
    from services.launcher import login
    from shared.subjects import Names

    assert LauncherConfig().nats_sync == "always"  # acknowledged means on disk, unless the operator says otherwise
    text = login.server_config(tmp_path, Names(), max_store=1 << 30,
                               sync=LauncherConfig(nats_sync=setting).nats_sync).read_text()
    block = text.split("}", 1)[0]
    assert block.startswith("jetstream {") and f"max_file_store: {1 << 30}" in block
    assert f'sync_interval: "{setting}"' in block  # a bare 2m is 2,000,000 seconds to nats-server


@pytest.mark.parametrize("setting", ["sometimes", "1.5s", "5", "always ", "", "0s", "1\u0663s", "9999999h",
                                     "always\n"])
def test_a_sync_interval_that_is_no_duration_is_refused(setting: str) -> None:
    with pytest.raises(ConfigError, match="BINLAKE_NATS_SYNC must be always or a duration"):
        LauncherConfig(nats_sync=setting)


def test_the_default_store_limit_leaves_a_quarter_of_the_disk_and_counts_what_is_held(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.launcher import app
    from services.launcher.servers import NatsServer

    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(100 << 30, 60 << 30, 40 << 30))
    assert app.store_limit(LauncherConfig(), tmp_path) == 30 << 30
    (tmp_path / "nats" / "jetstream").mkdir(parents=True)
    (tmp_path / "nats" / "jetstream" / "blk").write_bytes(b"x" * (4 << 20))  # held: counted, never locked out
    assert app.store_limit(LauncherConfig(), tmp_path) == (40 << 30) * 3 // 4 + (4 << 20)
    assert app.store_limit(LauncherConfig(nats_cluster=3), tmp_path) == ((40 << 30) * 3 // 4 + (4 << 20)) // 3
    nats = NatsServer(port=4222, store_dir=tmp_path, log_file=tmp_path / "log", proc=None, args=[])
    text = app.banner(LauncherConfig(), tmp_path, nats, "mysql://app@db:3306", max_store=20 << 30)
    assert "JetStream keeps up to 20.0 GiB (BINLAKE_NATS_MAX_STORE)" in text


def test_a_planted_symlink_is_neither_read_nor_written_through(tmp_path: Path) -> None:
    from services.launcher import login

    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("known-password\n")
    (tmp_path / "nats-users").mkdir()
    login.password_file(tmp_path, "admin").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        login.password(tmp_path, "admin")
    login.context_file(tmp_path).symlink_to(tmp_path / "outside.json")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        login.write_private(login.context_file(tmp_path), "{}")
    assert not (tmp_path / "outside.json").exists() and elsewhere.read_text() == "known-password\n"

"""`binlake up --spark-workers N`: the cluster's commands, the loader's settings, the warehouse path."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from services.launcher.app import services, with_cluster
from services.launcher.config import LauncherConfig
from services.launcher.spark_cluster import auth_conf, secret_to_properties, spark_cluster
from services.launcher.spark_daemon import command
from services.loader.config import LoaderConfig
from shared.errors import ConfigError


def test_a_master_and_workers_that_point_at_it(tmp_path: Path) -> None:
    c = spark_cluster(tmp_path / "spark", 2, {"PATH": "/bin"})
    assert [ch.name for ch in c.children] == ["spark-master", "spark-worker-1", "spark-worker-2"]
    assert c.master.command[1:3] == ["org.apache.spark.deploy.master.Master", "--host"]
    assert c.master.command[c.master.command.index("--port") + 1] == str(c.master_port)
    for i, worker in enumerate(c.workers, 1):
        assert worker.command[1:3] == ["org.apache.spark.deploy.worker.Worker", c.master_url]
        assert worker.command[worker.command.index("--work-dir") + 1] == str(tmp_path / "spark" / f"work-{i}")
        assert worker.env["SPARK_LOCAL_IP"] == "127.0.0.1" and worker.env["PATH"] == "/bin"
        assert worker.env["SPARK_LOG_DIR"].startswith(str(tmp_path))
    assert c.client_env()["BINLAKE_MASTER"] == c.master_url == f"spark://127.0.0.1:{c.master_port}"


def test_the_cluster_runs_first_and_the_loader_gets_its_url(tmp_path: Path) -> None:
    c = spark_cluster(tmp_path, 1, {})
    children = services(LauncherConfig(sinks=1), {"BINLAKE_NATS_URL": "nats://x", **c.client_env()}, tmp_path)
    assert len(with_cluster(children, c)) == len(children) + 2
    loader = next(ch for ch in children if ch.name == "loader")
    assert loader.env["BINLAKE_MASTER"] == c.master_url


def test_spark_workers_setting() -> None:
    assert LauncherConfig.from_env({}).spark_workers == 0
    assert LauncherConfig.from_env({"BINLAKE_SPARK_WORKERS": "3"}).spark_workers == 3
    with pytest.raises(ConfigError, match="spark-workers"):
        LauncherConfig(spark_workers=-1)


def test_a_plain_warehouse_path_is_made_absolute_for_the_executors(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert LoaderConfig(warehouse="lake").root == str(tmp_path / "lake")
    assert LoaderConfig(data_dir="d").root == str(tmp_path / "d" / "lake")
    assert LoaderConfig(warehouse="hdfs://nn:8020/lake").root == "hdfs://nn:8020/lake"
    assert LoaderConfig(warehouse="file:/x/lake").root == "file:/x/lake"


def test_the_cluster_and_its_driver_share_a_secret_kept_off_command_lines(tmp_path: Path) -> None:
    c = spark_cluster(tmp_path / "spark", 1, {"PATH": "/bin"})
    assert stat.S_IMODE(c.auth.stat().st_mode) == 0o600 and stat.S_IMODE((tmp_path / "spark").stat().st_mode) == 0o700
    text = c.auth.read_text()
    assert "spark.authenticate true" in text and "spark.network.crypto.enabled true" in text
    assert "spark.ui.killEnabled false" in text
    secret = text.split("spark.authenticate.secret ")[1].split()[0]
    assert len(secret) == 64
    for child in c.children:
        assert child.command[child.command.index("--properties-file") + 1] == str(c.auth)
        assert secret not in " ".join(child.command) and secret not in " ".join(child.env.values())
    assert c.client_env()["BINLAKE_SPARK_PROPERTIES"] == str(c.auth)
    assert spark_cluster(tmp_path / "spark", 1, {}).auth.read_text() == text  # made once, kept


def test_a_driver_properties_file_that_is_missing_is_refused(tmp_path: Path) -> None:
    from services.loader.spark import CatalogConfig, session

    with pytest.raises(ConfigError, match="BINLAKE_SPARK_PROPERTIES"):
        session("t", "spark://127.0.0.1:1", CatalogConfig(warehouse=str(tmp_path)), properties=str(tmp_path / "no"))


def properties(path: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in Path(path).read_text().splitlines())


def test_a_containers_secret_becomes_a_private_properties_file_and_leaves_the_environment() -> None:
    env = {"BINLAKE_SPARK_SECRET": "ab" * 16, "PATH": "/bin"}
    path = secret_to_properties(env)
    assert path is not None and env == {"PATH": "/bin", "BINLAKE_SPARK_PROPERTIES": path}
    assert properties(path) == auth_conf("ab" * 16)  # what `binlake up --spark-workers` writes
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    other = secret_to_properties({"BINLAKE_SPARK_SECRET": "cd" * 16})
    assert other is not None and os.path.dirname(other) != os.path.dirname(path)  # a new directory each start
    assert secret_to_properties({"PATH": "/bin"}) is None


@pytest.mark.parametrize("env", [{"BINLAKE_SPARK_SECRET": ""}, {"BINLAKE_SPARK_SECRET": "a b"},
                                 {"BINLAKE_SPARK_SECRET": "ab\\"},
                                 {"BINLAKE_SPARK_SECRET": "ab", "BINLAKE_SPARK_PROPERTIES": "/x"}])
def test_a_secret_that_a_properties_file_would_change_or_two_sources_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="BINLAKE_SPARK_SECRET"):
        secret_to_properties(env)


@pytest.mark.parametrize("daemon", ["master", "worker"])
def test_the_compose_daemons_read_the_secret_from_a_file(daemon: str) -> None:
    """`binlake spark master|worker` as deploy/docker-compose.cluster.yml runs them."""
    secret = "ef" * 16
    argv, env = command([daemon, "--webui-port", "8080"], {"BINLAKE_SPARK_SECRET": secret, "PATH": "/bin"})
    assert argv[0].endswith("/bin/spark-class") and argv[2:4] == ["--webui-port", "8080"]
    assert argv[-2:] == ["--properties-file", env["BINLAKE_SPARK_PROPERTIES"]]
    assert properties(argv[-1])["spark.authenticate.secret"] == secret
    assert secret not in " ".join(argv) and secret not in " ".join(env.values())
    plain, _ = command([daemon], {"PATH": "/bin"})
    assert "--properties-file" not in plain
    with pytest.raises(ConfigError, match="--properties-file"):
        command([daemon, "--properties-file", "/x"], {"BINLAKE_SPARK_SECRET": secret})


def test_the_loaders_driver_gets_the_secret_as_its_properties_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.loader.__main__ import load

    monkeypatch.setenv("BINLAKE_SPARK_SECRET", "12" * 16)
    monkeypatch.delenv("BINLAKE_SPARK_PROPERTIES", raising=False)
    cfg = load()
    assert "BINLAKE_SPARK_SECRET" not in os.environ  # nor in what the driver's JVM inherits
    assert properties(cfg.spark_properties)["spark.authenticate.secret"] == "12" * 16

"""`binlake up --spark-workers N`: the cluster's commands, the loader's settings, the warehouse path."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from services.launcher.app import services, with_cluster
from services.launcher.config import LauncherConfig
from services.launcher.spark_cluster import spark_cluster
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

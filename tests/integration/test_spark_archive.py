"""The Spark class-data archive (`binlake setup spark`, services/loader/class_archive.py): recorded,
checked, installed atomically, and mapped by every local session; a broken one is never installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from services.launcher.processes import ROOT, clean_env
from services.loader import class_archive


def _installed() -> Path:
    path = class_archive.archive_path()
    if not path.is_file():
        pytest.skip(f"no Spark class archive at {path}: `binlake setup spark` (.ci/run does it) first")
    return path


def test_every_local_session_maps_the_archive(spark: SparkSession) -> None:
    path = _installed()
    bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()  # type: ignore[union-attr]
    assert f"-XX:SharedArchiveFile={path}" in list(bean.getInputArguments())
    assert "sharing" in str(spark.sparkContext._jvm.java.lang.System.getProperty("java.vm.info"))  # type: ignore[union-attr]


def test_setup_spark_keeps_the_archive_it_made() -> None:
    """(.ci/run made it with `binlake setup spark`: recorded, checked, renamed into place.)"""
    path = _installed()
    made = path.stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-m", "services.cli", "setup", "spark"], cwd=ROOT, env=clean_env(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.strip() == f"Spark class archive ready at {path}"
    assert path.stat().st_mtime_ns == made
    assert [n for n in os.listdir(path.parent) if n.startswith(".partial-")] == []


def test_a_truncated_archive_is_never_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JVM dies (SIGBUS) mapping a truncated archive: the check run catches it before the rename."""
    good = _installed()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    real_run = class_archive._run

    def record_truncated(options: str, what: str) -> None:
        if "ArchiveClassesAtExit=" in options:  # a dump cut short (say, by a full disk)
            partial = Path(options.split("ArchiveClassesAtExit=", 1)[1].split()[0])
            with good.open("rb") as src:
                partial.write_bytes(src.read(2 ** 20))
        else:
            real_run(options, what)

    monkeypatch.setattr(class_archive, "_run", record_truncated)
    with pytest.raises(RuntimeError, match="the Spark run that checks the archive failed"):
        class_archive.create()
    assert not class_archive.archive_path().exists()
    assert os.listdir(tmp_path / "binlake" / "spark-cds") == [], "the partial archive was left behind"
    assert class_archive.java_options() == ""


def test_no_archive_no_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert class_archive.java_options() == ""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert class_archive.java_options() == ""  # no java: Spark says so itself, the option stays out


def test_the_local_cluster_daemons_map_it_too(tmp_path: Path) -> None:
    """`binlake up --spark-workers`: the master's and workers' class path is the driver's (Spark's jars)."""
    from services.launcher.spark_cluster import spark_env

    path = _installed()
    assert f"-XX:SharedArchiveFile={path}" in spark_env(tmp_path, {})["SPARK_DAEMON_JAVA_OPTS"]


def test_an_archive_cut_short_after_it_was_made_is_not_mapped(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy cut short (disk error, a partial rsync of the cache) would kill every JVM that maps it."""
    good = _installed()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "with space"))
    path = class_archive.archive_path()
    path.parent.mkdir(parents=True)
    path.with_name(path.name + ".size").write_text(str(good.stat().st_size))
    path.write_bytes(good.read_bytes())
    assert class_archive.java_options() == f"'-XX:SharedArchiveFile={path}'"  # quoted: Spark splits at spaces
    with path.open("r+b") as f:
        f.truncate(2 ** 20)
    assert class_archive.java_options() == ""

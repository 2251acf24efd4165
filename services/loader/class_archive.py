"""A class-data archive of the Spark driver's JVM (Java's AppCDS): Spark's, Iceberg's and the JDK's
classes mapped from one file instead of found, parsed and verified one by one at every start.

A local session starts 1.45x faster and has run a loader's first batch 1.3x sooner, on an idle
machine and on a busy one alike (`bench/spark_start.py`): the loader takes over sooner after a
failover, `binlake verify` answers sooner. `binlake setup
spark` writes the archive once per machine or image; `spark.session` uses it when it is there.
It is named by what it was made from (the java binary, pyspark's and Iceberg's jars), so an
upgrade of any of them makes a new name: a stale archive is never used.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from shared.cache import cache_dir
from shared.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _java() -> str:
    """The java Spark's launcher runs: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not found or not os.path.exists(found):
        raise ConfigError("no java found (set JAVA_HOME or put java on PATH): the loader's Spark needs Java 17")
    return os.path.realpath(found)


def _jars() -> list[str]:
    import pyspark

    from services.loader.spark import iceberg_jars

    spark_jars = Path(pyspark.__file__).parent / "jars"
    return [*sorted(str(j) for j in spark_jars.glob("*.jar")), *iceberg_jars()]


def archive_path() -> Path:
    """Where the archive for this java and these jars is (whether or not it exists)."""
    java = _java()
    jvm = os.path.join(os.path.dirname(java), os.pardir, "lib", "server", "libjvm.so")
    digest = hashlib.sha256()
    for path in (java, *([jvm] if os.path.exists(jvm) else []), *_jars()):
        st = os.stat(path)
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return cache_dir() / "spark-cds" / f"{digest.hexdigest()[:20]}.jsa"


def _size_file(path: Path) -> Path:
    return path.with_name(path.name + ".size")


def usable(path: Path) -> bool:
    """The archive is there whole: its size is the one the check run saw (a truncated archive
    kills the JVM at start with SIGBUS, so a copy cut short must never be mapped)."""
    try:
        return path.stat().st_size == int(_size_file(path).read_text())
    except (OSError, ValueError):
        return False


def java_options() -> str:
    """The driver JVM's option that maps the archive ("" when there is none: Java loads as usual).

    Quoted: Spark splits its JVM options at spaces, and a cache path may hold one."""
    try:
        path = archive_path()
    except (ConfigError, OSError):
        return ""
    return shlex.quote(f"-XX:SharedArchiveFile={path}") if usable(path) else ""


def exercise(spark: SparkSession, table: str = "lake.db.t") -> None:
    """What the loader does on its first batch: the classes the archive should hold."""
    import pyarrow as pa

    from services.loader.tables import arrow_to_spark

    spark.sql(f"CREATE TABLE {table} (id BIGINT, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2')")
    changes = arrow_to_spark(spark, pa.table({"id": [1, 2], "v": ["a", "b"]}), {"id": "bigint", "v": "string"})
    changes.createOrReplaceTempView("changes")
    spark.sql(f"INSERT INTO {table} SELECT * FROM changes")
    spark.sql(f"MERGE INTO {table} t USING changes s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
              "WHEN NOT MATCHED THEN INSERT *")
    spark.sql(f"ALTER TABLE {table} ADD COLUMN n INT")
    spark.sql(f"DELETE FROM {table} WHERE id = 2")
    list(spark.table(table).toLocalIterator())


# A run of `exercise` with the JVM options in argv[1]: to record the archive (the JVM writes it
# as it exits), then to check it (a truncated archive crashes the JVM at start: never install one).
_RUN = """
import shutil, sys, tempfile
from services.loader.class_archive import exercise
from services.loader.spark import CatalogConfig, quiet_log4j, session, stop
warehouse = tempfile.mkdtemp(prefix="binlake-cds-")
try:
    spark = session("binlake-setup-spark", "local[2]", CatalogConfig(warehouse=warehouse),
                    {"spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{quiet_log4j()} {sys.argv[1]}"})
    exercise(spark)
    gateway = spark.sparkContext._gateway
    stop(spark)
    # spark-submit became the JVM; it exits (and writes the archive) when its stdin closes
    gateway.proc.stdin.close()
    code = gateway.proc.wait(600)
finally:
    shutil.rmtree(warehouse, ignore_errors=True)
sys.exit(code)
"""


def create() -> Path:
    """Write the archive for this machine's java and jars (about a minute), unless it exists."""
    path = archive_path()
    if usable(path):
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=path.parent)) / path.name
    except OSError as exc:
        raise ConfigError(f"cannot write the class archive into {path.parent} ({exc}): "
                          "set XDG_CACHE_HOME to a writable directory") from None
    q = shlex.quote
    try:
        _run(f"{q(f'-XX:ArchiveClassesAtExit={partial}')} -Xlog:cds=off,cds+dynamic=off", "records the archive")
        if not partial.is_file():
            raise RuntimeError(f"the Spark run that records the archive wrote no {partial}")
        # (a JVM that crashes on it writes its hs_err file next to it, not into the working directory)
        _run(f"{q(f'-XX:SharedArchiveFile={partial}')} -Xshare:on {q(f'-XX:ErrorFile={partial.parent}/hs_err_%p.log')}",
             "checks the archive")
        _size_file(path).write_text(str(partial.stat().st_size))
        os.replace(partial, path)  # atomic: a JVM starting now maps the whole archive or none
    finally:
        shutil.rmtree(partial.parent, ignore_errors=True)
    return path


def _run(options: str, what: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BINLAKE_")}
    run = subprocess.run([sys.executable, "-c", _RUN, options], env=env, capture_output=True, text=True,
                         timeout=900, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"the Spark run that {what} failed (exit {run.returncode}):\n"
                           f"{run.stdout[-2000:]}\n{run.stderr[-4000:]}")

"""The Spark session with the lake's Iceberg catalog: local by default, any cluster through `master`.

The embedded default is pyspark 3.5 with the Iceberg runtime and SQL extensions jars that
the PyPI wheel `snowpark-connect-deps-iceberg` ships (found in site-packages here). With
Maven access, Spark 4 works the same way: set `spark.jars.packages` to
`org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:<version>` in `spark_conf`, and the
bundled jars are not added. Nothing else here is Spark-version specific.

On a cluster (`spark://host:7077`) the jars reach the executors through `spark.jars`: the
driver serves them and every executor fetches them. Python workers run this interpreter
(`PYSPARK_PYTHON`), which must exist at the same path on every worker machine.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import os
import shlex
import site
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from services.loader import class_archive
from shared.errors import ConfigError

_JARS = ("iceberg-spark-runtime-3.5_2.12-*.jar", "iceberg-spark-extensions-3.5_2.12-*.jar")


LOCAL_DRIVER_MEMORY = "2g"  # the JVM's heap under a local master, unless BINLAKE_SPARK_CONF sets spark.driver.memory


@dataclass(frozen=True)
class CatalogConfig:
    """Where the lake lives: an Iceberg catalog named `name` (Spark SQL `<name>.<db>.<table>`)."""

    name: str = "lake"
    type: str = "hadoop"  # hadoop | jdbc | rest | hive | glue | nessie ... (Iceberg's catalog types)
    warehouse: str = ""
    uri: str = ""  # jdbc:mysql://..., http://rest-catalog, thrift://metastore
    options: dict[str, str] = field(default_factory=dict)  # more spark.sql.catalog.<name>.* settings

    def spark_conf(self) -> dict[str, str]:
        key = f"spark.sql.catalog.{self.name}"
        conf = {key: "org.apache.iceberg.spark.SparkCatalog", f"{key}.type": self.type}
        if self.warehouse:
            conf[f"{key}.warehouse"] = self.warehouse
        if self.uri:
            conf[f"{key}.uri"] = self.uri
        conf.update({f"{key}.{k}": v for k, v in self.options.items()})
        return conf


def iceberg_jars() -> list[str]:
    """The Iceberg runtime and extensions jars of the `snowpark-connect-deps-iceberg` wheel."""
    roots = [*site.getsitepackages(), site.getusersitepackages()]
    found = []
    for pattern in _JARS:
        hits = sorted(h for r in roots for h in glob.glob(os.path.join(r, "snowpark_connect_deps_iceberg", "jars",
                                                                       pattern)))
        if not hits:
            raise ConfigError(
                f"no {pattern} found: pip install 'snowpark-connect-deps-iceberg==1.0.2' "
                "(or give Spark the Iceberg runtime through spark.jars.packages)")
        found.append(hits[-1])
    return found


def register(spark: SparkSession, catalog: CatalogConfig) -> None:
    """Add (or point) a catalog in a running session: Spark instantiates catalogs on first use."""
    for key, value in catalog.spark_conf().items():
        spark.conf.set(key, value)


_LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gw.name = org.apache.spark.api.python.PythonGatewayServer
logger.gw.level = error
"""


@functools.cache
def quiet_log4j() -> str:
    """A log4j2 file that keeps Spark's own WARN/INFO lines (and its banner) off the console.

    This process's own: a new owner-only file with a name no one can guess (a file at a fixed
    name in the shared temporary directory could be planted by another local user), removed at exit."""
    fd, path = tempfile.mkstemp(prefix="binlake-log4j2-", suffix=".properties")
    with os.fdopen(fd, "w") as out:
        out.write(_LOG4J)
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def process_umask() -> str:
    """This process's umask in octal, e.g. "077" (`binlake up` runs with 077)."""
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status") as status:
        return next(line for line in status if line.startswith("Umask:")).split()[1][-3:]
    mask = os.umask(0o022)  # no /proc: read it the racy way, put straight back
    os.umask(mask)
    return f"{mask:03o}"


def session(app: str, master: str, catalog: CatalogConfig, extra: Mapping[str, str] | None = None, *,
            properties: str = "") -> SparkSession:
    """`properties`: a Spark properties file the driver JVM reads (a secret stays off its command line)."""
    extra = dict(extra or {})
    if properties:
        if not os.path.isfile(properties):
            raise ConfigError(f"BINLAKE_SPARK_PROPERTIES={properties!r} is not a readable file")
        # Read by spark-submit, which pyspark starts the driver JVM with; `--conf` would show in ps.
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {shlex.quote(properties)} pyspark-shell"
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else a WARN about the host name on every start
    # Executors start Python workers with the driver's PYSPARK_PYTHON (default: `python3` on
    # their PATH, which may lack pyarrow and pandas or be another version).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName(app).master(master)
               .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.iceberg.check-nullability", "false"))
    if master.startswith("local"):
        # Local mode runs every task in the driver's heap; Spark's default of 1g ran out of memory
        # merging a table that holds two 64 MiB rows (two tasks, each growing a row buffer by doubling).
        extra.setdefault("spark.driver.memory", LOCAL_DRIVER_MEMORY)
    # Hadoop's local file system sets the mode of every file and directory it writes (lake data,
    # metadata, .crc files) from its own umask setting, 022 by default, whatever the process's:
    # under `binlake up`'s umask 077 the lake would still be readable by every local user.
    extra.setdefault("spark.hadoop.fs.permissions.umask-mode", process_umask())
    if "spark.driver.extraJavaOptions" not in extra:
        options = f"-Dlog4j.configurationFile=file:{quiet_log4j()} {class_archive.java_options()}"
        builder = builder.config("spark.driver.extraJavaOptions", options.strip())
    if "spark.jars.packages" not in extra:
        jars = [j for j in extra.pop("spark.jars", "").split(",") if j]
        builder = builder.config("spark.jars", ",".join([*iceberg_jars(), *jars]))
    for key, value in {**catalog.spark_conf(), **extra}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop(spark: SparkSession) -> None:
    """Stop the session and py4j's callback server (a non-daemon thread: left running, the process never exits)."""
    gateway = spark.sparkContext._gateway
    if gateway is not None:
        gateway.shutdown_callback_server()
    spark.stop()

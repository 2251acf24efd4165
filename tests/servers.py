"""The private servers used by tests live with the launcher (`binlake up` starts the same ones)."""

import pytest

from services.launcher.servers import (
    MariaDB,
    MySQL,
    NatsServer,
    free_port,
    mariadb_binaries,
    mysql_root,
    nats_server_binary,
    start_mariadb,
    start_mysql,
    start_nats,
)

# A test or module marked with this runs once per source flavour: its `source` fixture (and so
# `database` and the parser's BINLAKE_SOURCE_URL) is MariaDB in one run and MySQL in the other.
BOTH_SOURCES = pytest.mark.parametrize("source", ["mariadb", "mysql"], indirect=True)
MYSQL_SOURCE = pytest.mark.parametrize("source", ["mysql"], indirect=True)  # tests of what only MySQL has

# JAVA_TOOL_OPTIONS of every JVM a test starts (Spark sessions, loaders, the CLI's readers, Spark
# daemons, the compose stack's containers). They live seconds to minutes, where C2's compilations
# cost more CPU than they save: a loader's first ten batches take 12 s of CPU with C1 alone and 30 s
# with tiered compilation (Java 17, two cores), and the JVMs are most of a test run's CPU. On the
# tests' small batches Spark's interpreted expressions also cost less than generating and compiling
# Java for every new query shape (Spark's own tests run both paths; the results are the same): a
# loader test takes a fifth less CPU. Spark reads `spark.*` system properties into every SparkConf.
TEST_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                    "-Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN")


def require_mysql() -> None:
    """Skip the calling test, saying why, where no MySQL root is prepared (`binlake setup mysql`)."""
    try:
        mysql_root()
    except FileNotFoundError as exc:
        pytest.skip(f"MySQL not available: {exc}")


__all__ = ["BOTH_SOURCES", "MYSQL_SOURCE", "TEST_JVM_OPTIONS", "MariaDB", "MySQL", "NatsServer", "free_port",
           "mariadb_binaries", "mysql_root", "nats_server_binary", "require_mysql", "start_mariadb", "start_mysql",
           "start_nats"]

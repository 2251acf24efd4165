"""`binlake spark master|worker [spark-class options]`: Spark's standalone daemons from the pyspark installation.

What a container or a machine of a Spark cluster runs (deploy/docker-compose.cluster.yml):
the same image and Python as the loader, so executors match its driver.

    binlake spark master --host spark-master --port 7077 --webui-port 8080
    binlake spark worker spark://spark-master:7077 --cores 1 --memory 1g

With BINLAKE_SPARK_SECRET (or a BINLAKE_SPARK_PROPERTIES file) the daemon authenticates every
connection and encrypts it, as `binlake up --spark-workers` does: the secret goes into an
owner-only properties file passed as `--properties-file`, never onto the command line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from services.launcher.spark_cluster import PROPERTIES_ENV, secret_to_properties, spark_home
from shared.errors import ConfigError

DAEMONS = {"master": "org.apache.spark.deploy.master.Master", "worker": "org.apache.spark.deploy.worker.Worker"}


def command(args: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """spark-class's arguments and environment for `binlake spark <args>` (the secret, if any, only in a file)."""
    home = spark_home()
    env = {**environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": environ.get("PYSPARK_PYTHON", sys.executable)}
    secret_to_properties(env)
    extra = []
    if env.get(PROPERTIES_ENV):
        if "--properties-file" in args:
            raise ConfigError(f"--properties-file and {PROPERTIES_ENV} (or BINLAKE_SPARK_SECRET) both given: keep one")
        extra = ["--properties-file", env[PROPERTIES_ENV]]
    spark_class = str(home / "bin" / "spark-class")
    return [spark_class, DAEMONS[args[0]], *args[1:], *extra], env


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0] not in DAEMONS:
        print(f"usage: binlake spark {{{'|'.join(DAEMONS)}}} [options of Spark's {'/'.join(DAEMONS.values())}]",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        argv, env = command(args, os.environ)
    except ConfigError as exc:
        print(f"binlake spark: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main()

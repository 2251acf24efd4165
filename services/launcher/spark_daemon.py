"""`binlake spark master|worker [spark-class options]`: Spark's standalone daemons from the pyspark installation.

What a container or a machine of a Spark cluster runs (deploy/docker-compose.cluster.yml):
the same image and Python as the loader, so executors match its driver.

    binlake spark master --host spark-master --port 7077 --webui-port 8080
    binlake spark worker spark://spark-master:7077 --cores 1 --memory 1g
"""

from __future__ import annotations

import os
import sys

from services.launcher.spark_cluster import spark_home

DAEMONS = {"master": "org.apache.spark.deploy.master.Master", "worker": "org.apache.spark.deploy.worker.Worker"}


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0] not in DAEMONS:
        print(f"usage: binlake spark {{{'|'.join(DAEMONS)}}} [options of Spark's {'/'.join(DAEMONS.values())}]",
              file=sys.stderr)
        raise SystemExit(2)
    home = spark_home()
    spark_class = str(home / "bin" / "spark-class")
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    os.execve(spark_class, [spark_class, DAEMONS[args[0]], *args[1:]], env)


if __name__ == "__main__":
    main()

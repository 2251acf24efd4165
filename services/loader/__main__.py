"""`python -m services.loader` / `binlake loader [--master spark://...]`."""

import argparse
import os
import sys

from services.launcher.spark_cluster import secret_to_properties
from services.loader import app
from services.loader.config import LoaderConfig
from shared.runner import run_service


def main() -> None:
    parser = argparse.ArgumentParser(prog="binlake loader", description="Load BINLAKE_CDC into lake tables.")
    parser.add_argument("--master", help="Spark master (default local[*]): spark://host:7077, yarn, k8s://...")
    args = parser.parse_args(sys.argv[1:])
    if args.master:
        os.environ["BINLAKE_MASTER"] = args.master
    run_service("loader", load, app.main)


def load() -> LoaderConfig:
    """The settings; a cluster's secret given as BINLAKE_SPARK_SECRET (deploy/docker-compose.cluster.yml)
    becomes a private BINLAKE_SPARK_PROPERTIES file first, and leaves the environment Spark's JVM inherits."""
    secret_to_properties(os.environ)
    return LoaderConfig.from_env()


if __name__ == "__main__":
    main()

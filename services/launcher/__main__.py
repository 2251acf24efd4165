"""`binlake up` / `python -m services.launcher`."""

import argparse
import os
import sys
from urllib.parse import urlsplit

from services.launcher import app
from services.launcher.config import LauncherConfig
from shared.runner import run_service


def main() -> None:
    parser = argparse.ArgumentParser(prog="binlake up", description="Run the whole binlake stack locally.")
    parser.add_argument("--data-dir", help="where NATS, MariaDB and binlake keep their state (default .binlake)")
    parser.add_argument("--source-url", help="capture this MySQL/MariaDB instead of a private MariaDB (a password "
                                             "here shows in `ps`: put the URL in a file named by "
                                             "BINLAKE_SOURCE_URL_FILE instead)")
    parser.add_argument("--source", choices=["mariadb", "mysql"],
                        help="the private source server without --source-url: mariadb (default) or mysql (MySQL 9.7; "
                             "prepare it once with `binlake setup mysql`)")
    parser.add_argument("--snapshot", metavar="REGEX",
                        help="load the existing rows of matching tables (regex over db.table), e.g. 'shop\\..*'")
    parser.add_argument("--spark-workers", type=int, metavar="N",
                        help="run a Spark standalone master and N workers for the loader (default 0: local mode)")
    parser.add_argument("--demo", action="store_true", help="run a sample workload and print the lake as it changes")
    parser.add_argument("--nats-cluster", type=int, metavar="N",
                        help="run N NATS nodes as a JetStream cluster on loopback (3: streams with 3 replicas)")
    args = parser.parse_args(sys.argv[1:])
    if args.data_dir:
        os.environ["BINLAKE_DATA_DIR"] = args.data_dir
    if args.source_url:
        if urlsplit(args.source_url).password:
            print("binlake up: the password in --source-url is visible to every user in `ps`; "
                  "put the URL in a file and name it in BINLAKE_SOURCE_URL_FILE", file=sys.stderr)
        os.environ["BINLAKE_SOURCE_URL"] = args.source_url
    if args.source:
        os.environ["BINLAKE_PRIVATE_SOURCE"] = args.source
    if args.snapshot:
        os.environ["BINLAKE_SNAPSHOT_TABLES"] = args.snapshot
    if args.spark_workers is not None:
        os.environ["BINLAKE_SPARK_WORKERS"] = str(args.spark_workers)
    if args.demo:
        os.environ["BINLAKE_DEMO"] = "1"
    if args.nats_cluster:
        os.environ["BINLAKE_NATS_CLUSTER"] = str(args.nats_cluster)
    run_service("up", LauncherConfig.from_env, app.main)


if __name__ == "__main__":
    main()

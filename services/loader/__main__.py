"""`python -m services.loader` / `binlake loader [--master spark://...]`."""

import argparse
import os
import sys

from services.loader import app
from services.loader.config import LoaderConfig
from shared.runner import run_service


def main() -> None:
    parser = argparse.ArgumentParser(prog="binlake loader", description="Load BINLAKE_CDC into lake tables.")
    parser.add_argument("--master", help="Spark master (default local[*]): spark://host:7077, yarn, k8s://...")
    args = parser.parse_args(sys.argv[1:])
    if args.master:
        os.environ["BINLAKE_MASTER"] = args.master
    run_service("loader", LoaderConfig.from_env, app.main)


if __name__ == "__main__":
    main()

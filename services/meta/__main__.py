"""`python -m services.meta` / `binlake meta [--backend kv|mysql]`."""

import argparse
import os
import sys

from services.meta import app
from services.meta.config import MetaConfig
from shared.runner import run_service


def main() -> None:
    parser = argparse.ArgumentParser(prog="binlake meta", description="Cursors, rewind and schema history.")
    parser.add_argument("--backend", choices=["kv", "mysql"], help="where cursors live (default kv)")
    args = parser.parse_args(sys.argv[1:])
    if args.backend:
        os.environ["BINLAKE_BACKEND"] = args.backend
    run_service("meta", MetaConfig.from_env, app.main)


if __name__ == "__main__":
    main()

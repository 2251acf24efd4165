"""`binlake setup mysql`: prepare the MySQL root that `binlake up --source mysql`, the tests and the
benchmarks run MySQL from (Debian's mysql-server-core, built with mmdebstrap; needs root)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from services.launcher.servers import mysql_root, prepare_mysql_root


def main() -> None:
    parser = argparse.ArgumentParser(prog="binlake setup", description=__doc__)
    parser.add_argument("what", choices=["mysql"], help="what to prepare")
    parser.parse_args()
    try:
        print(f"MySQL root ready at {mysql_root()}")
        return
    except FileNotFoundError:
        pass
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        sys.exit("binlake setup mysql: needs root and mmdebstrap (apt-get install mmdebstrap), "
                 "or set BINLAKE_MYSQL_ROOT to a root prepared elsewhere")
    print(f"MySQL root ready at {prepare_mysql_root()}")


if __name__ == "__main__":
    main()

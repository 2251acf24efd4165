"""`binlake setup mysql|spark`: prepare, once per machine or image, what later runs reuse.

- mysql: the MySQL root that `binlake up --source mysql`, the tests and the benchmarks run MySQL
  from (Debian's mysql-server-core, built with mmdebstrap; needs root);
- spark: the class-data archive that cuts a third off the start of every local Spark (the loader,
  `binlake verify`, `binlake lake`): services/loader/class_archive.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from services.launcher.servers import mysql_root, prepare_mysql_root


def _mysql() -> None:
    try:
        print(f"MySQL root ready at {mysql_root()}")
        return
    except FileNotFoundError:
        pass
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        sys.exit("binlake setup mysql: needs root and mmdebstrap (apt-get install mmdebstrap), "
                 "or set BINLAKE_MYSQL_ROOT to a root prepared elsewhere")
    print(f"MySQL root ready at {prepare_mysql_root()}")


def _spark() -> None:
    from services.loader import class_archive
    from shared.errors import ConfigError

    try:
        print(f"Spark class archive ready at {class_archive.create()}")
    except (ConfigError, RuntimeError, OSError) as exc:
        sys.exit(f"binlake setup spark: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="binlake setup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["mysql", "spark"], help="what to prepare")
    {"mysql": _mysql, "spark": _spark}[parser.parse_args().what]()


if __name__ == "__main__":
    main()

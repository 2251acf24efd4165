"""The `binlake` command: dispatches lazily to each service's entry point."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "up": ("services.launcher.__main__", "main", "run the whole stack locally (NATS, MariaDB, services)"),
    "parser": ("services.parser.__main__", "main", "read the binlog into BINLAKE_RAW"),
    "meta": ("services.meta.__main__", "main", "cursors, rewind and schema history (--backend kv|mysql)"),
    "store": ("services.store.__main__", "main", "serve get/ack/rollback batches of BINLAKE_CDC to clients"),
    "loader": ("services.loader.__main__", "main", "load BINLAKE_CDC into Spark lake tables (--master ...)"),
    "init": ("services.ops.init", "main", "create every stream and bucket as NATS admin (per-service users)"),
    "status": ("services.ops.status", "main", "positions, lag, partition owners, clients, stream sizes"),
    "tail": ("services.ops.tail", "main", "print a table's change events as JSON lines"),
    "rewind": ("services.ops.rewind", "main", "move a client back to a timestamp or binlog position"),
    "snapshot": ("services.ops.snapshot", "main", "load existing rows of tables (db.table or regex) into the stream"),
    "verify": ("services.loader.verify", "main", "compare source tables with the lake (exit 0 equal, 1 differ)"),
    "lake": ("services.loader.lakecli", "main", "inspect the lake: tables, show, as-of"),
    "sink": ("services.sink.__main__", "main", "route BINLAKE_RAW to per-table subjects in BINLAKE_CDC"),
    "spark": ("services.launcher.spark_daemon", "main", "run a Spark standalone master or worker (master|worker)"),
    "setup": ("services.launcher.setup", "main", "prepare once: a MySQL to run (mysql), Spark's class archive (spark)"),
}


def usage() -> str:
    lines = ["usage: binlake <command> [args]", "", "commands:"]
    lines += [f"  {name:<10} {help}" for name, (_, _, help) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return
    if args[0] not in COMMANDS:
        print(f"binlake: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        raise SystemExit(2)
    module, func, _ = COMMANDS[args[0]]
    sys.argv = [f"binlake {args[0]}", *args[1:]]
    getattr(importlib.import_module(module), func)()


if __name__ == "__main__":
    main()

"""Process entry for every service: logging, one clear line for fatal errors, exit codes.

Exit 0 after SIGTERM/SIGINT, 2 for bad configuration, 1 for any other fatal error, so an
orchestrator restarts what may recover and an operator sees what to fix.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from shared.errors import BinlakeError, ConfigError
from shared.logging import configure

C = TypeVar("C")


# The parser and the sink allocate rows by the million: short-lived containers that reference
# counting frees. With Python's thresholds the collector runs every 700 of them, and a chunk of
# rows alive for a moment makes its full collections rescan everything the process loaded.
ROW_GC_THRESHOLDS = (20_000, 20, 50)


def tune_gc_for_rows() -> None:
    """Leave the objects of startup (modules, config) out of the garbage collector's scans and
    run it less often. Only for processes where no cycle holds large data: a cycle per binlog
    event (mysql-replication's, broken in `services.parser.binlog`) took the parser to 950 MiB
    in a burst of 900 KiB rows; and not for the loader, where py4j frees a JVM object only when
    its Python proxy is collected."""
    gc.freeze()
    gc.set_threshold(*ROW_GC_THRESHOLDS)


def first_binlake_error(exc: BaseException) -> BinlakeError | None:
    """The first BinlakeError inside (possibly nested) exception groups."""
    if isinstance(exc, BinlakeError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = first_binlake_error(inner)
            if found is not None:
                return found
    return None


def run_service(service: str, load: Callable[[], C], amain: Callable[[C], Awaitable[None]], *,
                rows_gc: bool = False) -> None:
    """Load the config, run `amain(config)` and turn its outcome into an exit code; `rows_gc`:
    see `tune_gc_for_rows`."""
    try:
        configure(service)
        cfg = load()
    except ConfigError as exc:
        print(f"binlake {service}: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    level = getattr(cfg, "log_level", "info")
    configure(service, level=level)
    log = structlog.get_logger()
    if rows_gc:
        tune_gc_for_rows()
    try:
        asyncio.run(amain(cfg))  # type: ignore[arg-type]
    except KeyboardInterrupt:
        pass
    except BaseException as exc:
        err = first_binlake_error(exc)
        if err is None:
            raise
        log.error("service.failed", error=type(err).__name__, reason=str(err))
        print(f"binlake {service}: {type(err).__name__}: {err}", file=sys.stderr)
        raise SystemExit(2 if isinstance(err, ConfigError) else 1) from None

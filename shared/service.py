"""The runtime every service's `main` opens: metrics endpoint, NATS connection, clean close."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import structlog
from nats.aio.client import Client as NATS

from shared import jetstream
from shared.config import ServiceConfig
from shared.errors import NatsUnavailable
from shared.metrics import Registry, serve

log = structlog.get_logger()


@contextlib.asynccontextmanager
async def runtime(cfg: ServiceConfig, service: str, registry: Registry,
                  problem: Callable[[], str | None] = lambda: None) -> AsyncIterator[NATS]:
    """Serve /metrics and /healthz (503 with `problem()`'s reason), connect to NATS; on exit drain and stop.

    A connection the server closed for good (nats.py reconnects after a lost socket, but not
    after a protocol or authorization error) ends the service with NatsUnavailable, exit 1, so
    its supervisor restarts it instead of it living on deaf.
    """
    server = await serve(registry, cfg.metrics_host, cfg.metrics_port, problem) if cfg.metrics_port >= 0 else None
    try:
        nc = await jetstream.connect(cfg.nats_url, name=f"binlake-{service}-{cfg.source}", auth=cfg)
        main = asyncio.current_task()
        assert main is not None
        lost: list[str] = []
        watcher = asyncio.create_task(_end_when_closed(nc, main, lost), name="nats-closed-watch")
        try:
            try:
                yield nc
            except (asyncio.CancelledError, Exception):
                if not lost:
                    raise
                # Our cancel, or what the service's clean-up raised on the closed connection.
                if main.cancelling():
                    main.uncancel()
            if lost:
                raise NatsUnavailable(f"the NATS connection was closed for good ({lost[0]}); exiting so that "
                                      "the supervisor restarts the service")
        finally:
            watcher.cancel()
            await close(nc)
    finally:
        if server is not None:
            server.close()


async def _end_when_closed(nc: NATS, main: asyncio.Task[object], lost: list[str], poll_s: float = 0.5) -> None:
    """Cancel `main` once `nc` is closed by anyone but `runtime` itself (which cancels this first)."""
    while not nc.is_closed:  # noqa: ASYNC110 - nats.py has no awaitable for it; connect() owns closed_cb
        await asyncio.sleep(poll_s)
    lost.append(str(nc.last_error or "closed by the server"))
    log.error("nats.closed", error=repr(nc.last_error))
    main.cancel()


async def close(nc: NATS, drain_s: float = 3.0) -> None:
    """Drain, but never for long: every publish that matters was already acknowledged, and
    a subscription with undelivered messages would otherwise hold the drain for 30 s."""
    try:
        await asyncio.wait_for(nc.drain(), drain_s)
    except Exception:  # timeout or an already broken connection: just close
        with contextlib.suppress(Exception):
            await nc.close()

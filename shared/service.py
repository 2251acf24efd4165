"""The runtime every service's `main` opens: metrics endpoint, NATS connection, clean close."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from nats.aio.client import Client as NATS

from shared import jetstream
from shared.config import ServiceConfig
from shared.metrics import Registry, serve


@contextlib.asynccontextmanager
async def runtime(cfg: ServiceConfig, service: str, registry: Registry,
                  problem: Callable[[], str | None] = lambda: None) -> AsyncIterator[NATS]:
    """Serve /metrics and /healthz (503 with `problem()`'s reason), connect to NATS; on exit drain and stop."""
    server = await serve(registry, cfg.metrics_host, cfg.metrics_port, problem) if cfg.metrics_port >= 0 else None
    try:
        nc = await jetstream.connect(cfg.nats_url, name=f"binlake-{service}-{cfg.source}", auth=cfg)
        try:
            yield nc
        finally:
            await close(nc)
    finally:
        if server is not None:
            server.close()


async def close(nc: NATS, drain_s: float = 3.0) -> None:
    """Drain, but never for long: every publish that matters was already acknowledged, and
    a subscription with undelivered messages would otherwise hold the drain for 30 s."""
    try:
        await asyncio.wait_for(nc.drain(), drain_s)
    except Exception:  # timeout or an already broken connection: just close
        with contextlib.suppress(Exception):
            await nc.close()

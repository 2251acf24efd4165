"""SourceWatch: is the source still talking? A hung primary must not look healthy.

The binlog connection asks the server for replication heartbeats (`BINLAKE_HEARTBEAT_S`), so
even an idle source sends something every few seconds. The reader thread marks every event
it reads; when nothing arrived for `BINLAKE_SOURCE_STALL_S`, the source is stalled (frozen,
SIGSTOPped, a network that drops without a reset): `/healthz` answers 503 with the reason,
the silence is a metric, and the watchdog gives the lease up and ends the process so that a
standby takes over and the orchestrator restarts this one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from shared.errors import TransientError
from shared.metrics import Registry


class SourceStalled(TransientError):
    """Nothing came from the source (not even a heartbeat) for longer than the configured bound."""


class SourceWatch:
    def __init__(self, stall_s: float, registry: Registry, clock: Callable[[], float] = time.monotonic) -> None:
        self._stall_s = stall_s
        self._clock = clock
        self._last: float | None = None  # None: not reading (a standby)
        self._silence = registry.gauge("parser_source_silence_seconds",
                                       "Seconds since the last binlog event or heartbeat from the source")
        self.log = structlog.get_logger().bind(actor="source_watch")

    def start(self) -> None:
        """This instance starts reading (it holds the lease): the silence counts from now."""
        self._last = self._clock()

    def stop(self) -> None:
        self._last = None

    def seen(self) -> None:
        """An event or heartbeat arrived (called from the reader thread; a float store is atomic)."""
        self._last = self._clock()

    def silence_s(self) -> float:
        return 0.0 if self._last is None else self._clock() - self._last

    def problem(self) -> str | None:
        """Why this parser is unhealthy, or None."""
        silence = self.silence_s()
        if silence > self._stall_s:
            return (f"no binlog event or heartbeat from the source for {silence:.0f}s "
                    f"(BINLAKE_SOURCE_STALL_S={self._stall_s:g}): the source is hung or unreachable")
        return None

    async def watch(self, interval_s: float = 1.0) -> None:
        """Actor: raise SourceStalled once the silence passes the bound (the caller gives the lease up)."""
        while True:
            await asyncio.sleep(interval_s)
            self._silence.set(round(self.silence_s(), 1))
            problem = self.problem()
            if problem is not None:
                self.log.error("source.stalled", reason=problem)
                raise SourceStalled(problem)

"""The actor runtime: each actor is one task with its own state, supervised from outside.

Actors hand data over through bounded queues or `Latest` (a full queue blocks the sender,
which is how backpressure travels from JetStream back to the binlog reader).
`supervise_call` restarts an actor that failed with a retriable `BinlakeError` (jittered
exponential backoff, rate-limited) and lets every other exception escape, so the TaskGroup
in `run_all` cancels the siblings and the process exits non-zero for the orchestrator.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

from shared.errors import BinlakeError, NatsUnavailable
from shared.health import Conditions
from shared.jetstream import TRANSIENT


@dataclass(frozen=True)
class RestartPolicy:
    """How often a failing actor may restart before the process gives up."""

    max_restarts: int = 5
    window_s: float = 60.0
    base_delay_s: float = 0.5
    max_delay_s: float = 15.0

    def delay(self, attempt: int) -> float:
        # The exponent is capped: a wait that goes on for hours counts attempts without end.
        return float(min(self.max_delay_s, self.base_delay_s * 2 ** min(attempt - 1, 32)))


def raise_if_cancelled() -> None:
    """Re-raise a cancellation that an awaited library call swallowed.

    On Python 3.11 `asyncio.wait_for` (inside nats.py's requests) returns the result instead
    of raising when the reply and the cancel arrive together (CPython gh-86296); loops that
    await such calls check this so a stop or a lost lease always ends them.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError


WAIT_MAX_S = 5.0
"""The longest pause between tries at a condition that `waits`: its end is soon noticed."""


RECOVERED_S = 30.0
"""A restarted or waiting actor that then runs this long without failing is healthy again."""


async def supervise_call(
    run: Callable[[], Awaitable[None]], policy: RestartPolicy, log: Any,
    health: Conditions | None = None, name: str = "",
) -> None:
    """Run `run` (an actor's loop), restarting it on retriable errors within the policy's budget.

    With `health`, the actor's failure is the condition `name` (its reason on `/healthz`) from
    its first failure until a try has run RECOVERED_S without one."""
    failures: list[float] = []
    waits = 0
    loop = asyncio.get_running_loop()
    recovered: asyncio.TimerHandle | None = None
    try:
        while True:
            if health is not None and (failures or waits):
                recovered = loop.call_later(RECOVERED_S, health.clear, name)
            try:
                try:
                    await run()
                    if health is not None:
                        health.clear(name)  # its work is done
                    return
                except TRANSIENT as exc:  # a NATS call no one wrapped: the bus is away, not the actor broken
                    raise NatsUnavailable(f"NATS: {exc!r}") from exc
            except BinlakeError as exc:
                if recovered is not None:
                    recovered.cancel()
                if health is not None:
                    health.set(name, f"{name}: {exc}")
                if exc.retriable and exc.waits:
                    waits += 1
                    delay = min(policy.delay(waits), WAIT_MAX_S)
                    # Said at once, then about once a minute: the reason stays on /healthz meanwhile.
                    (log.error if waits % 12 == 1 else log.debug)(
                        "actor.waiting", attempt=waits, delay_s=round(delay, 2), error=type(exc).__name__,
                        reason=str(exc))
                    await asyncio.sleep(delay)
                    continue
                waits = 0
                now = time.monotonic()
                failures = [t for t in failures if now - t < policy.window_s] + [now]
                if not exc.retriable or len(failures) > policy.max_restarts:
                    raise
                delay = policy.delay(len(failures))
                log.warning("actor.restart", attempt=len(failures), delay_s=round(delay, 2),
                            error=type(exc).__name__, reason=str(exc))
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
    except asyncio.CancelledError:
        if health is not None:
            health.clear(name)  # stopped here (a rebalance, a stop): not this process's problem any more
        raise
    finally:
        if recovered is not None:
            recovered.cancel()


async def run_all(tasks: Iterable[Callable[[], Awaitable[None]]]) -> None:
    """Run the given coroutine functions in a TaskGroup until one fails or a signal arrives.

    SIGTERM/SIGINT cancel the group: each actor's `finally` runs `on_stop` and this returns
    normally, so the process exits 0. A failure propagates as an ExceptionGroup.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)

    async def stopper() -> None:
        await stop.wait()
        raise _Stop

    try:
        async with asyncio.TaskGroup() as tg:
            stopper_task = tg.create_task(stopper(), name="stopper")
            work = [tg.create_task(_call(fn)) for fn in tasks]
            if work:
                await asyncio.wait(work)
            stopper_task.cancel()  # every task finished by itself (drain mode)
    except* _Stop:
        structlog.get_logger().info("service.stopped", reason="signal")
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def _call(fn: Callable[[], Awaitable[None]]) -> None:
    await fn()


class _Stop(Exception):
    """Raised inside the TaskGroup to cancel every task on a signal."""


T = TypeVar("T")


class Latest(Generic[T]):
    """A one-slot mailbox that keeps only the newest value (a conflating mailbox).

    For progress reports, where only the most recent one matters and the sender must never
    wait for a slow reader.
    """

    def __init__(self) -> None:
        self._value: T | None = None
        self._event = asyncio.Event()

    def set(self, value: T) -> None:
        self._value = value
        self._event.set()

    def peek(self) -> T | None:
        return self._value

    async def get(self) -> T:
        await self._event.wait()
        self._event.clear()
        assert self._value is not None
        return self._value

"""The actor runtime: one task, one bounded mailbox, supervised from outside.

An actor owns its state and only talks through `send`. A full mailbox blocks the sender,
which is how backpressure travels from JetStream back to the binlog reader. `supervise`
restarts an actor that failed with a retriable `BinlakeError` (with jittered exponential
backoff, rate-limited) and lets every other exception escape, so the TaskGroup in `run_all`
cancels the siblings and the process exits non-zero for the orchestrator to restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import structlog

from shared.errors import BinlakeError

M = TypeVar("M")


@dataclass(frozen=True)
class RestartPolicy:
    """How often a failing actor may restart before the process gives up."""

    max_restarts: int = 5
    window_s: float = 60.0
    base_delay_s: float = 0.5
    max_delay_s: float = 15.0

    def delay(self, attempt: int) -> float:
        return float(min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)))


CRASH = RestartPolicy(max_restarts=0)
"""Tests use this: the first failure escapes instead of being retried."""


class Actor(Generic[M]):
    """Base class: override `handle`, and `on_start` / `on_stop` when there is state to set up."""

    mailbox_size: ClassVar[int] = 1_000

    def __init__(self, name: str) -> None:
        self.name = name
        self.mailbox: asyncio.Queue[M] = asyncio.Queue(self.mailbox_size)
        self.log = structlog.get_logger().bind(actor=name)

    async def send(self, msg: M) -> None:
        await self.mailbox.put(msg)

    async def on_start(self) -> None:
        """Connect and load durable state; runs again after every restart."""

    async def on_stop(self) -> None:
        """Flush and close; must be safe to run twice."""

    async def handle(self, msg: M) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        await self.on_start()
        try:
            while True:
                await self.handle(await self.mailbox.get())
        finally:
            await self.on_stop()


def raise_if_cancelled() -> None:
    """Re-raise a cancellation that an awaited library call swallowed.

    On Python 3.11 `asyncio.wait_for` (inside nats.py's requests) returns the result instead
    of raising when the reply and the cancel arrive together (CPython gh-86296); loops that
    await such calls check this so a stop or a lost lease always ends them.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError


async def supervise(actor: Actor[Any], policy: RestartPolicy) -> None:
    """Run `actor`, restarting it on retriable errors within the policy's budget."""
    await supervise_call(actor.run, policy, actor.log)


async def supervise_call(
    run: Callable[[], Awaitable[None]], policy: RestartPolicy, log: Any
) -> None:
    """Same as `supervise` for a plain coroutine function (a pipeline, a loop)."""
    failures: list[float] = []
    while True:
        try:
            await run()
            return
        except BinlakeError as exc:
            now = time.monotonic()
            failures = [t for t in failures if now - t < policy.window_s] + [now]
            if not exc.retriable or len(failures) > policy.max_restarts:
                raise
            delay = policy.delay(len(failures))
            log.warning("actor.restart", attempt=len(failures), delay_s=round(delay, 2),
                        error=type(exc).__name__, reason=str(exc))
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))


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

"""A publish failure on one of several subjects restarts the partition, not the process.

Without atomic batches, different subjects of a fetch are published concurrently (a
TaskGroup); what fails there must reach the supervisor as the error itself, not as an
ExceptionGroup it does not know.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.sink.fence import Out, SubjectFence
from services.sink.partition import PartitionSettings, PartitionWorker
from shared.actor import RestartPolicy, supervise_call
from shared.errors import FatalError, NatsUnavailable
from shared.metrics import Registry
from shared.subjects import Names


class _Js:
    _nc = None


class Fence(SubjectFence):
    """Fails every publish to `bad` with `error`; records the others."""

    def __init__(self, bad: str, error: Exception) -> None:
        super().__init__(_Js(), "CDC", 1.0, "raw-1")  # type: ignore[arg-type]
        self.bad, self.error = bad, error
        self.stored: list[str] = []

    async def publish(self, subject: str, data: bytes, headers: dict[str, str], raw_seq: int) -> bool:
        await asyncio.sleep(0)
        if subject == self.bad:
            raise self.error
        self.stored.append(subject)
        return True


def worker() -> PartitionWorker:
    settings = PartitionSettings("main", 0, 100, 1.0, 5.0)
    return PartitionWorker(None, Names(), None, None, settings, Registry())  # type: ignore[arg-type]


def outs() -> list[Out]:
    return [Out(s, b"x", {}, i) for i, s in enumerate(["cdc.a", "cdc.b", "cdc.a"], 1)]


async def test_a_bus_error_on_one_subject_is_the_retriable_error_itself() -> None:
    with pytest.raises(NatsUnavailable, match="away"):
        await worker()._publish(outs(), Fence("cdc.b", NatsUnavailable("away")))


async def test_a_fatal_error_wins_over_a_retriable_one() -> None:
    class Both(Fence):
        async def publish(self, subject: str, data: bytes, headers: dict[str, str], raw_seq: int) -> bool:
            raise (FatalError("refused") if subject == "cdc.a" else NatsUnavailable("away"))

    with pytest.raises(FatalError, match="refused"):
        await worker()._publish(outs(), Both("", NatsUnavailable("")))


async def test_the_supervisor_restarts_it() -> None:
    calls: list[int] = []

    async def run() -> Any:
        calls.append(1)
        if len(calls) == 1:
            await worker()._publish(outs(), Fence("cdc.b", NatsUnavailable("away")))

    await supervise_call(run, RestartPolicy(max_restarts=3, window_s=60, base_delay_s=0.01), worker().log)
    assert len(calls) == 2

"""supervise_call: a restart budget for errors of binlake's own, none for a condition that waits."""

from __future__ import annotations

import asyncio
import time

import pytest
import structlog

from shared import actor
from shared.actor import RestartPolicy, supervise_call
from shared.errors import FatalError, NatsUnavailable, StoreFull
from shared.health import Conditions

POLICY = RestartPolicy(max_restarts=2, window_s=60.0, base_delay_s=0.0, max_delay_s=0.0)


async def test_a_transient_error_uses_up_the_budget() -> None:
    calls = 0

    async def run() -> None:
        nonlocal calls
        calls += 1
        raise NatsUnavailable("away")

    with pytest.raises(NatsUnavailable):
        await supervise_call(run, POLICY, structlog.get_logger())
    assert calls == POLICY.max_restarts + 1


async def test_a_full_store_is_waited_out_for_as_long_as_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actor, "WAIT_MAX_S", 0.0)
    calls = 0

    async def run() -> None:
        nonlocal calls
        calls += 1
        if calls < 20:
            raise StoreFull("no room")

    await supervise_call(run, POLICY, structlog.get_logger())
    assert calls == 20


def test_the_delay_stays_finite_however_long_a_wait_goes_on() -> None:
    assert RestartPolicy().delay(10_000) == RestartPolicy().max_delay_s


async def test_a_failing_actor_is_unhealthy_until_a_try_runs_long_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actor, "RECOVERED_S", 0.05)
    health = Conditions()
    calls = 0
    seen: list[str | None] = []

    async def run() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise NatsUnavailable("away")
        seen.append(health.problem())  # this try has only just begun: still reported
        await asyncio.sleep(0.2)
        seen.append(health.problem())

    await supervise_call(run, POLICY, structlog.get_logger(), health, "partition 3")
    assert seen == ["partition 3: away", None]


async def test_a_stopped_actor_takes_its_condition_with_it() -> None:
    health = Conditions()
    calls = 0
    retried = asyncio.Event()

    async def run() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise NatsUnavailable("away")
        retried.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(supervise_call(run, POLICY, structlog.get_logger(), health, "partition 3"))
    await retried.wait()
    assert health.problem() == "partition 3: away"
    task.cancel()  # a rebalance gave the partition to another worker
    with pytest.raises(asyncio.CancelledError):
        await task
    assert health.problem() is None


async def test_a_halted_actor_stays_unhealthy() -> None:
    health = Conditions()

    async def run() -> None:
        raise FatalError("dead letter at raw seq 7")

    with pytest.raises(FatalError):
        await supervise_call(run, POLICY, structlog.get_logger(), health, "partition 3")
    assert health.problem() == "partition 3: dead letter at raw seq 7"


def test_a_condition_with_a_ttl_ends_unless_set_again(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    health = Conditions()
    health.set("binlake.store.main.get", "stream unreadable", ttl_s=10)
    health.set("held", "d.t set aside")
    now[0] += 11
    assert health.problem() == "d.t set aside"

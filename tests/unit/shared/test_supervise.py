"""supervise_call: a restart budget for errors of binlake's own, none for a condition that waits."""

from __future__ import annotations

import pytest
import structlog

from shared import actor
from shared.actor import RestartPolicy, supervise_call
from shared.errors import NatsUnavailable, StoreFull

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

"""SourceWatch and the stall setting: silence counts only while this parser reads the source."""

from __future__ import annotations

import pytest

from services.parser.config import ParserConfig
from services.parser.source_watch import SourceWatch
from shared.errors import ConfigError
from shared.metrics import Registry

URL = {"BINLAKE_SOURCE_URL": "mysql://u@h:3306"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_silence_past_the_bound_is_a_problem_with_the_reason() -> None:
    clock = Clock()
    w = SourceWatch(6, Registry(), clock)
    assert w.problem() is None  # a standby reads nothing and is healthy
    w.start()
    clock.now += 5
    assert w.problem() is None
    w.seen()
    clock.now += 6.5
    assert "no binlog event or heartbeat from the source for 6s" in (w.problem() or "")
    w.stop()
    assert w.problem() is None and w.silence_s() == 0.0


def test_the_bound_defaults_to_30s_and_three_heartbeats() -> None:
    assert ParserConfig.from_env(URL).stall_s == 30.0
    assert ParserConfig.from_env(URL | {"BINLAKE_HEARTBEAT_S": "30"}).stall_s == 90.0
    assert ParserConfig.from_env(URL | {"BINLAKE_SOURCE_STALL_S": "12", "BINLAKE_HEARTBEAT_S": "2"}).stall_s == 12.0


def test_a_bound_shorter_than_two_heartbeats_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be at least twice BINLAKE_HEARTBEAT_S"):
        ParserConfig.from_env(URL | {"BINLAKE_SOURCE_STALL_S": "5", "BINLAKE_HEARTBEAT_S": "5"})

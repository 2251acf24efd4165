"""The test tiers: which tier each test module belongs to, and the order tests run in.

- unit: pure logic, no server (`tests/unit`), seconds;
- component: one service or library against real servers (MariaDB, MySQL, nats-server, Spark);
- system: the whole pipeline, with kills, restarts and random workloads;
- heavy: Docker compose stacks, clusters (three NATS nodes, Spark standalone), failover.

Every test carries its tier as a marker: `pytest -m unit`, `pytest -m "not heavy"`.
"""

from __future__ import annotations

from pathlib import PurePath

TIERS = ("heavy", "system", "component", "unit")  # also the run order: the longest first

_SYSTEM = {"test_loader", "test_hostile_names", "test_service_users", "test_up", "test_memory", "test_snapshot",
           "test_sink_rules"}
_HEAVY = {"test_compose_stack", "test_nats_cluster", "test_spark_cluster", "test_failover"}


def tier_of(path: PurePath) -> str:
    """The tier of the test module at `path`."""
    if "unit" in path.parts:
        return "unit"
    if path.stem in _HEAVY:
        return "heavy"
    return "system" if path.stem in _SYSTEM else "component"

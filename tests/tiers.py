"""The test tiers: which tier each test module belongs to, and the order tests run in.

- unit: pure logic, no server (`tests/unit`), seconds;
- component: one service or library against real servers (MariaDB, MySQL, nats-server, Spark);
- system: the whole pipeline, with kills, restarts and random workloads;
- heavy: Docker compose stacks, clusters (three NATS nodes, Spark standalone), failover.

Every test carries its tier as a marker: `pytest -m unit`, `pytest -m "not heavy"`.
"""

from __future__ import annotations

from pathlib import PurePath

TIERS = ("heavy", "system", "component", "unit")  # also the run order after the costly modules

_SYSTEM = {"test_loader", "test_hostile_names", "test_service_users", "test_up", "test_memory", "test_snapshot",
           "test_sink_rules"}
_HEAVY = {"test_compose_stack", "test_nats_cluster", "test_spark_cluster", "test_failover"}


# Seconds a module takes in a full run on two workers (the --durations of .ci/run, 2 cores): the
# longest go first, so that the two workers end together (longest-processing-time-first).
_COST = {"test_compose_stack": 580, "test_loader": 425, "test_up": 255, "test_snapshot": 160,
         "test_parser_operations": 150, "test_spark_cluster": 150, "test_lake_readers": 125,
         "test_service_users": 110, "test_store": 105, "test_failover": 90, "test_hostile_names": 80,
         "test_nats_cluster": 70, "test_memory": 70, "test_lake": 70}


def run_order(path: PurePath) -> tuple[int, int]:
    """Where the module at `path` runs: the costly modules first, the longest of them first, then by tier."""
    tier = tier_of(path)
    return -(_COST.get(path.stem, 0) if tier != "unit" else 0), TIERS.index(tier)


def tier_of(path: PurePath) -> str:
    """The tier of the test module at `path`."""
    if "unit" in path.parts:
        return "unit"
    if path.stem in _HEAVY:
        return "heavy"
    return "system" if path.stem in _SYSTEM else "component"

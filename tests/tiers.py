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
           "test_sink_rules", "test_stream_identity", "test_lake_rewind"}
_HEAVY = {"test_compose_stack", "test_nats_cluster", "test_spark_cluster", "test_failover",
          "test_failover_same_server_id"}


# Seconds a module takes in a full run on three workers (the --durations of .ci/run, 2 cores): the
# longest go first, so that the workers end together (longest-processing-time-first).
_COST = {"test_compose_stack": 690, "test_loader": 420, "test_parser_operations": 225, "test_snapshot": 300,
         "test_up": 205, "test_store": 130, "test_spark_cluster": 120, "test_lake_readers": 105,
         "test_hostile_names": 100, "test_lake": 90, "test_failover": 85, "test_nats_cluster": 70,
         "test_memory": 75, "test_meta_backends": 60, "test_lake_cuts": 60, "test_sink": 55, "test_verify": 45,
         "test_service_users": 45, "test_ddl_follow": 190, "test_lake_isolation": 200,
         "test_failover_same_server_id": 60, "test_stream_identity": 45, "test_lake_rewind": 55}


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

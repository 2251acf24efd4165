"""One table the lake cannot apply is set aside while every other table goes on (DESIGN §8.8).

In-process on the test session's Spark, as test_lake.py: real Iceberg tables, real failures.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from pyspark.sql import SparkSession

from services.loader.lake import Lake, MergePolicy
from services.loader.spark import CatalogConfig, register
from tests.integration.lake_feed import Feed

pytestmark = pytest.mark.timeout(900)  # Spark on 2 cores
_catalogs = itertools.count()
ID = {"name": "id", "type": "int", "nullable": False}
V = {"name": "v", "type": "varchar", "nullable": True, "charset": "utf8mb4"}
EVERY_BATCH = MergePolicy(rows=1, age_s=10**9)


@pytest.fixture
def lake_factory(spark: SparkSession, tmp_path: Path) -> Callable[..., Lake]:
    def make(catalog: str | None = None) -> Lake:
        name = catalog or f"iso{next(_catalogs)}"
        register(spark, CatalogConfig(name=name, warehouse=str(tmp_path / "wh")))
        lake = Lake(spark, name, EVERY_BATCH)
        lake.open()
        return lake
    return make


def current(lake: Lake, db: str, table: str) -> Counter[tuple[Any, ...]]:
    t = lake.table(db, table)
    assert t is not None
    lake.spark.catalog.refreshTable(t.names.current)
    return Counter(tuple(r) for r in lake.spark.table(t.names.current).collect())


def inserts(f: Feed, table: str, ids: range, tag: str) -> tuple[int, dict[str, Any]]:
    return f.env("i", [{"after": {"id": i, "v": f"{tag}{i}"}} for i in ids], [ID, V], ["id"], table=table)


def test_a_table_the_lake_refuses_is_held_while_the_others_load_then_resumes_equal(lake_factory):
    lake = lake_factory()
    f = Feed()
    b1 = [inserts(f, "t", range(1, 4), "t"), inserts(f, "u", range(1, 4), "u")]
    lake.apply(b1[-1][0], b1)
    u = lake.table("d", "u")
    assert u is not None
    # Iceberg refuses every write to u's changelog from now on: a real failure, not a mock.
    lake.spark.sql(f"ALTER TABLE {u.names.changelog} SET TBLPROPERTIES ('write.format.default'='bogus')")
    b2 = [inserts(f, "t", range(4, 6), "t"), inserts(f, "u", range(4, 6), "u"),
          f.env("d", [{"before": {"id": 1, "v": "u1"}}], [ID, V], ["id"], table="u")]
    with structlog.testing.capture_logs() as logs:
        lake.apply(b2[-1][0], b2)
    held = [e for e in logs if e["event"] == "lake.table_held"]
    assert [(e["table"], e["batch"]) for e in held] == [("d.u", b2[-1][0])]
    assert "bogus" in held[0]["reason"].lower()
    assert set(lake.holds.tables) == {("d", "u")}
    assert lake.committed == b2[-1][0]
    b3 = [inserts(f, "u", range(6, 7), "u"), inserts(f, "t", range(6, 8), "t")]
    lake.apply(b3[-1][0], b3)
    lake.apply(b3[-1][0], b2 + b3)  # redelivered after a kill before the ack: kept once
    assert current(lake, "d", "t") == Counter({(i, f"t{i}"): 1 for i in range(1, 8)})
    assert len(lake.holds.events(("d", "u"))) == 3
    assert current(lake, "d", "u") == Counter({(i, f"u{i}"): 1 for i in range(1, 4)})

    # A restart while the cause remains: still held, nothing lost.
    again = lake_factory(lake.catalog)
    assert set(again.holds.tables) == {("d", "u")}
    assert again.holds.tables[("d", "u")].since == b2[-1][0]
    # The operator's step: fix the cause, restart the loader.
    lake.spark.sql(f"ALTER TABLE {u.names.changelog} SET TBLPROPERTIES ('write.format.default'='parquet')")
    with structlog.testing.capture_logs() as logs:
        fixed = lake_factory(lake.catalog)
    assert [e["table"] for e in logs if e["event"] == "lake.table_resumed"] == ["d.u"]
    assert not fixed.holds.tables
    assert fixed.holds.events(("d", "u")) == []
    assert current(fixed, "d", "u") == Counter({(i, f"u{i}"): 1 for i in range(2, 7)})
    b4 = [inserts(f, "u", range(7, 8), "u"), inserts(f, "t", range(8, 9), "t")]
    fixed.apply(b4[-1][0], b4)
    assert current(fixed, "d", "u") == Counter({(i, f"u{i}"): 1 for i in range(2, 8)})
    assert current(fixed, "d", "t") == Counter({(i, f"t{i}"): 1 for i in range(1, 9)})

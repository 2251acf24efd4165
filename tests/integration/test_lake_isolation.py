"""One table the lake cannot apply is set aside while every other table goes on (DESIGN §8.8).

In-process on the test session's Spark, as test_lake.py: real Iceberg tables, real failures.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import structlog
from pyspark.sql import SparkSession

from services.loader.config import LoaderConfig
from services.loader.iceberg import Iceberg
from services.loader.lake import Lake, MergePolicy
from services.loader.live import tables
from services.loader.loader import Loader
from services.loader.maintenance import Maintenance
from services.loader.naming import MAX_NAME, source_column
from services.loader.spark import CatalogConfig, register
from services.ops import status
from shared import jetstream
from shared.errors import HeldTableRenamed
from shared.health import Conditions
from shared.metrics import Registry, serve
from shared.store_client import StoreClient
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


def load_t_and_u_then_refuse_u(lake: Any, f: Feed, ids: range) -> Any:
    """Tables t and u loaded with `ids`; then Iceberg refuses every write to u's changelog (a real
    failure, not a mock). Returns u's lake table."""
    first = [inserts(f, "t", ids, "t"), inserts(f, "u", ids, "u")]
    lake.apply(first[-1][0], first)
    u = lake.table("d", "u")
    assert u is not None
    lake.spark.sql(f"ALTER TABLE {u.names.changelog} SET TBLPROPERTIES ('write.format.default'='bogus')")
    return u


def test_a_table_the_lake_refuses_is_held_while_the_others_load_then_resumes_equal(lake_factory, monkeypatch):
    lake = lake_factory()
    f = Feed()
    u = load_t_and_u_then_refuse_u(lake, f, range(1, 4))
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
    # The operator's step: fix the cause, restart the loader. The first retry is killed after
    # its replay, before the held rows are deleted: the next start finishes it, once.
    lake.spark.sql(f"ALTER TABLE {u.names.changelog} SET TBLPROPERTIES ('write.format.default'='parquet')")

    def killed(key: tuple[str, str]) -> None:
        raise SystemExit("kill -9")

    monkeypatch.setattr(again.holds, "release", killed)
    with pytest.raises(SystemExit):
        again.retry_held()
    with structlog.testing.capture_logs() as logs:
        fixed = lake_factory(lake.catalog)
    assert [e["table"] for e in logs if e["event"] == "lake.table_resumed"] == ["d.u"]
    assert not fixed.holds.tables
    assert fixed.holds.events(("d", "u")) == []
    assert current(fixed, "d", "u") == Counter({(i, f"u{i}"): 1 for i in range(2, 7)})
    changelog = fixed.spark.table(u.names.changelog)
    assert changelog.where("_binlake_op <> 'ddl'").count() == 3 + 3 + 1  # every change once
    b4 = [inserts(f, "u", range(7, 8), "u"), inserts(f, "t", range(8, 9), "t")]
    fixed.apply(b4[-1][0], b4)
    assert current(fixed, "d", "u") == Counter({(i, f"u{i}"): 1 for i in range(2, 8)})
    assert current(fixed, "d", "t") == Counter({(i, f"t{i}"): 1 for i in range(1, 9)})


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def test_a_held_table_shows_in_status_healthz_and_metrics_until_the_loader_retries_it(
        lake_factory, nats_url, monkeypatch):
    lake = lake_factory()
    f = Feed()
    u = load_t_and_u_then_refuse_u(lake, f, range(1, 3))
    b2 = [inserts(f, "u", range(3, 5), "u"), inserts(f, "t", range(3, 5), "t")]
    lake.apply(b2[-1][0], b2)

    prefix = f"iso{next(_catalogs)}"
    cfg = LoaderConfig(nats_url=nats_url, prefix=prefix, source="main", retry_held_s=0.0)
    registry, conditions = Registry(), Conditions()
    nc = await jetstream.connect(nats_url, name="test")
    server = await serve(registry, "127.0.0.1", 0, conditions.problem)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("BINLAKE_NATS_URL", nats_url)
    try:
        loader = Loader(cfg, cast(StoreClient, None), lake, Maintenance(lake, 0, 0), registry, nc.jetstream(),
                        None, conditions)
        await loader._report_held()
        code, body = await _get(port, "/healthz")
        assert code == 503 and "d.u since batch" in body and "bogus" in body.lower()
        assert "binlake_loader_tables_held 1" in (await _get(port, "/metrics"))[1]
        shown = await status.collect(nats_url, prefix, "main", 1)
        assert list(shown["held"]["loader"]) == ["d.u"]
        assert "tables set aside by loader" in status.render(shown)
        assert current(lake, "d", "t") == Counter({(i, f"t{i}"): 1 for i in range(1, 5)})

        # The operator fixes the cause; the loader tries the table again on its own.
        lake.spark.sql(f"ALTER TABLE {u.names.changelog} SET TBLPROPERTIES ('write.format.default'='parquet')")
        loader._retry_held()
        await loader._report_held()
        assert await _get(port, "/healthz") == (200, "ok\n")
        assert "binlake_loader_tables_held 0" in (await _get(port, "/metrics"))[1]
        assert (await status.collect(nats_url, prefix, "main", 1))["held"] == {}
        assert current(lake, "d", "u") == Counter({(i, f"u{i}"): 1 for i in range(1, 5)})
    finally:
        server.close()
        await nc.close()


def test_a_case_only_column_rename_is_followed(lake_factory):
    lake = lake_factory()
    f = Feed()
    email = {"name": "Email", "type": "varchar", "nullable": True, "charset": "utf8mb4"}
    b = [f.env("i", [{"after": {"id": i, "Email": f"e{i}"}} for i in range(1, 4)], [ID, email], ["id"]),
         f.ddl("ALTER TABLE t RENAME COLUMN Email TO email",
               {"kind": "alter", "renames": [], "ops": [{"op": "rename", "old": "Email", "new": "email"}]}),
         f.env("u", [{"before": {"id": 2, "email": "e2"}, "after": {"id": 2, "email": "x"}}],
               [ID, {**email, "name": "email"}], ["id"])]
    lake.apply(b[-1][0], b)
    assert not lake.holds.tables
    t = lake.table("d", "t")
    assert t is not None and list(t.columns) == ["id", "email"]
    assert lake.spark.table(t.names.current).columns == ["id", "email"]
    assert current(lake, "d", "t") == Counter({(1, "e1"): 1, (2, "x"): 1, (3, "e3"): 1})
    assert "email" in lake.spark.table(t.names.changelog).columns


def test_source_columns_named_like_the_bookkeeping_load_under_an_escape(lake_factory):
    lake = lake_factory()
    f = Feed()
    x = {"name": "_binlake_x", "type": "int", "nullable": True}
    op = {"name": "_BINLAKE_op", "type": "varchar", "nullable": True, "charset": "utf8mb4"}
    b = [f.env("i", [{"after": {"id": i, "_binlake_x": i * 10}} for i in range(1, 4)], [ID, x], ["id"]),
         f.env("u", [{"before": {"id": 2, "_binlake_x": 20}, "after": {"id": 2, "_binlake_x": 21}}], [ID, x], ["id"]),
         f.ddl("ALTER TABLE t ADD COLUMN _BINLAKE_op VARCHAR(9) AFTER id",
               {"kind": "alter", "renames": [], "ops": [{"op": "add", "column": op, "after": "id"}]}),
         f.env("i", [{"after": {"id": 4, "_BINLAKE_op": "i", "_binlake_x": 40}}], [ID, op, x], ["id"]),
         f.env("d", [{"before": {"id": 1, "_BINLAKE_op": None, "_binlake_x": 10}}], [ID, op, x], ["id"])]
    lake.apply(b[-1][0], b)
    assert not lake.holds.tables
    t = lake.table("d", "t")
    assert t is not None
    assert lake.spark.table(t.names.current).columns == ["id", "__BINLAKE_op", "__binlake_x"]
    assert current(lake, "d", "t") == Counter({(2, None, 21): 1, (3, None, 30): 1, (4, "i", 40): 1})
    assert [source_column(c) for c in lake.spark.table(t.names.current).columns] == ["id", "_BINLAKE_op", "_binlake_x"]


def test_a_long_upper_case_table_name_loads_under_a_bounded_name(lake_factory):
    lake = lake_factory()
    db, table = "Shop" * 16, "ORDER_ITEMS_" + "X" * 34  # 64 and 46 characters: MySQL's longest
    f = Feed(db, table)
    other = Feed(db, "small")
    b = [f.env("i", [{"after": {"id": i, "v": f"v{i}"}} for i in range(1, 4)], [ID, V], ["id"]),
         f.env("d", [{"before": {"id": 1, "v": "v1"}}], [ID, V], ["id"])]
    b.append(other.env("i", [{"after": {"id": 1, "v": "s"}}], [ID, V], ["id"]))
    b[-1] = (b[-2][0] + 1, b[-1][1])
    lake.apply(b[-1][0], b)
    assert not lake.holds.tables
    t = lake.table(db, table)
    assert t is not None
    assert max(len(t.names.namespace), len(t.names.current_name)) <= MAX_NAME
    assert current(lake, db, table) == Counter({(2, "v2"): 1, (3, "v3"): 1})
    restarted = lake_factory(lake.catalog)
    assert {(n.db, n.table) for n in tables(restarted.spark, restarted.catalog)} == {(db, table), (db, "small")}
    assert {(t.names.db, t.names.table) for t in restarted.loaded()} == {(db, table), (db, "small")}
    assert current(restarted, db, table) == Counter({(2, "v2"): 1, (3, "v3"): 1})


class _Killed(BaseException):
    """kill -9 in the middle of a schema change (no cleanup: BaseException passes every handler)."""


def test_a_loader_killed_inside_a_case_only_rename_ends_equal_on_redelivery(lake_factory, monkeypatch):
    """Each of the four column renames (current and changelog, each through its temporary name) is
    the last call of a loader killed there; the redelivered batch ends equal, nothing set aside."""
    name = {"name": "name", "type": "varchar", "nullable": True, "charset": "utf8mb4"}
    renamed = [ID, {**name, "name": "Name"}]
    real = Iceberg.rename_column
    for kill_at in range(4):
        lake = lake_factory()
        f = Feed(table=f"t{kill_at}")  # one warehouse for all
        b1 = [f.env("i", [{"after": {"id": i, "name": f"U{i}"}} for i in range(1, 4)], [ID, name], ["id"])]
        lake.apply(b1[-1][0], b1)
        b2 = [f.env("u", [{"before": {"id": 1, "name": "U1"}, "after": {"id": 1, "name": "U1!"}}], [ID, name], ["id"]),
              f.ddl("ALTER TABLE t RENAME COLUMN name TO Name",
                    {"kind": "alter", "renames": [], "ops": [{"op": "rename", "old": "name", "new": "Name"}]}),
              f.env("u", [{"before": {"id": 2, "Name": "U2"}, "after": {"id": 2, "Name": "U2!"}}], renamed, ["id"])]
        calls = itertools.count()

        def rename(self: Iceberg, ident: str, old: str, new: str, at: int = kill_at,
                   n: itertools.count[int] = calls) -> None:
            if next(n) == at:
                raise _Killed
            real(self, ident, old, new)

        monkeypatch.setattr(Iceberg, "rename_column", rename)
        with pytest.raises(_Killed):
            lake.apply(b2[-1][0], b2)
        monkeypatch.setattr(Iceberg, "rename_column", real)
        again = lake_factory(lake.catalog)
        b3 = [f.env("i", [{"after": {"id": 4, "Name": "U4"}}], renamed, ["id"])]
        again.apply(b3[-1][0], b2 + b3)
        assert not again.holds.tables, (kill_at, again.holds.tables)
        t = again.table("d", f"t{kill_at}")
        assert t is not None and again.spark.table(t.names.current).columns == ["id", "Name"]
        want = Counter({(1, "U1!"): 1, (2, "U2!"): 1, (3, "U3"): 1, (4, "U4"): 1})
        assert current(again, "d", f"t{kill_at}") == want, kill_at
        # The history keeps its values under the new name (readers of the changelog, as-of).
        history = again.spark.table(t.names.changelog).where("_binlake_op <> 'ddl'")
        assert sorted((r["id"], r["Name"]) for r in history.collect()) == \
            [(1, "U1"), (1, "U1!"), (2, "U2"), (2, "U2!"), (3, "U3"), (4, "U4")], kill_at


def test_a_column_added_again_in_another_case_loads(lake_factory):
    """DROP COLUMN name, then ADD COLUMN Name: the changelog keeps the dropped column's history, which
    Spark would take for the new one; it is set aside instead of stopping the table."""
    lake = lake_factory()
    f = Feed()
    name = {"name": "name", "type": "varchar", "nullable": True, "charset": "utf8mb4"}
    b = [f.env("i", [{"after": {"id": 1, "name": "a"}}], [ID, name], ["id"]),
         f.ddl("ALTER TABLE t DROP COLUMN name",
               {"kind": "alter", "renames": [], "ops": [{"op": "drop", "name": "name"}]}),
         f.ddl("ALTER TABLE t ADD COLUMN Name INT",
               {"kind": "alter", "renames": [],
                "ops": [{"op": "add", "column": {"name": "Name", "type": "int", "nullable": True}}]}),
         f.env("i", [{"after": {"id": 2, "Name": 7}}], [ID, {"name": "Name", "type": "int", "nullable": True}], ["id"])]
    lake.apply(b[-1][0], b)
    assert not lake.holds.tables, lake.holds.tables
    assert current(lake, "d", "t") == Counter({(1, None): 1, (2, 7): 1})


def test_a_rename_of_a_held_table_halts_the_loader_until_the_table_loads_again(lake_factory):
    """Its kept changes would stay behind under the old name: the loader stops before the rename
    (HeldTableRenamed), keeps everything, and applies the rename once the table loads again."""
    lake = lake_factory()
    f = Feed()
    u = load_t_and_u_then_refuse_u(lake, f, range(1, 4))
    b2 = [inserts(f, "u", range(4, 6), "u")]
    lake.apply(b2[-1][0], b2)
    assert set(lake.holds.tables) == {("d", "u")}
    alter = {"kind": "rename", "ops": [], "renames": [["d", "u", "d", "w"]]}
    old_half = f.ddl("RENAME TABLE u TO w", alter, table="u")
    f.seq += 1  # the other half's CDC sequence
    b3 = [old_half, (old_half[0] + 1, {**old_half[1], "table": "w"}), inserts(f, "w", range(6, 7), "w")]
    with pytest.raises(HeldTableRenamed, match=r"renames d\.u, which the loader set aside"):
        lake.apply(b3[-1][0], b3)
    assert len(lake.holds.events(("d", "u"))) == 1  # nothing of the unit was kept, nothing lost
    lake.spark.sql(f"ALTER TABLE {u.names.changelog} SET TBLPROPERTIES ('write.format.default'='parquet')")
    again = lake_factory(lake.catalog)  # the restart: u loads again, then the redelivered unit renames it
    assert not again.holds.tables
    again.apply(b3[-1][0], b3)
    again.merge_all()
    assert again.table("d", "u") is None
    assert current(again, "d", "w") == Counter({(i, f"u{i}" if i < 6 else f"w{i}"): 1 for i in range(1, 7)})

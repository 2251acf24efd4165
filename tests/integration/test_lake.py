"""The lake in-process on the test session's Spark: Iceberg tables from envelopes (DESIGN §7).

No NATS here: batches of envelopes go straight into `services.loader.lake.Lake`, so each
test can put the lake into the exact state a kill -9 leaves behind and check what a
restarted loader makes of it. The end-to-end tests (every service a process) are in
test_loader.py.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from services.loader.lake import Lake, MergePolicy
from services.loader.live import live_frame
from services.loader.spark import CatalogConfig, register
from tests.integration.lake_feed import Feed

pytestmark = pytest.mark.timeout(900)  # Spark on 2 cores
_catalogs = itertools.count()
ID = {"name": "id", "type": "int", "nullable": False}
V = {"name": "v", "type": "varchar", "nullable": True, "charset": "utf8mb4"}
N = {"name": "n", "type": "int", "nullable": True}


@pytest.fixture
def lake_factory(spark: SparkSession, tmp_path: Path) -> Callable[..., Lake]:
    def make(policy: MergePolicy | None = None, name: str | None = None) -> Lake:
        catalog = name or f"t{next(_catalogs)}"
        register(spark, CatalogConfig(name=catalog, warehouse=str(tmp_path / "wh")))
        lake = Lake(spark, catalog, policy or MergePolicy(rows=10**9, age_s=10**9))
        lake.open()
        return lake
    return make


def live(lake: Lake, db: str, table: str) -> Counter[tuple[Any, ...]]:
    df = live_frame(lake.spark, lake.catalog, db, table)
    assert df is not None
    return Counter(tuple(r) for r in df.collect())


def current(lake: Lake, db: str, table: str) -> Counter[tuple[Any, ...]]:
    t = lake.table(db, table)
    assert t is not None
    return Counter(tuple(r) for r in lake.spark.table(t.names.current).collect())


def test_keyed_inserts_updates_key_moves_and_deletes(lake_factory):
    lake = lake_factory()
    f = Feed()
    cols, pk = [ID, V], ["id"]
    b1 = [f.env("i", [{"after": {"id": i, "v": f"v{i}"}} for i in range(1, 6)], cols, pk)]
    lake.apply(b1[-1][0], b1)
    b2 = [f.env("u", [{"before": {"id": 2, "v": "v2"}, "after": {"id": 2, "v": "x"}}], cols, pk),
          f.env("u", [{"before": {"id": 3, "v": "v3"}, "after": {"id": 30, "v": "v3"}}], cols, pk),
          f.env("d", [{"before": {"id": 4, "v": "v4"}}], cols, pk),
          f.env("i", [{"after": {"id": 4, "v": "again"}}], cols, pk)]
    lake.apply(b2[-1][0], b2)
    want = Counter({(1, "v1"): 1, (2, "x"): 1, (30, "v3"): 1, (4, "again"): 1, (5, "v5"): 1})
    assert live(lake, "d", "t") == want
    assert current(lake, "d", "t") == Counter()  # nothing merged yet (policy)
    lake.merge_all()
    assert current(lake, "d", "t") == want
    assert live(lake, "d", "t") == want
    # redelivery of both batches: nothing changes, nothing appended twice
    lake.apply(b2[-1][0], b1 + b2)
    t = lake.table("d", "t")
    assert t is not None
    n = lake.spark.table(t.names.changelog).count()
    assert n == 9
    assert live(lake, "d", "t") == want


def test_keyless_table_keeps_duplicates_exact(lake_factory):
    lake = lake_factory()
    f = Feed(table="k")
    cols = [N, V]
    b = [f.env("i", [{"after": {"n": 1, "v": "a"}}, {"after": {"n": 1, "v": "a"}}, {"after": {"n": 2, "v": None}}],
               cols, []),
         f.env("u", [{"before": {"n": 1, "v": "a"}, "after": {"n": 1, "v": "b"}}], cols, []),
         f.env("i", [{"after": {"n": 2, "v": None}}], cols, [])]
    lake.apply(b[-1][0], b)
    want = Counter({(1, "a"): 1, (1, "b"): 1, (2, None): 2})
    assert live(lake, "d", "k") == want
    lake.merge_all()
    assert current(lake, "d", "k") == want
    b = [f.env("d", [{"before": {"n": 2, "v": None}}], cols, [])]
    lake.apply(b[-1][0], b)
    assert live(lake, "d", "k") == Counter({(1, "a"): 1, (1, "b"): 1, (2, None): 1})
    lake.merge_all()
    assert current(lake, "d", "k") == Counter({(1, "a"): 1, (1, "b"): 1, (2, None): 1})


def test_a_keyless_snapshot_replaces_the_rows_before_it(lake_factory):
    """Rows the binlog brought, then a snapshot of the same table (`replace`, then its `r` rows,
    across two batches with a merge between them), then changes: every row counted once."""
    lake = lake_factory(MergePolicy(rows=1, age_s=10**9))  # a merge after every batch
    f = Feed(table="k")
    cols = [N, V]
    a, b = {"n": 1, "v": "a"}, {"n": 2, "v": None}
    b1 = [f.env("i", [{"after": a}, {"after": a}, {"after": b}], cols, [])]
    lake.apply(b1[-1][0], b1)
    b2 = [f.replace(), f.env("r", [{"after": a}, {"after": a}], cols, [])]
    lake.apply(b2[-1][0], b2)
    assert current(lake, "d", "k") == Counter({(1, "a"): 2, (2, None): 1})  # not merged while incomplete
    assert live(lake, "d", "k") == Counter({(1, "a"): 2, (2, None): 1})  # the snapshot's rows left out so far
    b3 = [f.env("d", [{"before": a}], cols, []), f.env("r", [{"after": b}], cols, []), f.replaced(),
          f.env("i", [{"after": b}], cols, [])]
    lake.apply(b3[-1][0], b3)
    want = Counter({(1, "a"): 1, (2, None): 2})
    assert current(lake, "d", "k") == want and live(lake, "d", "k") == want
    # A redelivery appends nothing again; a second snapshot of the same rows leaves them once.
    lake.apply(b3[-1][0], b1 + b2 + b3)
    assert current(lake, "d", "k") == want
    b4 = [f.replace(), f.env("r", [{"after": a}, {"after": b}, {"after": b}], cols, []), f.replaced()]
    lake.apply(b4[-1][0], b4)
    assert current(lake, "d", "k") == want and live(lake, "d", "k") == want
    # The source emptied the table: its snapshot is a `replace` and a `replaced`.
    b5 = [f.replace(), f.replaced()]
    lake.apply(b5[-1][0], b5)
    assert current(lake, "d", "k") == Counter() and live(lake, "d", "k") == Counter()


def test_live_folds_a_replace_not_merged_yet(lake_factory):
    lake = lake_factory()  # never merges by itself
    f = Feed(table="k")
    cols = [N, V]
    b = [f.env("i", [{"after": {"n": 1, "v": "x"}}], cols, [])]
    lake.apply(b[-1][0], b)
    lake.merge_all()
    b = [f.env("i", [{"after": {"n": 3, "v": "y"}}], cols, []), f.replace(),
         f.env("r", [{"after": {"n": 1, "v": "x"}}], cols, []), f.replaced(),
         f.env("i", [{"after": {"n": 4, "v": "z"}}], cols, [])]
    lake.apply(b[-1][0], b)
    want = Counter({(1, "x"): 1, (4, "z"): 1})
    assert live(lake, "d", "k") == want
    lake.merge_all()
    assert current(lake, "d", "k") == want


def test_a_keyless_snapshot_in_pages_is_merged_once_complete_and_a_restarted_one_counts_once(lake_factory):
    """The parser reads a keyless table in pages between writes: until `replaced` the table is not
    merged and no cut is published (also after a restart of the loader), the live fold leaves the
    snapshot's rows out; a snapshot the parser started over counts only its last attempt."""
    lake = lake_factory(MergePolicy(rows=1, age_s=10**9), name="pages")  # merges after every batch
    f = Feed(table="k")
    cols = [N, V]
    x, y, z = {"n": 1, "v": "x"}, {"n": 2, "v": "y"}, {"n": 3, "v": "z"}
    b = [f.env("i", [{"after": x}, {"after": y}], cols, [])]
    lake.apply(b[-1][0], b)
    cut = lake.cuts.newest
    before = Counter({(1, "x"): 1, (2, "y"): 1})
    assert current(lake, "d", "k") == before
    # The first attempt: a page, then the parser dies; a change comes between.
    b = [f.replace(), f.env("r", [{"after": x}], cols, []), f.env("i", [{"after": z}], cols, [])]
    lake.apply(b[-1][0], b)
    assert current(lake, "d", "k") == before and lake.cuts.newest == cut
    assert live(lake, "d", "k") == before + Counter({(3, "z"): 1})
    restarted = lake_factory(MergePolicy(rows=1, age_s=10**9), name="pages")
    t = restarted.table("d", "k")
    assert t is not None and t.replace_open
    # The second attempt (the source now holds x, y, z, then y is deleted mid-snapshot).
    b = [f.replace(), f.env("r", [{"after": x}, {"after": y}], cols, []), f.env("d", [{"before": y}], cols, [])]
    restarted.apply(b[-1][0], b)
    assert current(restarted, "d", "k") == before and restarted.cuts.newest == cut
    b = [f.env("r", [{"after": z}], cols, []), f.replaced()]
    restarted.apply(b[-1][0], b)
    want = Counter({(1, "x"): 1, (3, "z"): 1})
    assert current(restarted, "d", "k") == want and live(restarted, "d", "k") == want
    assert restarted.cuts.newest == b[-1][0]
    # A third snapshot fails half-way (`abandoned`): its rows count for nothing, merges and cuts go on.
    b = [f.replace(), f.env("r", [{"after": x}], cols, []), f.env("i", [{"after": y}], cols, [])]
    restarted.apply(b[-1][0], b)
    assert restarted.cuts.newest < b[-1][0]
    b = [f.replaced(op="abandoned"), f.env("i", [{"after": y}], cols, [])]
    restarted.apply(b[-1][0], b)
    want += Counter({(2, "y"): 2})
    assert current(restarted, "d", "k") == want and live(restarted, "d", "k") == want
    assert restarted.cuts.newest == b[-1][0]


def test_add_column_default_rename_modify_and_truncate(lake_factory):
    lake = lake_factory()
    f = Feed()
    cols, pk = [ID, V], ["id"]
    b = [f.env("i", [{"after": {"id": i, "v": f"v{i}"}} for i in range(1, 4)], cols, pk),
         f.ddl("ALTER TABLE t ADD COLUMN c VARCHAR(5) NOT NULL DEFAULT 'x'",
               {"kind": "alter", "renames": [], "ops": [{"op": "add", "column": {
                   "name": "c", "type": "varchar", "nullable": False, "charset": "utf8mb4"}, "default": "x"}]})]
    cols2 = [ID, V, {"name": "c", "type": "varchar", "nullable": False, "charset": "utf8mb4"}]
    b.append(f.env("i", [{"after": {"id": 9, "v": "new", "c": "y"}}], cols2, pk))
    lake.apply(b[-1][0], b)
    assert live(lake, "d", "t") == Counter({(1, "v1", "x"): 1, (2, "v2", "x"): 1, (3, "v3", "x"): 1,
                                           (9, "new", "y"): 1})
    b = [f.ddl("ALTER TABLE t RENAME COLUMN v TO w, MODIFY id BIGINT",
               {"kind": "alter", "renames": [], "ops": [
                   {"op": "rename", "old": "v", "new": "w"},
                   {"op": "modify", "old": "id", "column": {"name": "id", "type": "bigint", "nullable": False}}]})]
    lake.apply(b[-1][0], b)
    t = lake.table("d", "t")
    assert t is not None and list(t.columns.items()) == [("id", "bigint"), ("w", "string"), ("c", "string")]
    assert lake.spark.table(t.names.current).columns == ["id", "w", "c"]
    assert live(lake, "d", "t")[(9, "new", "y")] == 1
    b = [f.ddl("TRUNCATE t", {"kind": "truncate", "ops": [], "renames": []})]
    lake.apply(b[-1][0], b)
    assert live(lake, "d", "t") == Counter()


def test_maintenance_keeps_the_markers_and_exactly_once(lake_factory):
    """Compaction commits `replace` snapshots and expiry drops old ones: the markers survive."""
    from services.loader.maintenance import Maintenance

    lake = lake_factory()
    f = Feed()
    cols, pk = [ID, V], ["id"]
    batches = []
    for b in range(6):
        batch = [f.env("i", [{"after": {"id": b * 10 + i, "v": "x"}} for i in range(3)], cols, pk)]
        lake.apply(batch[-1][0], batch)
        lake.merge_all()
        batches += batch
    t = lake.table("d", "t")
    assert t is not None
    before = (t.appended, t.merged)
    Maintenance(lake, every_s=1, keep_s=0).run()
    restarted = Lake(lake.spark, lake.catalog)
    restarted.open()
    again = restarted.table("d", "t")
    assert again is not None and (again.appended.order, again.merged.order) == (before[0].order, before[1].order)
    ops = [r[0] for r in lake.spark.sql(f"SELECT operation FROM {again.names.changelog}.snapshots").collect()]
    assert "replace" in ops, ops  # compaction ran
    restarted.apply(batches[-1][0], batches)  # everything redelivered: nothing twice
    assert lake.spark.table(again.names.changelog).count() == 18
    assert live(restarted, "d", "t") == Counter({(b * 10 + i, "x"): 1 for b in range(6) for i in range(3)})


def test_a_kill_in_the_middle_of_a_type_change_is_finished_on_redelivery(lake_factory, tmp_path):
    """MODIFY to an incompatible type is several schema changes; a kill between them is repaired."""
    lake = lake_factory(name="modkill")
    f = Feed()
    cols, pk = [ID, N], ["id"]
    b1 = [f.env("i", [{"after": {"id": i, "n": i}} for i in range(1, 4)], cols, pk)]
    lake.apply(b1[-1][0], b1)
    t = lake.table("d", "t")
    assert t is not None
    # What a kill right after the first schema change of MODIFY n VARCHAR leaves: the changelog's
    # n set aside, no new n yet, a temporary column in the current table.
    lake.flush(t, b1[-1][0])
    lake.ice.rename_column(t.names.changelog, "n", "_binlake_was_1_n")
    lake.ice.add_columns(t.names.current, {"_binlake_new_n": "string"})
    restarted = Lake(lake.spark, "modkill", MergePolicy(rows=10**9, age_s=10**9))
    restarted.open()
    s = {"name": "n", "type": "varchar", "nullable": True, "charset": "utf8mb4"}
    b2 = [f.ddl("ALTER TABLE t MODIFY n VARCHAR(10)", {"kind": "alter", "renames": [], "ops": [
              {"op": "modify", "old": "n", "column": s}]}),
          f.env("i", [{"after": {"id": 9, "n": "nine"}}], [ID, s], pk)]
    restarted.apply(b2[-1][0], b1 + b2)
    t2 = restarted.table("d", "t")
    assert t2 is not None and t2.columns == {"id": "int", "n": "string"}
    assert live(restarted, "d", "t") == Counter({(1, "1"): 1, (2, "2"): 1, (3, "3"): 1, (9, "nine"): 1})


@pytest.mark.parametrize("order", ["old_first", "new_first", "split"])
def test_rename_table_halves_in_any_order(lake_factory, order):
    """RENAME TABLE a TO b reaches BINLAKE_CDC on a's and b's subjects in either order."""
    lake = lake_factory()
    f = Feed(table="a")
    cols, pk = [ID, V], ["id"]
    before = [f.env("i", [{"after": {"id": i, "v": "a"}} for i in range(1, 4)], cols, pk)]
    lake.apply(before[-1][0], before)
    # In source order: a late update of a, the RENAME (one statement: both halves share its scn), rows of b.
    late_a = f.env("u", [{"before": {"id": 1, "v": "a"}, "after": {"id": 1, "v": "late"}}], cols, pk)[1]
    alter = {"kind": "rename", "ops": [], "renames": [["d", "a", "d", "b"]]}
    old_half = f.ddl("RENAME TABLE a TO b", alter)[1]
    new_half = {**old_half, "table": "b"}
    b_rows = f.env("i", [{"after": {"id": 7, "v": "b"}}], cols, pk, table="b")[1]
    cdc_order = [late_a, old_half, new_half, b_rows] if order == "old_first" else [new_half, b_rows, late_a, old_half]
    events = [(100 + i, e) for i, e in enumerate(cdc_order)]
    if order == "split":  # the first batch holds only the new half: the loader must read ahead
        assert lake.pending_renames(events[:2])
    assert not lake.pending_renames(events)
    lake.apply(events[-1][0], events)
    lake.merge_all()
    want = Counter({(1, "late"): 1, (2, "a"): 1, (3, "a"): 1, (7, "b"): 1})
    assert lake.table("d", "a") is None
    assert live(lake, "d", "b") == want
    assert current(lake, "d", "b") == want
    lake.apply(events[-1][0], before + events)  # redelivered: nothing twice
    assert live(lake, "d", "b") == want


def test_a_unit_the_tables_held_before_a_kill_is_still_recorded(lake_factory):
    """Killed after every table committed but before the commits record: the redelivery records it."""
    lake = lake_factory(name="recordkill")
    f = Feed()
    cols, pk = [ID, V], ["id"]
    b1 = [f.env("i", [{"after": {"id": 1, "v": "a"}}], cols, pk)]
    lake.apply(b1[-1][0], b1)
    b2 = [f.env("i", [{"after": {"id": 2, "v": "b"}}], cols, pk)]

    def killed(*_: Any) -> None:
        raise SystemExit("kill -9")

    lake._record = killed
    with pytest.raises(SystemExit):
        lake.apply(b2[-1][0], b2)
    restarted = Lake(lake.spark, "recordkill", MergePolicy(rows=10**9, age_s=10**9))
    assert restarted.open() == b1[-1][0]
    assert restarted.apply(b2[-1][0], b1 + b2) == 0  # the tables hold it already
    assert Lake(lake.spark, "recordkill").open() == b2[-1][0]
    assert live(restarted, "d", "t") == Counter({(1, "a"): 1, (2, "b"): 1})


def test_create_if_not_exists_of_a_kept_table_changes_nothing(lake_factory):
    """MySQL logs CREATE TABLE IF NOT EXISTS even when the table exists (MariaDB does not): the lake
    keeps its rows; after a DROP TABLE the same statement creates the table again, empty."""
    lake = lake_factory()
    f = Feed()
    cols, pk = [ID, V], ["id"]
    create = "CREATE TABLE IF NOT EXISTS t (id INT PRIMARY KEY, v VARCHAR(10))"
    described = {"kind": "create", "ops": [], "renames": [], "columns": cols, "pk": pk, "if_not_exists": True}
    b = [f.env("i", [{"after": {"id": i, "v": f"v{i}"}} for i in range(1, 4)], cols, pk), f.ddl(create, described)]
    lake.apply(b[-1][0], b)
    lake.merge_all()
    assert current(lake, "d", "t") == Counter({(1, "v1"): 1, (2, "v2"): 1, (3, "v3"): 1})
    b = [f.ddl("DROP TABLE t", {"kind": "drop", "ops": [], "renames": []})]
    lake.apply(b[-1][0], b)
    b = [f.ddl(create, described), f.env("i", [{"after": {"id": 7, "v": "new"}}], cols, pk)]
    lake.apply(b[-1][0], b)
    assert live(lake, "d", "t") == Counter({(7, "new"): 1})
    t = lake.table("d", "t")
    assert t is not None and not t.dropped


def test_a_local_master_gets_the_heap_for_rows_of_64_mib(spark: SparkSession) -> None:
    """Spark's default driver heap (1g) ran out merging two 64 MiB rows; under local[*] the JVM gets 2g."""
    from services.loader.spark import LOCAL_DRIVER_MEMORY

    assert spark.sparkContext.getConf().get("spark.driver.memory") == LOCAL_DRIVER_MEMORY
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()  # type: ignore[union-attr]
    assert runtime.maxMemory() > 1024 ** 3


def test_units_delivered_again_rebuild_a_lost_table_and_leave_the_others_exact(lake_factory):
    """`binlake rewind loader`: the units come again. A table dropped from the lake is built up
    again; a keyless table that held every change gains no copy; no cut is published until the
    units reach the last committed batch again, also across a restart in between."""
    lake = lake_factory(name="rewound")
    f, k = Feed(), Feed(table="k")
    k.seq = f.seq = 0
    cols, pk = [ID, V], ["id"]
    units: list[list[tuple[int, dict[str, Any]]]] = []
    for i in range(3):
        unit = [f.env("i", [{"after": {"id": i, "v": f"v{i}"}}], cols, pk)]
        k.seq, k.scn = f.seq, f.scn
        unit.append(k.env("i", [{"after": {"n": i, "v": "dup"}}, {"after": {"n": i, "v": "dup"}}], [N, V], []))
        f.seq, f.scn = k.seq, k.scn
        units.append(unit)
        lake.apply(unit[-1][0], unit)
    lake.merge_all()
    committed, cut = lake.committed, lake.cuts.newest
    assert cut == committed
    keyed = Counter({(i, f"v{i}"): 1 for i in range(3)})
    keyless = Counter({(i, "dup"): 2 for i in range(3)})
    t = lake.table("d", "t")
    assert t is not None
    for ident in (t.names.current, t.names.changelog):  # the operator lost the table
        lake.spark.sql(f"DROP TABLE {ident}")

    again = lake_factory(name="rewound")
    assert again.table("d", "t") is None and again.replay_until == 0
    again.apply(units[0][-1][0], units[0])
    assert again.replay_until == committed
    again.merge_all()
    assert again.cuts.newest == cut  # the tables stand at different batches
    restarted = lake_factory(name="rewound")
    assert restarted.replay_until == committed  # from the commits record
    for unit in units[1:]:
        restarted.apply(unit[-1][0], unit)
    assert restarted.replay_until == 0
    restarted.merge_all()
    assert current(restarted, "d", "t") == keyed
    assert current(restarted, "d", "k") == keyless
    n = restarted.table("d", "k")
    assert n is not None and restarted.spark.table(n.names.changelog).count() == 6  # each change once
    unit = [f.env("i", [{"after": {"id": 9, "v": "new"}}], cols, pk)]
    restarted.apply(unit[-1][0], unit)
    restarted.merge_all()
    assert restarted.cuts.newest == unit[-1][0] > cut
    assert current(restarted, "d", "t") == keyed + Counter({(9, "new"): 1})


K = [N, V]


def test_the_first_snapshot_of_a_keyless_table_the_lake_lacks_is_not_merged_or_cut_until_complete(lake_factory):
    """The `replace` (with the table's columns) creates the lake table: a merge after every batch
    neither merges a partial snapshot nor publishes a cut, and a row deleted between the pages is
    not brought back by a later page."""
    lake = lake_factory(MergePolicy(rows=1, age_s=10**9), name="fresh")
    f = Feed(table="k")
    x, y = {"n": 1, "v": "x"}, {"n": 2, "v": "y"}
    for unit in ([f.replace(columns=K)], [f.env("r", [{"after": x}], K, [])], [f.env("d", [{"before": y}], K, [])]):
        lake.apply(unit[-1][0], unit)
        assert lake.cuts.newest == 0 and current(lake, "d", "k") == Counter()
    unit = [f.env("r", [{"after": y}], K, []), f.replaced()]
    lake.apply(unit[-1][0], unit)
    assert current(lake, "d", "k") == Counter({(1, "x"): 1}) == live(lake, "d", "k")
    assert lake.cuts.newest == unit[-1][0]


def test_the_rows_of_an_attempt_started_over_never_count(lake_factory):
    lake = lake_factory(name="again")
    f = Feed(table="k")
    x, y = {"n": 1, "v": "x"}, {"n": 2, "v": "y"}
    unit = [f.env("i", [{"after": x}, {"after": y}], K, [])]
    lake.apply(unit[-1][0], unit)
    lake.merge_all()
    unit = [f.replace(), f.env("r", [{"after": x}], K, []),  # the parser died after a page
            f.replace(), f.env("r", [{"after": x}], K, [])]  # the next attempt, one page so far
    lake.apply(unit[-1][0], unit)
    assert live(lake, "d", "k") == Counter({(1, "x"): 1, (2, "y"): 1})


def test_a_held_keyless_table_tried_again_mid_snapshot_is_merged_once_complete(lake_factory):
    lake = lake_factory(name="heldsnap")
    f = Feed(table="k")
    x, y, z = {"n": 1, "v": "x"}, {"n": 2, "v": "y"}, {"n": 3, "v": "z"}
    unit = [f.env("i", [{"after": x}, {"after": y}], K, [])]
    lake.apply(unit[-1][0], unit)
    lake.merge_all()
    unit = [f.replace(), f.env("r", [{"after": x}], K, [])]
    lake.apply(unit[-1][0], unit)
    lake._set_aside(("d", "k"), "set aside by the test", unit[-1][0])
    unit = [f.env("i", [{"after": z}], K, [])]
    lake.apply(unit[-1][0], unit)  # kept
    assert lake.retry_held() == ["d.k"]
    unit = [f.env("r", [{"after": y}], K, []), f.replaced()]
    lake.apply(unit[-1][0], unit)
    lake.merge_all()
    assert current(lake, "d", "k") == Counter({(1, "x"): 1, (2, "y"): 1, (3, "z"): 1})


def test_a_truncate_during_an_unfinished_snapshot_lets_merges_and_cuts_go_on(lake_factory):
    lake = lake_factory(name="truncsnap")
    f = Feed(table="k")
    x = {"n": 1, "v": "x"}
    unit = [f.env("i", [{"after": x}], K, [])]
    lake.apply(unit[-1][0], unit)
    lake.merge_all()
    unit = [f.replace(), f.env("r", [{"after": x}], K, [])]  # the parser dies here, then a TRUNCATE
    lake.apply(unit[-1][0], unit)
    unit = [f.ddl("TRUNCATE TABLE k", {"kind": "truncate", "ops": [], "renames": []}),
            f.env("i", [{"after": {"n": 5, "v": "new"}}], K, [])]
    lake.apply(unit[-1][0], unit)
    lake.merge_all()
    assert lake.cuts.newest == lake.committed
    assert current(lake, "d", "k") == Counter({(5, "new"): 1})


@pytest.mark.parametrize("keyless", [False, True])
def test_a_swap_and_renames_back_delivered_again_change_nothing(lake_factory, keyless):
    """RENAME TABLE a TO tmp, b TO a, tmp TO b, then a rename away and back: delivered again (a kill
    after the commits record, a rewind) each pair is recognised as applied, not swapped back."""
    lake = lake_factory(name=f"swap{int(keyless)}")
    f = Feed()
    cols, pk = ([N, V], []) if keyless else ([ID, V], ["id"])
    key = "n" if keyless else "id"

    def renames(sql: str, pairs: list[list[str]], tables: list[str]) -> list[tuple[int, dict[str, Any]]]:
        seq, env = f.ddl(sql, {"kind": "rename", "ops": [], "renames": pairs}, table=tables[0])
        out = [(seq, env)] + [(seq + 1 + i, {**env, "table": t}) for i, t in enumerate(tables[1:])]
        f.seq += len(tables)
        return out

    units = [[f.env("i", [{"after": {key: 1, "v": "A"}}], cols, pk, table="a"),
              f.env("i", [{"after": {key: 2, "v": "B"}}], cols, pk, table="b")],
             renames("RENAME TABLE a TO tmp, b TO a, tmp TO b",
                     [["d", "a", "d", "tmp"], ["d", "b", "d", "a"], ["d", "tmp", "d", "b"]], ["a", "b", "tmp"]),
             [f.env("i", [{"after": {key: 3, "v": "C"}}], cols, pk, table="a")],
             renames("RENAME TABLE a TO c", [["d", "a", "d", "c"]], ["a", "c"]),
             renames("RENAME TABLE c TO a", [["d", "c", "d", "a"]], ["c", "a"]),
             [f.env("i", [{"after": {key: 4, "v": "D"}}], cols, pk, table="a")]]
    for unit in units:
        lake.apply(unit[-1][0], unit)
    want_a, want_b = Counter({(2, "B"): 1, (3, "C"): 1, (4, "D"): 1}), Counter({(1, "A"): 1})
    assert live(lake, "d", "a") == want_a and live(lake, "d", "b") == want_b
    again = lake_factory(name=f"swap{int(keyless)}")
    for unit in units:
        again.apply(unit[-1][0], unit)
    assert live(again, "d", "a") == want_a and live(again, "d", "b") == want_b
    t = again.table("d", "a")
    assert t is not None and again.spark.table(t.names.changelog).where("_binlake_op <> 'ddl'").count() == 3

"""A consistent cut for readers that know only Iceberg (DESIGN §7, §8.8): every table as of one batch.

Two source tables are written in the same source transactions (each transaction inserts three
rows into `bank.acct` and one into `bank.ledger`, all tagged with the transaction's number), and
their current tables are merged at different moments (a DDL merges its own table on the spot; a
kill stops the merges of one cut halfway). The reader follows docs/lake.md's rule with pyiceberg and
DuckDB only: the newest cut in `_binlake/cuts`, then each table at the snapshot that cut names.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.table import StaticTable
from pyspark.sql import SparkSession

from services.loader.lake import CATCH_UP_AGE_FACTOR, Lake, MergePolicy
from services.loader.naming import BOOK_NAMESPACE, CUT_TAG, CUTS_TABLE
from services.loader.spark import CatalogConfig, register
from tests.integration.lake_feed import Feed
from tests.integration.test_lake_readers import duckdb_connection

pytestmark = pytest.mark.timeout(900)  # Spark on 2 cores
_catalogs = itertools.count()
COLS = [{"name": "id", "type": "int", "nullable": False}, {"name": "txn", "type": "int", "nullable": True}]
ADD = {"kind": "alter", "renames": [], "ops": [{"op": "add", "column": {"name": "note", "type": "int",
                                                                         "nullable": True}, "default": None}]}
POLICY = MergePolicy(rows=5, age_s=10**9)  # acct's tail is due after two transactions, ledger's never alone


# -- the reader: pyiceberg and DuckDB on the warehouse folders, no binlake code ---------------------


def newest(folder: Path) -> StaticTable:
    version = int((folder / "metadata" / "version-hint.text").read_text().strip())
    return StaticTable.from_metadata(str(folder / "metadata" / f"v{version}.metadata.json"))


def read_cut(warehouse: Path) -> tuple[int, dict[str, set[int]]]:
    """docs/lake.md's rule: the newest cut, each of its tables at the snapshot it names (NULL: empty)."""
    cuts = newest(warehouse / BOOK_NAMESPACE / CUTS_TABLE).scan().to_arrow().to_pylist()
    cut = max(r["cut"] for r in cuts)
    out: dict[str, set[int]] = {}
    con = duckdb_connection()
    for r in (r for r in cuts if r["cut"] == cut):
        folder = warehouse / r["lake_namespace"] / r["lake_table"]
        sid = r["snapshot_id"]
        rows = [] if sid is None else newest(folder).scan(snapshot_id=sid).to_arrow().to_pylist()
        txns = {int(x["txn"]) for x in rows}
        duck = set() if sid is None else {int(x[0]) for x in con.execute(
            f"SELECT DISTINCT txn FROM iceberg_scan('{folder}', snapshot_from_id => {sid})").fetchall()}
        assert duck == txns, (r, duck, txns)
        refs = newest(folder).refs()
        assert sid is None or refs[CUT_TAG].snapshot_id == sid, refs  # the tag is at the newest cut
        out[f"{r['source_db']}.{r['source_table']}"] = txns
    return cut, out


def read_heads(warehouse: Path) -> dict[str, set[int]]:
    """What a plain reader of the current tables sees: each table as of its own last merge."""
    out = {}
    for name in ("acct", "ledger"):
        table = newest(warehouse / "bank" / name)
        rows = table.scan().to_arrow().to_pylist() if table.current_snapshot() is not None else []
        out[f"bank.{name}"] = {int(r["txn"]) for r in rows}
    return out


# -- the writer ------------------------------------------------------------------------------------


class Bank:
    """Source transactions into bank.acct (3 rows) and bank.ledger (1 row), one batch each."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.feed = Feed(db="bank", table="acct")
        self.txn = 0
        self.batches: dict[int, int] = {}  # transaction -> its batch

    def transaction(self, ddl: bool = False) -> int:
        """One source transaction; with `ddl`, an ALTER TABLE acct after it in the same batch."""
        self.txn += 1
        k = self.txn
        events = [self.feed.env("i", [{"after": {"id": 10 * k + i, "txn": k}} for i in range(3)], COLS, ["id"]),
                  self.feed.env("i", [{"after": {"id": k, "txn": k}}], COLS, ["id"], table="ledger")]
        if ddl:
            events.append(self.feed.ddl("ALTER TABLE acct ADD COLUMN note INT", ADD))
        self.batches[k] = events[-1][0]
        self.lake.apply(events[-1][0], events)
        return events[-1][0]


@pytest.fixture
def bank(spark: SparkSession, tmp_path: Path) -> Callable[[], tuple[Bank, Path]]:
    def make() -> tuple[Bank, Path]:
        catalog = f"cuts{next(_catalogs)}"
        warehouse = tmp_path / catalog
        register(spark, CatalogConfig(name=catalog, warehouse=str(warehouse)))
        lake = Lake(spark, catalog, POLICY, clock=lambda: 0.0)
        lake.open()
        return Bank(lake), warehouse
    return make


def test_plain_readers_see_both_tables_as_of_one_source_transaction(bank):
    b, warehouse = bank()
    b.transaction()
    assert not (warehouse / BOOK_NAMESPACE / CUTS_TABLE / "data").exists()  # nothing merged: no cut yet
    b2 = b.transaction()  # acct's tail is due: both tables are merged at batch b2
    assert read_cut(warehouse) == (b2, {"bank.acct": {1, 2}, "bank.ledger": {1, 2}})
    # A DDL merges its own table only: the plain current tables now disagree (the issue) ...
    b.transaction(ddl=True)
    assert read_heads(warehouse) == {"bank.acct": {1, 2, 3}, "bank.ledger": {1, 2}}
    # ... and the cut still shows both as of one transaction
    assert read_cut(warehouse) == (b2, {"bank.acct": {1, 2}, "bank.ledger": {1, 2}})
    b.transaction()
    b5 = b.transaction()  # acct due again: ledger's tail (three transactions) goes with it
    assert read_cut(warehouse) == (b5, {"bank.acct": {1, 2, 3, 4, 5}, "bank.ledger": {1, 2, 3, 4, 5}})
    assert read_heads(warehouse) == {"bank.acct": {1, 2, 3, 4, 5}, "bank.ledger": {1, 2, 3, 4, 5}}
    b.transaction()  # a tail after the cut: the tag still names the cut's snapshot
    tagged = b.lake.spark.sql(f"SELECT DISTINCT txn FROM {b.lake.catalog}.bank.ledger VERSION AS OF '{CUT_TAG}'")
    assert {int(r[0]) for r in tagged.collect()} == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("moment", ["between_merges", "before_record", "before_tags"])
def test_a_kill_in_the_middle_of_a_cut(bank, moment):
    """kill -9 while a cut is published: readers keep the previous cut; the restarted lake publishes it whole."""
    b, warehouse = bank()
    b.transaction()
    b2 = b.transaction()
    b.transaction()
    lake = b.lake
    if moment == "between_merges":
        flush, calls = lake.flush, []

        def killed_flush(table: Any, batch: int) -> None:
            calls.append(table.names.table)
            if len(calls) == 2:
                raise SystemExit("kill -9")
            flush(table, batch)

        lake.flush = killed_flush
    elif moment == "before_record":
        def killed_publish(*_: Any) -> None:
            raise SystemExit("kill -9")

        lake.cuts.publish = killed_publish
    else:
        def killed_tag(*_: Any) -> None:
            raise SystemExit("kill -9")

        lake.cuts.tag = killed_tag
    with pytest.raises(SystemExit):
        b.transaction()  # acct due: the cut at this batch is being published
    b4 = b.batches[4]
    if moment == "before_tags":  # the cut is recorded, but the tags are one cut behind
        assert newest(warehouse / "bank" / "acct").refs()[CUT_TAG].snapshot_id != \
            newest(warehouse / "bank" / "acct").current_snapshot().snapshot_id  # type: ignore[union-attr]
    else:
        assert read_cut(warehouse) == (b2, {"bank.acct": {1, 2}, "bank.ledger": {1, 2}})
    if moment == "between_merges":
        assert read_heads(warehouse) == {"bank.acct": {1, 2, 3, 4}, "bank.ledger": {1, 2}}

    # A tail a restarted lake finds is due once its clock is past the policy's age (time.monotonic
    # in the loader: seconds since boot, past BINLAKE_MERGE_S; here 10**9 s).
    restarted = Lake(lake.spark, lake.catalog, POLICY, clock=lambda: 2.0 * POLICY.age_s)
    assert restarted.open() == b4
    restarted.merge_due(restarted.committed)  # what the loader does when idle
    assert read_cut(warehouse) == (b4, {"bank.acct": {1, 2, 3, 4}, "bank.ledger": {1, 2, 3, 4}})


def test_a_rename_table_publishes_a_cut_with_the_new_name(bank):
    """The hadoop catalog renames by copying (new snapshot ids): a cut with the new name follows at once."""
    b, warehouse = bank()
    b.transaction()
    b.transaction()
    alter = {"kind": "rename", "ops": [], "renames": [["bank", "acct", "bank", "acct2"]]}
    old_half = b.feed.ddl("RENAME TABLE acct TO acct2", alter)
    new_half = (b.feed.seq + 1, {**old_half[1], "table": "acct2"})
    b.lake.apply(new_half[0], [old_half, new_half])
    assert read_cut(warehouse) == (new_half[0], {"bank.acct2": {1, 2}, "bank.ledger": {1, 2}})


def test_merges_by_age_wait_while_the_loader_is_behind(bank):
    """A catch-up does not merge every BINLAKE_MERGE_S: the tails merge once the lake caught up, or
    after CATCH_UP_AGE_FACTOR times as long (a loader that stays behind); by rows they still merge
    (the tail a reader folds stays bounded)."""
    b, warehouse = bank()
    now = [0.0]
    b.lake.clock = lambda: now[0]
    b.lake.policy = MergePolicy(rows=10**6, age_s=10)
    b.transaction()
    now[0] = 10 * CATCH_UP_AGE_FACTOR - 1
    b.lake.behind = True  # the loader's last batch came back full
    b.transaction()
    assert read_heads(warehouse) == {"bank.acct": set(), "bank.ledger": set()}
    b.lake.behind = False
    b.lake.merge_due(b.lake.committed)
    assert read_heads(warehouse) == {"bank.acct": {1, 2}, "bank.ledger": {1, 2}}
    b.lake.behind = True
    b.transaction()  # its tail starts now
    now[0] += 10 * CATCH_UP_AGE_FACTOR
    b.lake.merge_due(b.lake.committed)
    assert read_heads(warehouse) == {"bank.acct": {1, 2, 3}, "bank.ledger": {1, 2, 3}}
    b.lake.policy = MergePolicy(rows=5, age_s=10**9)
    b.transaction()
    b.transaction()  # acct's tail: 6 rows
    assert read_heads(warehouse)["bank.acct"] == {1, 2, 3, 4, 5}

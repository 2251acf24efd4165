"""assert_exactly_once: the stream holds every row change of a workload once, in order, with the source's values."""

from __future__ import annotations

from collections import Counter

from tests.integration.support import StoredMsg, assert_table_order, count_rows, replay, row_changes
from tests.integration.workload import TABLES, Workload

# Columns compared by value after the replay (envelope value == str/int of the source value).
COMPARED = {"accounts": ("owner", "balance"), "events": ("kind", "body"), "tags": ("n",)}


def assert_exactly_once(msgs: list[StoredMsg], workload: Workload) -> None:
    db = workload.db
    changes = row_changes(msgs, db)
    ids = Counter(m.headers["Nats-Msg-Id"] for m in msgs)
    assert [i for i, n in ids.items() if n > 1] == [], "duplicate message ids"
    batches = Counter((m.env["txn"]["id"], m.env["txn"]["i"]) for m in changes)
    assert [b for b, n in batches.items() if n > 1] == [], "a transaction batch was published twice"
    assert count_rows(msgs, db) == workload.changes, "row changes lost or duplicated"
    assert_table_order(msgs)
    assert_source_equals_stream(msgs, workload)


def assert_source_equals_stream(msgs: list[StoredMsg], workload: Workload) -> None:
    """Replaying the stream gives every table of the workload, key by key and compared column by column."""
    for table in TABLES:
        lake = replay(msgs, workload.db, table)
        source = workload.snapshot(table)
        assert lake.keys() == source.keys(), f"{table}: keys differ"
        for key, row in source.items():
            for col in COMPARED[table]:
                expected = row[col] if isinstance(row[col], int) else str(row[col])
                assert lake[key][col] == expected, f"{table}[{key}].{col}"

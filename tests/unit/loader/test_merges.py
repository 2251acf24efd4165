"""services.loader.merges: the fold of a changelog tail into a current-state table, as SQL text (pure, no Spark).

What runs is checked against Iceberg in tests/integration/test_lake.py; here: identifiers are
quoted, the tail has its bounds, keys compare null-safe, keyless tables fold by whole rows.
"""

from __future__ import annotations

import re

import pytest

from services.loader.frames import PREV
from services.loader.merges import Fold, live_sql, merge_sql, tail_count_sql
from services.loader.naming import TableNames, quote

NAMES = TableNames("lake", "Shop", "order-items")
# Every odd column name carries an upper-case Q: no keyword or bookkeeping name of the SQL has one.
COLUMNS = {"Qk.ey": "int", "Qwe`ird": "string", "Qhas space": "bigint", "Qplain": "array<string>"}
KEY = ["Qk.ey", "Qwe`ird"]
QUOTED = re.compile(r"`(?:[^`]|``)*`")
AFTER_5_7 = "(_binlake_scn > 5 OR (_binlake_scn = 5 AND _binlake_seq > 7))"


def fold(key: list[str], upto: tuple[int, int] | None = None, current: str | None = None) -> Fold:
    return Fold(current or NAMES.current, NAMES.changelog, COLUMNS, key, (5, 7), upto)


def outside_quotes(sql: str) -> str:
    return QUOTED.sub("", sql)


BOTH = pytest.mark.parametrize("key", [KEY, []], ids=["keyed", "keyless"])
SQL = pytest.mark.parametrize("make", [merge_sql, live_sql, tail_count_sql], ids=["merge", "live", "tail"])


@BOTH
@SQL
def test_every_identifier_is_quoted(make, key):
    sql = make(fold(key))
    assert "Q" not in outside_quotes(sql)
    assert sql.count("`") % 2 == 0
    assert NAMES.changelog in sql
    if make is not tail_count_sql:
        assert NAMES.current in sql
        for c in COLUMNS:
            assert quote(c) in sql
        for c in key or COLUMNS:  # the before images it reads
            assert quote(PREV + c) in sql
    assert sql.count("(") == sql.count(")")


@BOTH
def test_only_the_before_images_the_fold_needs_are_read(key):
    sql = merge_sql(fold(key))
    read = {c for c in COLUMNS if quote(PREV + c) in sql}
    assert read == set(key or COLUMNS)


@BOTH
@SQL
def test_the_tail_starts_after_the_marker(make, key):
    sql = make(fold(key))
    ops = "'i', 'u', 'd', 'r'" if key else "'i', 'u', 'd', 'r', 'replace', 'replaced', 'abandoned'"  # snapshot marks
    assert f"WHERE _binlake_op IN ({ops}) AND {AFTER_5_7}" in sql
    assert "_binlake_scn <" not in sql and "_binlake_seq <" not in sql  # no upper bound


@BOTH
@SQL
def test_the_tail_ends_at_upto(make, key):
    sql = make(fold(key, upto=(9, 11)))
    assert f"{AFTER_5_7} AND (_binlake_scn < 9 OR (_binlake_scn = 9 AND _binlake_seq <= 11))" in sql


def test_merge_and_live_fold_the_same_tail():
    for key, name in ((KEY, "tail"), ([], "tail_all")):
        tail = re.search(rf"WITH {name} AS \((SELECT .*?)\)(?:, | SELECT)", merge_sql(fold(key)))
        assert tail is not None and f"{name} AS ({tail.group(1)})" in live_sql(fold(key))


def test_a_time_travel_relation_is_used_as_given():
    at = f"{NAMES.current} VERSION AS OF 123"
    for key in (KEY, []):
        assert f"FROM {at} c " in live_sql(fold(key, current=at))


# -- tables with a key ------------------------------------------------------------------------------


def test_keyed_merge_matches_keys_null_safe_and_never_updates_them():
    sql = merge_sql(fold(KEY))
    assert sql.startswith(f"MERGE INTO {NAMES.current} t USING (")
    assert ") s ON t.`Qk.ey` <=> s.`Qk.ey` AND t.`Qwe``ird` <=> s.`Qwe``ird` WHEN" in sql
    assert "WHEN MATCHED AND s._binlake_del THEN DELETE " in sql
    assert "WHEN MATCHED THEN UPDATE SET t.`Qhas space` = s.`Qhas space`, t.`Qplain` = s.`Qplain` " in sql
    assert ("WHEN NOT MATCHED AND NOT s._binlake_del THEN INSERT (`Qk.ey`, `Qwe``ird`, `Qhas space`, `Qplain`) "
            "VALUES (s.`Qk.ey`, s.`Qwe``ird`, s.`Qhas space`, s.`Qplain`)") in sql
    assert not re.search(r"`\s*=\s*[ts]\.`Q(k|we)", sql)  # no plain `=` between key columns


def test_keyed_fold_keeps_the_last_change_per_key_and_removes_moved_keys():
    sql = merge_sql(fold(KEY))
    assert ("row_number() OVER (PARTITION BY `Qk.ey`, `Qwe``ird` ORDER BY "
            "_binlake_scn DESC, _binlake_seq DESC, _binlake_row DESC, _binlake_sub DESC)") in sql
    assert "WHERE _binlake_rn = 1" in sql
    # an update that moved its key deletes the old key, just before (sub 0) its new image (sub 1)
    assert ("SELECT `_binlake_prev_Qk.ey` AS `Qk.ey`, `_binlake_prev_Qwe``ird` AS `Qwe``ird`, "
            "CAST(NULL AS bigint) AS `Qhas space`, CAST(NULL AS array<string>) AS `Qplain`, "
            "_binlake_scn, _binlake_seq, _binlake_row, 0 AS _binlake_sub, true AS _binlake_del FROM tail "
            "WHERE _binlake_op = 'u' AND `_binlake_prev_Qk.ey` IS NOT NULL") in sql
    assert "1 AS _binlake_sub, _binlake_op = 'd' AS _binlake_del FROM tail" in sql


def test_keyed_live_overlays_the_last_change_per_key():
    sql = live_sql(fold(KEY))
    assert (f"SELECT c.`Qk.ey`, c.`Qwe``ird`, c.`Qhas space`, c.`Qplain` FROM {NAMES.current} c "
            "LEFT ANTI JOIN last l ON c.`Qk.ey` <=> l.`Qk.ey` AND c.`Qwe``ird` <=> l.`Qwe``ird` "
            "UNION ALL SELECT `Qk.ey`, `Qwe``ird`, `Qhas space`, `Qplain` FROM last WHERE NOT _binlake_del") in sql


def test_a_table_of_key_columns_only_has_no_update_clause():
    f = Fold(NAMES.current, NAMES.changelog, {"Qa": "int", "Qb": "string"}, ["Qa", "Qb"], (0, 0))
    sql = merge_sql(f)
    assert "UPDATE SET" not in sql and "CAST(NULL" not in sql
    assert "SELECT `_binlake_prev_Qa` AS `Qa`, `_binlake_prev_Qb` AS `Qb`, _binlake_scn" in sql
    assert "WHEN MATCHED AND s._binlake_del THEN DELETE WHEN NOT MATCHED" in sql


# -- tables without a key ------------------------------------------------------------------------


ALL = "`Qk.ey`, `Qwe``ird`, `Qhas space`, `Qplain`"


def null_safe(left: str, right: str) -> str:
    return " AND ".join(f"{left}.{quote(c)} <=> {right}.{quote(c)}" for c in COLUMNS)


def test_keyless_fold_counts_whole_rows():
    sql = merge_sql(fold([]))
    assert f"GROUP BY {ALL} HAVING sum(_binlake_delta) <> 0" in sql
    assert f"SELECT {ALL}, 1 AS _binlake_delta FROM tail WHERE _binlake_op IN ('i', 'u', 'r')" in sql
    before = ", ".join(f"{quote(PREV + c)} AS {quote(c)}" for c in COLUMNS)
    assert f"SELECT {before}, -1 FROM tail WHERE _binlake_op = 'u'" in sql
    assert f"SELECT {ALL}, -1 FROM tail WHERE _binlake_op = 'd'" in sql
    c_all = ", ".join(f"c.{quote(c)}" for c in COLUMNS)
    assert (f"count(*) AS _binlake_n FROM base c LEFT SEMI JOIN deltas d ON {null_safe('c', 'd')} "
            f"GROUP BY {c_all})") in sql
    assert f"h ON {null_safe('d', 'h')})" in sql
    assert "row_number()" not in sql and "PARTITION BY" not in sql


def test_keyless_merge_replaces_every_copy_of_a_touched_row_null_safe():
    sql = merge_sql(fold([]))
    assert sql.startswith(f"MERGE INTO {NAMES.current} t USING (")
    assert f") s ON {null_safe('t', 's')} AND s._binlake_kind = 'del' WHEN MATCHED THEN DELETE " in sql
    values = ", ".join(f"s.{quote(c)}" for c in COLUMNS)
    assert f"WHEN NOT MATCHED AND s._binlake_kind = 'ins' THEN INSERT ({ALL}) VALUES ({values})" in sql
    assert "explode(array_repeat(1, CAST(greatest(_binlake_n, 0) AS INT)))" in sql
    assert "UPDATE SET" not in sql


def test_keyless_live_replaces_touched_rows_by_their_copies():
    sql = live_sql(fold([]))
    c_all = ", ".join(f"c.{quote(c)}" for c in COLUMNS)
    assert (f"SELECT {c_all} FROM base c LEFT ANTI JOIN deltas d ON {null_safe('c', 'd')} "
            f"UNION ALL SELECT {ALL} FROM wanted LATERAL VIEW explode(") in sql


def test_a_keyless_fold_starts_over_at_the_last_complete_replace():
    """The tail after the last `replace` whose next mark is its `replaced`, with `r` rows only of
    complete replaces (or before any); the current table counts only without a cut, and the merge
    deletes every row it holds after one. (What these fold to: test_lake.py, on Spark.)"""
    for sql in (merge_sql(fold([])), live_sql(fold([]))):
        assert ("marks AS (SELECT named_struct('s', _binlake_scn, 'q', _binlake_seq) AS at, _binlake_op AS op, "
                "lead(_binlake_op) OVER (ORDER BY _binlake_scn, _binlake_seq) AS next_op") in sql
        assert "WHERE _binlake_op IN ('replace', 'replaced', 'abandoned'))" in sql
        assert "complete AS (SELECT at AS began, next_at AS done FROM marks WHERE op = 'replace' " \
               "AND next_op = 'replaced')" in sql
        assert "cut AS (SELECT max(began) AS at FROM complete)" in sql
        assert "LEFT SEMI JOIN complete c ON k._binlake_op = 'r'" in sql
        assert f"base AS (SELECT {', '.join(f'c.{quote(c)}' for c in COLUMNS)} FROM {NAMES.current} c " \
               "WHERE NOT EXISTS (SELECT 1 FROM cut WHERE at IS NOT NULL))" in sql
    assert f"FROM {NAMES.current} c WHERE EXISTS (SELECT 1 FROM cut WHERE at IS NOT NULL)" in merge_sql(fold([]))
    assert "replace" not in merge_sql(fold(KEY)) + live_sql(fold(KEY))


def test_a_tail_known_to_hold_no_replace_folds_without_looking_for_one():
    f = Fold(NAMES.current, NAMES.changelog, COLUMNS, [], (5, 7), replacing=False)
    for sql in (merge_sql(f), live_sql(f)):
        assert "marks" not in sql and "CROSS JOIN" not in sql
        assert f"base AS (SELECT {', '.join(f'c.{quote(c)}' for c in COLUMNS)} FROM {NAMES.current} c)" in sql
    assert merge_sql(f).count(NAMES.current) == 2  # the MERGE's target and the counts of touched rows

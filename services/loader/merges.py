"""Pure: the SQL that folds a changelog tail into a current-state table, or overlays it.

The tail is the changelog rows after the current table's marker (source order key
`(scn, seq)`); it never crosses a DDL statement, because the loader merges before each one.
Changes are ordered by `(_binlake_scn, _binlake_seq, _binlake_row)`: source order, which also
holds across a RENAME TABLE (the CDC sequence alone does not: two tables' subjects are
routed independently).

Tables with a primary key: per key the last change wins (a delete removes the row); an
update that moved its key removes the old key just before it.

Tables without a key are multisets: the tail gives each distinct row a count delta (+1 per
insert and per update's after image, -1 per delete and per update's before image), and the
table then holds `count + delta` copies of that row. The MERGE deletes every copy of a
touched row and inserts the new number of copies, in one commit. A snapshot of a keyless table
is a `replace` row, its `r` rows, then a `replaced` row (the parser reads it in pages of one
consistent read, each page released by its own watermark window, so writes to the table go on
between them). A `replace` is complete when the next of these marks after it is a `replaced`.
From the last complete `replace` on, the table is what follows it (the snapshot's rows and the
changes after it), and the current table and every change before it are discarded (the MERGE
deletes every row it holds). The `r` rows of a `replace` not complete (still running, started
over by a later `replace`, or `abandoned` by a parser that failed the table) are left out, the
other changes count as without it; `r` rows before any `replace` (the snapshot created the lake
table) count. The loader does not merge a table while its last `replace` is open
(`LakeTable.replace_open`).

`merge_sql` is what the loader runs; `live_sql` is the same fold as a query (the `__live`
view, `binlake lake show`, `verify`, and time travel through `binlake lake as-of`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.loader.frames import OP, PREV, ROW, SEQ
from services.loader.naming import quote
from shared.envelope import REPLACE, REPLACED, SNAPSHOT_MARKS

SCN = "_binlake_scn"
DELETED = "_binlake_del"
KIND = "_binlake_kind"
_MARKS = ", ".join(f"'{op}'" for op in SNAPSHOT_MARKS)  # a keyless table's snapshot marks, as SQL


def _at(alias: str = "") -> str:
    """A changelog row's source order as one comparable value."""
    return f"named_struct('s', {alias}{SCN}, 'q', {alias}{SEQ})"


_AT = _at()


@dataclass(frozen=True)
class Fold:
    """One table's fold: the relations and the columns it works on."""

    current: str  # SQL relation of the current table (may carry VERSION AS OF)
    changelog: str  # SQL relation of the changelog
    columns: Mapping[str, str]  # the current table's columns -> Spark type, in order
    key: Sequence[str]  # primary key columns; () = no key
    after: tuple[int, int]  # the current table's marker: tail rows come after this (scn, seq)
    upto: tuple[int, int] | None = None  # and at or before this one (None: the whole tail)
    replacing: bool = True  # the tail may hold a keyless snapshot's `replace` (False: one scan less)


def _tail(f: Fold) -> str:
    scn, seq = f.after
    ops = "'i', 'u', 'd', 'r'" if f.key else f"'i', 'u', 'd', 'r', {_MARKS}"
    cond = [f"{OP} IN ({ops})", f"({SCN} > {scn} OR ({SCN} = {scn} AND {SEQ} > {seq}))"]
    if f.upto is not None:
        uscn, useq = f.upto
        cond.append(f"({SCN} < {uscn} OR ({SCN} = {uscn} AND {SEQ} <= {useq}))")
    return f"SELECT * FROM {f.changelog} WHERE {' AND '.join(cond)}"


def _cols(f: Fold, prefix: str = "") -> str:
    return ", ".join(f"{prefix}{quote(c)}" for c in f.columns)


def _null_safe(f: Fold, left: str, right: str, columns: Sequence[str]) -> str:
    return " AND ".join(f"{left}.{quote(c)} <=> {right}.{quote(c)}" for c in columns)


# -- tables with a key --------------------------------------------------------------------------


def _last_per_key(f: Fold) -> str:
    """The last change per key in the tail, with `_binlake_del` when it removes the row."""
    cols = _cols(f)
    moved_key = ", ".join(f"{quote(PREV + k)} AS {quote(k)}" for k in f.key)
    others = ", ".join(f"CAST(NULL AS {t}) AS {quote(c)}" for c, t in f.columns.items() if c not in f.key)
    moved = f"{moved_key}, {others}" if others else moved_key
    order = f"{SCN} DESC, {SEQ} DESC, {ROW} DESC, _binlake_sub DESC"
    keys = ", ".join(quote(k) for k in f.key)
    first = f.key[0]
    return (
        f"SELECT {cols}, {DELETED} FROM ("
        f"SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY {order}) AS _binlake_rn FROM ("
        f"SELECT {cols}, {SCN}, {SEQ}, {ROW}, 1 AS _binlake_sub, {OP} = 'd' AS {DELETED} FROM tail "
        f"UNION ALL SELECT {moved}, {SCN}, {SEQ}, {ROW}, 0 AS _binlake_sub, true AS {DELETED} FROM tail "
        f"WHERE {OP} = 'u' AND {quote(PREV + first)} IS NOT NULL"
        f")) WHERE _binlake_rn = 1"
    )


def _keyed_merge(f: Fold) -> str:
    on = _null_safe(f, "t", "s", f.key)
    sets = ", ".join(f"t.{quote(c)} = s.{quote(c)}" for c in f.columns if c not in f.key)
    update = f"WHEN MATCHED THEN UPDATE SET {sets} " if sets else ""
    return (
        f"MERGE INTO {f.current} t USING (WITH tail AS ({_tail(f)}) {_last_per_key(f)}) s ON {on} "
        f"WHEN MATCHED AND s.{DELETED} THEN DELETE {update}"
        f"WHEN NOT MATCHED AND NOT s.{DELETED} THEN INSERT ({_cols(f)}) VALUES ({_cols(f, 's.')})"
    )


def _keyed_live(f: Fold) -> str:
    cols = _cols(f)
    on = _null_safe(f, "c", "l", f.key)
    return (
        f"WITH tail AS ({_tail(f)}), last AS ({_last_per_key(f)}) "
        f"SELECT {_cols(f, 'c.')} FROM {f.current} c LEFT ANTI JOIN last l ON {on} "
        f"UNION ALL SELECT {cols} FROM last WHERE NOT {DELETED}"
    )


# -- tables without a key -------------------------------------------------------------------------


_CUT = "SELECT 1 FROM cut WHERE at IS NOT NULL"  # the tail replaces the current table


def _replaced(f: Fold) -> str:
    """CTEs `tail_all` (with the marks), `marks` (each with the next one), `complete` (the replaces
    whose next mark is a `replaced`: began, done), `cut` (the last complete replace, or NULL), `tail`
    (the changes after the cut, `r` rows only of complete replaces or before any replace) and `base`
    (the current table, empty when the tail replaces it)."""
    if not f.replacing:
        return f"tail AS ({_tail(f)}), base AS (SELECT {_cols(f, 'c.')} FROM {f.current} c)"
    order = f"{SCN}, {SEQ}"
    after_cut = f"(cut.at IS NULL OR {_AT} > cut.at)"
    k_at = _at("k.")
    return (
        f"tail_all AS ({_tail(f)}), "
        f"marks AS (SELECT {_AT} AS at, {OP} AS op, lead({OP}) OVER (ORDER BY {order}) AS next_op, "
        f"lead({_AT}) OVER (ORDER BY {order}) AS next_at FROM tail_all WHERE {OP} IN ({_MARKS})), "
        f"complete AS (SELECT at AS began, next_at AS done FROM marks WHERE op = '{REPLACE}' "
        f"AND next_op = '{REPLACED}'), "
        f"cut AS (SELECT max(began) AS at FROM complete), "
        f"first AS (SELECT min(at) AS at FROM marks WHERE op = '{REPLACE}'), "
        f"kept AS (SELECT t.* FROM tail_all t CROSS JOIN cut WHERE {after_cut}), "
        f"tail AS (SELECT * FROM kept WHERE {OP} IN ('i', 'u', 'd') "
        f"UNION ALL SELECT k.* FROM kept k CROSS JOIN first WHERE k.{OP} = 'r' "
        f"AND (first.at IS NULL OR {k_at} < first.at) "
        f"UNION ALL SELECT k.* FROM kept k LEFT SEMI JOIN complete c ON k.{OP} = 'r' "
        f"AND {k_at} > c.began AND {k_at} < c.done), "
        f"base AS (SELECT {_cols(f, 'c.')} FROM {f.current} c WHERE NOT EXISTS ({_CUT}))"
    )


def _deltas(f: Fold) -> str:
    cols = _cols(f)
    before = ", ".join(f"{quote(PREV + c)} AS {quote(c)}" for c in f.columns)
    return (
        f"SELECT {cols}, sum(_binlake_delta) AS _binlake_delta FROM ("
        f"SELECT {cols}, 1 AS _binlake_delta FROM tail WHERE {OP} IN ('i', 'u', 'r') "
        f"UNION ALL SELECT {before}, -1 FROM tail WHERE {OP} = 'u' "
        f"UNION ALL SELECT {cols}, -1 FROM tail WHERE {OP} = 'd'"
        f") GROUP BY {cols} HAVING sum(_binlake_delta) <> 0"
    )


def _wanted(f: Fold) -> str:
    """Touched rows with the number of copies the table must hold of each."""
    cols = list(f.columns)
    have = (f"SELECT {_cols(f, 'c.')}, count(*) AS _binlake_n FROM base c LEFT SEMI JOIN deltas d "
            f"ON {_null_safe(f, 'c', 'd', cols)} GROUP BY {_cols(f, 'c.')}")
    return (
        f"SELECT {_cols(f, 'd.')}, coalesce(h._binlake_n, 0) + d._binlake_delta AS _binlake_n "
        f"FROM deltas d LEFT JOIN ({have}) h ON {_null_safe(f, 'd', 'h', cols)}"
    )


def _copies(relation: str, f: Fold) -> str:
    return (f"SELECT {_cols(f)} FROM {relation} "
            f"LATERAL VIEW explode(array_repeat(1, CAST(greatest(_binlake_n, 0) AS INT))) _binlake_e AS _binlake_one")


def _keyless_merge(f: Fold) -> str:
    cols = list(f.columns)
    # Rows to delete every copy of: the touched ones, and after a replace every row the table holds.
    gone = (f"SELECT DISTINCT {_cols(f)} FROM (SELECT {_cols(f)} FROM wanted "
            f"UNION ALL SELECT {_cols(f, 'c.')} FROM {f.current} c WHERE EXISTS ({_CUT}))"
            if f.replacing else f"SELECT {_cols(f)} FROM wanted")
    source = (
        f"WITH {_replaced(f)}, deltas AS ({_deltas(f)}), wanted AS ({_wanted(f)}) "
        f"SELECT *, 'del' AS {KIND} FROM ({gone}) "
        f"UNION ALL SELECT *, 'ins' AS {KIND} FROM ({_copies('wanted', f)})"
    )
    return (
        f"MERGE INTO {f.current} t USING ({source}) s ON {_null_safe(f, 't', 's', cols)} AND s.{KIND} = 'del' "
        f"WHEN MATCHED THEN DELETE "
        f"WHEN NOT MATCHED AND s.{KIND} = 'ins' THEN INSERT ({_cols(f)}) VALUES ({_cols(f, 's.')})"
    )


def _keyless_live(f: Fold) -> str:
    cols = list(f.columns)
    return (
        f"WITH {_replaced(f)}, deltas AS ({_deltas(f)}), wanted AS ({_wanted(f)}) "
        f"SELECT {_cols(f, 'c.')} FROM base c LEFT ANTI JOIN deltas d ON {_null_safe(f, 'c', 'd', cols)} "
        f"UNION ALL {_copies('wanted', f)}"
    )


# -- entry points ---------------------------------------------------------------------------------


def merge_sql(f: Fold) -> str:
    """MERGE INTO the current table: fold the tail in (one commit)."""
    return _keyed_merge(f) if f.key else _keyless_merge(f)


def live_sql(f: Fold) -> str:
    """A query of the current table with the tail folded in."""
    return _keyed_live(f) if f.key else _keyless_live(f)


def open_replace_sql(f: Fold) -> str:
    """The op of the tail's last snapshot mark (none: no row)."""
    return (f"SELECT {OP} FROM ({_tail(f)}) WHERE {OP} IN ({_MARKS}) "
            f"ORDER BY {SCN} DESC, {SEQ} DESC LIMIT 1")


def tail_count_sql(f: Fold) -> str:
    return f"SELECT count(*) FROM ({_tail(f)})"

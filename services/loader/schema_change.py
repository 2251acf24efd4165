"""DDL in the lake: apply the parser's structured `alter` description to a lake table.

| source statement | changelog | current-state table |
|---|---|---|
| CREATE TABLE | created (or kept, after a DROP) | created; after a DROP it takes the new columns |
| ADD COLUMN | column added | column added; existing rows get the DEFAULT (an expression default: re-snapshot) |
| DROP COLUMN | kept (history) | column dropped |
| RENAME COLUMN / CHANGE a b | renamed | renamed (Iceberg rename: files untouched) |
| MODIFY type | promoted, or old column set aside as `_binlake_was_<seq>_<c>` | promoted, or cast + re-snapshot |
| MODIFY keeping the lake type (precision, length, members, charset) | - | re-snapshot |
| DROP/TRUNCATE/EXCHANGE PARTITION | - | emptied + re-snapshot (both tables of an exchange) |
| CONVERT TO CHARACTER SET | - | re-snapshot |
| ADD / DROP PRIMARY KEY | - | key changes (tables without a key are multisets) |
| TRUNCATE / DROP TABLE | DDL row, history kept | emptied |
| RENAME TABLE | both tables renamed (lake.Lake handles the ordering) | |

Every statement also becomes a row of the changelog (`_binlake_op = 'ddl'`). Each step is
idempotent (checked against the tables) or guarded by the current table's marker, so a
kill in the middle and a redelivery finish it exactly once. A re-snapshot is recorded
durably before the statement's commit (`services.loader.resnapshots`); the parser reads the
table after the statement, through its watermark windows, so later changes are kept once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import structlog

from services.loader.frames import PREV, Ddl
from services.loader.iceberg import Marker
from services.loader.naming import quote, sql_string
from services.loader.tables import LakeTable, data_types
from services.loader.types import promotable, spark_type

if TYPE_CHECKING:
    from services.loader.lake import Lake

log = structlog.get_logger()
CASE_TMP = "_binlake_case_"  # a column between two names that differ in case only
_COLUMN_OPS = frozenset({"add", "drop", "rename", "modify", "primary_key", "drop_primary_key"})


def apply(lake: Lake, db: str, name: str, table: LakeTable | None, step: Ddl, batch: int) -> LakeTable | None:
    """Apply one DDL statement to the lake table of `db.name` (None: nothing to apply to yet)."""
    alter = step.alter
    kind = alter.get("kind")
    base = table.appended.batch if table is not None else 0
    marker = Marker(int(step.env["scn"]), step.seq, max(batch, base))
    if kind == "create":
        return _create(lake, db, name, table, alter, marker)
    if kind == "alter":
        _reload(lake, db, name, table, alter, marker)
    if table is None:
        return None  # a table the lake has not seen rows of: its first rows create it
    if kind in ("drop", "truncate"):
        _empty(lake, table, marker)
        if kind == "drop":
            table.mark_dropped(lake.ice, True)
    elif kind == "alter":
        ops = [op for op in alter.get("ops") or [] if op.get("op") in _COLUMN_OPS]
        if ops:
            lake.flush(table, batch)
            _alter(lake, table, ops, marker)
    return table


def _reload(lake: Lake, db: str, name: str, table: LakeTable | None, alter: Mapping[str, Any],
            marker: Marker) -> None:
    """A statement that changed rows without row events: read the table again (emptied first when
    rows may be gone: a snapshot only upserts)."""
    reloads = [op for op in alter.get("ops") or [] if op.get("op") == "reload"]
    if not reloads or not lake.include(db, name):
        return
    what = ", ".join(str(op["what"]) for op in reloads)
    lake.request_resnapshot(db, name, f"{what} changed rows without row events", marker.order)
    if table is not None and any(op.get("removes") for op in reloads):
        _empty(lake, table, marker)


def _create(lake: Lake, db: str, name: str, table: LakeTable | None, alter: Mapping[str, Any],
            marker: Marker) -> LakeTable | None:
    columns: list[Mapping[str, Any]] = list(alter.get("columns") or [])
    known = alter.get("columns") is not None and all("unknown" not in c for c in columns)
    key = list(alter.get("pk") or [])
    if table is None:
        return lake._create(db, name, columns, key) if known else None
    if alter.get("if_not_exists") and not table.dropped:
        return table  # the table existed: MySQL logged the statement all the same, and it changed nothing
    # Re-created after a DROP TABLE: the current table is empty; it takes the new columns.
    _empty(lake, table, marker)
    table.mark_dropped(lake.ice, False)
    if known:
        wanted = data_types(columns)
        for old in [c for c in table.columns if c not in wanted]:
            lake.ice.drop_column(table.names.current, old)
            del table.columns[old]
        for col, kind in wanted.items():
            if table.columns.get(col) not in (None, kind):
                lake.ice.drop_column(table.names.current, col)
                del table.columns[col]
            table.add_column(lake.ice, col, kind)
        if list(table.columns) != list(wanted):
            previous: str | None = None
            for col in wanted:
                lake.ice.move_after(table.names.current, col, previous)
                previous = col
            table.columns = {c: table.columns[c] for c in wanted}
        table.set_key(lake.ice, key)
    return table


def _empty(lake: Lake, table: LakeTable, marker: Marker) -> None:
    if table.merged.order < marker.order:
        lake.ice.run_marked(marker, f"DELETE FROM {table.names.current}")
        table.merged = marker
    table.tail_rows, table.tail_since = 0, None
    table.replacing = table.replace_open = False  # a snapshot running now is superseded (the parser begins again)


def _alter(lake: Lake, table: LakeTable, ops: list[Mapping[str, Any]], marker: Marker) -> None:
    sets: dict[str, str] = {}  # current-table column -> SQL expression, run as ONE update
    swaps: list[tuple[str, str]] = []  # (temporary column, final name) after the update
    for op in ops:
        kind = op["op"]
        if kind == "add":
            _add(lake, table, op, sets, marker)
        elif kind == "drop":
            _drop(lake, table, str(op["name"]))
        elif kind == "rename":
            _rename(lake, table, str(op["old"]), str(op["new"]))
        elif kind == "modify":
            _modify(lake, table, op, sets, swaps, marker)
        elif kind == "primary_key":
            table.set_key(lake.ice, [str(c) for c in op["columns"]])
        elif kind == "drop_primary_key":
            table.set_key(lake.ice, [])
    if table.merged.order < marker.order:
        if _rewrite(lake, table, sets, swaps, marker):
            table.merged = marker
    else:
        _rewrite(lake, table, {}, swaps, marker)


def _rewrite(lake: Lake, table: LakeTable, sets: dict[str, str], swaps: list[tuple[str, str]],
             marker: Marker) -> bool:
    """One UPDATE of the current table (defaults, casts), then the rewritten columns swapped in."""
    if sets:
        assignments = ", ".join(f"{quote(c)} = {e}" for c, e in sets.items())
        lake.ice.run_marked(marker, f"UPDATE {table.names.current} SET {assignments}")
    for tmp, final in swaps:
        _swap(lake, table, tmp, final)
    return bool(sets)


def _column(table: LakeTable, op: Mapping[str, Any]) -> tuple[dict[str, Any], str, str] | None:
    """(column, name, Spark type) of an add/modify op; None (logged) for a type the lake cannot hold."""
    if "unknown" in op:
        log.error("lake.unsupported_column", table=f"{table.names.db}.{table.names.table}", column=op.get("name"),
                  type=op["unknown"])
        return None
    col = dict(op["column"])
    return col, str(col["name"]), spark_type(col)


def _add(lake: Lake, table: LakeTable, op: Mapping[str, Any], sets: dict[str, str], marker: Marker) -> None:
    found = _column(table, op)
    if found is None:
        return
    _, name, kind = found
    fresh = name not in table.columns
    table.add_column(lake.ice, name, kind)  # (again after a kill: the default update below is marker-guarded)
    if fresh and (op.get("first") or op.get("after")):
        after = op.get("after")
        if after is None or after in table.columns:
            lake.ice.move_after(table.names.current, name, None if op.get("first") else str(after))
    if "default_expr" in op:
        _inexact(lake, table, f"ADD COLUMN {name} with the expression default {op['default_expr']}", marker)
    elif op.get("default") is not None:
        sets[name] = literal(op["default"], kind)


def _drop(lake: Lake, table: LakeTable, name: str) -> None:
    if name in table.columns:
        if name in table.key:
            table.set_key(lake.ice, [k for k in table.key if k != name])
        lake.ice.drop_column(table.names.current, name)
        del table.columns[name]


def _rename(lake: Lake, table: LakeTable, old: str, new: str) -> None:
    if old == new:
        return
    ice = lake.ice
    if (old in table.columns and new not in table.columns) or CASE_TMP + new in table.columns:
        table.columns = _rename_column(lake, table.names.current, table.columns, old, new)
    for src, dst in ((old, new), (PREV + old, PREV + new)):
        if src in table.changelog_columns or CASE_TMP + dst in table.changelog_columns:
            table.make_room(ice, dst, keep=src)  # an older column of that name: aside
            table.changelog_columns = _rename_column(lake, table.names.changelog, table.changelog_columns, src, dst)
    if old in table.key:
        table.set_key(ice, [new if k == old else k for k in table.key])


def _rename_column(lake: Lake, ident: str, columns: dict[str, str], src: str, dst: str) -> dict[str, str]:
    """Rename a column; the new `columns`. Spark compares column names without case, so a change
    of case only goes through a temporary name (where a kill in between leaves it: finished here)."""
    tmp = CASE_TMP + dst
    if src.lower() == dst.lower() and src in columns:
        lake.ice.rename_column(ident, src, tmp)
        columns = {(tmp if c == src else c): t for c, t in columns.items()}
        src = tmp
    elif tmp in columns:
        src = tmp
    lake.ice.rename_column(ident, src, dst)
    return {(dst if c == src else c): t for c, t in columns.items()}


def _modify(lake: Lake, table: LakeTable, op: Mapping[str, Any], sets: dict[str, str],
            swaps: list[tuple[str, str]], marker: Marker) -> None:
    found = _column(table, op)
    if found is None:
        return
    col, new, kind = found
    done = table.merged.order >= marker.order
    before = table.source_columns.get(str(op["old"]))
    tmp = f"_binlake_new_{new}"
    _rename(lake, table, str(op["old"]), new)
    if tmp in table.columns:  # a rewrite a kill interrupted
        if new not in table.columns or done:
            swaps.append((tmp, new))  # its values are in: only the swap was left
            return
        lake.ice.drop_column(table.names.current, tmp)
        del table.columns[tmp]
    if new not in table.columns:
        table.add_column(lake.ice, new, kind)
    elif table.columns[new] != kind:
        _retype(lake, table, new, kind, sets, swaps, marker)
    elif converts(before, col):
        _inexact(lake, table, f"column {new} changed from {_shown(before)} to {_shown(col)}; the source "
                              "converted its values", marker)
    if op.get("default") is not None and not col.get("nullable", True) and new in table.columns:
        target = tmp if (tmp, new) in swaps else new
        base = sets.get(target, quote(new))
        sets[target] = f"coalesce({base}, {literal(op['default'], kind)})"


def converts(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> bool:
    """Whether a MODIFY from column `before` (None: not known) to `after` may change stored values:
    any other precision, length, members or charset, or NULL no longer allowed."""
    if before is None:
        return True
    shape = {k: v for k, v in before.items() if k not in ("name", "nullable")}
    if shape != {k: v for k, v in after.items() if k not in ("name", "nullable")}:
        return True
    return bool(before.get("nullable", True)) and not after.get("nullable", True)


def _shown(col: Mapping[str, Any] | None) -> str:
    return "an unknown type" if col is None else str({k: v for k, v in col.items() if k != "name"})


def _retype(lake: Lake, table: LakeTable, name: str, kind: str, sets: dict[str, str],
            swaps: list[tuple[str, str]], marker: Marker) -> None:
    ice = lake.ice
    old = table.columns[name]
    if promotable(old, kind):
        ice.promote(table.names.current, name, kind)
        table.columns[name] = kind
        for col in (name, PREV + name):
            if table.changelog_columns.get(col) == old:
                ice.promote(table.names.changelog, col, kind)
                table.changelog_columns[col] = kind
        return
    tmp = f"_binlake_new_{name}"
    ice.add_columns(table.names.current, {tmp: kind})
    table.columns[tmp] = kind
    sets[tmp] = f"CAST({quote(name)} AS {kind})"
    swaps.append((tmp, name))
    table._changelog_column(ice, name, kind)
    _inexact(lake, table, f"column {name} changed type {old} -> {kind}; values were cast by Spark", marker)


def _swap(lake: Lake, table: LakeTable, tmp: str, final: str) -> None:
    """Replace `final` by the rewritten `tmp`, at `final`'s place."""
    ice = lake.ice
    names = [c for c in table.columns if c != tmp]
    place = names.index(final) if final in names else len(names)
    if final in table.columns:
        ice.drop_column(table.names.current, final)
    ice.rename_column(table.names.current, tmp, final)
    kind = table.columns.pop(tmp)
    table.columns.pop(final, None)
    order = [c for c in names if c != final]
    order.insert(place, final)
    ice.move_after(table.names.current, final, order[place - 1] if place > 0 else None)
    table.columns = {c: (kind if c == final else table.columns[c]) for c in order}
    table.ensure_prev(ice)


def retype(lake: Lake, table: LakeTable, name: str, kind: str, marker: Marker) -> None:
    """A column's type changed without a DDL the loader saw: promote, or rewrite now."""
    sets: dict[str, str] = {}
    swaps: list[tuple[str, str]] = []
    _retype(lake, table, name, kind, sets, swaps, marker)
    _rewrite(lake, table, sets, swaps, marker)


def _inexact(lake: Lake, table: LakeTable, why: str, marker: Marker) -> None:
    lake.request_resnapshot(table.names.db, table.names.table, why, marker.order)


def literal(value: Any, kind: str) -> str:
    """A Spark SQL literal of an envelope value for a column of Spark type `kind`."""
    if value is None:
        return f"CAST(NULL AS {kind})"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, list):
        items = ", ".join(literal(v, "string") for v in value)
        return f"CAST(array({items}) AS array<string>)" if value else "CAST(array() AS array<string>)"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = repr(float(value)) if isinstance(value, float) else str(value)
        return f"CAST({text} AS {kind})" if kind != "string" else sql_string(text)
    if isinstance(value, (dt.date, dt.datetime)):
        value = value.isoformat()
    text = str(value)
    if kind == "timestamp" and text.endswith("Z"):
        return f"CAST({sql_string(text[:-1])} AS timestamp)"
    return f"CAST({sql_string(text)} AS {kind})"


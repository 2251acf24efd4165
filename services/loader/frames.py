"""Pure (Arrow only): a batch of envelopes -> per table, an ordered list of steps.

A step is a `Rows` run (row changes between two DDL statements of that table, in
segments of one schema version each), a `Ddl` (one DDL envelope with the parser's
structured `alter` description) or a `Replace` (a keyless table's snapshot begins). The
loader appends each run to the table's changelog and applies each DDL in between, so
schema changes keep their place among the rows.

A changelog row is one row change: bookkeeping columns (`_binlake_op`, `_binlake_seq` the
CDC sequence, `_binlake_row` the row's index in its event, `_binlake_scn`, `_binlake_ts`,
`_binlake_pos`, `_binlake_gtid`, `_binlake_ddl`) plus the table's columns (the after
image; the before image for a delete) plus `_binlake_prev_<column>` for the before image
the current-state table needs: the old key of an update that moved its primary key, and the
whole old row of an update of a table without a key (which removes one matching row).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from services.loader.naming import lake_column, reserved_column
from services.loader.types import to_array
from shared.envelope import ROW_OPS, SNAPSHOT_MARKS

BOOK_PREFIX = "_binlake_"
PREV = "_binlake_prev_"
OP, SEQ, ROW, DDL_TEXT = "_binlake_op", "_binlake_seq", "_binlake_row", "_binlake_ddl"
BOOKKEEPING = pa.schema([
    (OP, pa.string()), (SEQ, pa.int64()), (ROW, pa.int32()), ("_binlake_scn", pa.int64()),
    ("_binlake_ts", pa.timestamp("ms", tz="UTC")), ("_binlake_pos", pa.string()), ("_binlake_gtid", pa.string()),
    (DDL_TEXT, pa.string()),
])


@dataclass
class Segment:
    """Rows of one schema version."""

    columns: list[dict[str, Any]]
    prev: list[str]  # the columns whose before image is kept (key columns, or all of a keyless table)
    book: dict[str, list[Any]] = field(default_factory=lambda: {f.name: [] for f in BOOKKEEPING})
    values: dict[str, list[Any]] = field(default_factory=dict)
    prev_values: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.values = {c["name"]: [] for c in self.columns}
        self.prev_values = {k: [] for k in self.prev}

    @property
    def rows(self) -> int:
        return len(self.book[OP])

    def to_arrow(self) -> pa.Table:
        arrays = [pa.array(self.book[f.name], f.type) for f in BOOKKEEPING]
        names = [f.name for f in BOOKKEEPING]
        by_name = {c["name"]: c for c in self.columns}
        for col in self.columns:
            arrays.append(to_array(self.values[col["name"]], col))
            names.append(col["name"])
        for name in self.prev:
            arrays.append(to_array(self.prev_values[name], by_name[name]))
            names.append(PREV + name)
        return pa.table(arrays, names=names)


@dataclass
class Rows:
    """Row changes of one table between DDL statements, in order."""

    pk: list[str] = field(default_factory=list)
    segments: list[tuple[str, Segment]] = field(default_factory=list)  # (schema id, rows)
    _arrow: list[pa.Table] | None = field(default=None, repr=False, compare=False)

    @property
    def rows(self) -> int:
        return sum(s.rows for _, s in self.segments)

    @property
    def last_seq(self) -> int:
        return int(self.segments[-1][1].book[SEQ][-1])

    @property
    def columns(self) -> list[dict[str, Any]]:
        """The newest schema's columns."""
        return self.segments[-1][1].columns

    def arrow_segments(self) -> list[pa.Table]:
        """The segments as Arrow tables (built once: `prepare` builds them ahead of the write)."""
        if self._arrow is None:
            self._arrow = [seg.to_arrow() for _, seg in self.segments]
        return self._arrow


@dataclass(frozen=True)
class Ddl:
    seq: int
    env: dict[str, Any]

    @property
    def sql(self) -> str:
        return str(self.env.get("ddl") or "")

    @property
    def alter(self) -> dict[str, Any]:
        return dict(self.env.get("alter") or {"kind": "other", "ops": [], "renames": []})


@dataclass(frozen=True)
class Replace:
    """A keyless table's snapshot begins (`replace`: the fold discards the table's rows before it),
    is complete (`replaced`: its rows may be merged) or will not complete (`abandoned`)."""

    seq: int
    env: dict[str, Any]

    @property
    def op(self) -> str:
        return str(self.env["op"])


Step = Rows | Ddl | Replace


@dataclass
class TableChanges:
    db: str
    table: str
    steps: list[Step] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.steps if isinstance(s, Rows))


@dataclass(frozen=True)
class Prepared:
    """A unit's events, grouped by table with every run already in Arrow."""

    events: list[tuple[int, dict[str, Any]]]
    tables: dict[tuple[str, str], TableChanges]


def prepare(events: Iterable[tuple[int, dict[str, Any]]]) -> Prepared:
    """`group` plus the Arrow of every run: the Python half of a write, which can run ahead of Spark."""
    listed = list(events)
    tables = group(listed)
    for changes in tables.values():
        for step in changes.steps:
            if isinstance(step, Rows):
                step.arrow_segments()
    return Prepared(listed, tables)


def group(events: Iterable[tuple[int, dict[str, Any]]]) -> dict[tuple[str, str], TableChanges]:
    """Group (CDC sequence, envelope) pairs of a batch by table, in order."""
    out: dict[tuple[str, str], TableChanges] = {}
    for seq, env in events:
        op, db, table = env["op"], env.get("db"), env.get("table")
        if table is None or op not in ROW_OPS | {"ddl", *SNAPSHOT_MARKS}:
            continue
        changes = out.setdefault((db or "", table), TableChanges(db or "", table))
        env = lake_columns(env)
        if op in SNAPSHOT_MARKS:
            changes.steps.append(Replace(seq, env))
            continue
        if op == "ddl":
            changes.steps.append(Ddl(seq, env))
            continue
        if not changes.steps or not isinstance(changes.steps[-1], Rows):
            changes.steps.append(Rows())
        run = changes.steps[-1]
        assert isinstance(run, Rows)
        pk = list(env.get("pk") or [])
        schema = env["schema"]
        sid = f"{schema.get('id', '')}/{','.join(pk)}"
        if not run.segments or run.segments[-1][0] != sid:
            columns = list(schema["columns"])
            run.segments.append((sid, Segment(columns, pk or [c["name"] for c in columns])))
        run.pk = pk
        _add_rows(run.segments[-1][1], pk, seq, env)
    return out


def lake_columns(env: dict[str, Any]) -> dict[str, Any]:
    """The envelope with its columns under their lake names (`naming.lake_column`); itself when
    no column of it is renamed."""
    alter = env.get("alter") if isinstance(env.get("alter"), dict) else None
    names = [c["name"] for c in (env.get("schema") or {}).get("columns") or []]
    if alter is not None:
        names += [c["name"] for c in alter.get("columns") or []]
        for op in alter.get("ops") or []:
            names += [str(op[k]) for k in ("name", "old", "new", "after") if op.get(k) is not None]
            names += [op["column"]["name"]] if isinstance(op.get("column"), dict) else []
    if not any(reserved_column(str(n)) for n in names):
        return env
    out = dict(env)
    if isinstance(env.get("schema"), dict):
        out["schema"] = {**env["schema"], "columns": [_named(c) for c in env["schema"].get("columns") or []]}
    if env.get("pk"):
        out["pk"] = [lake_column(k) for k in env["pk"]]
    if env.get("rows"):
        out["rows"] = [{side: None if image is None else {lake_column(k): v for k, v in image.items()}
                        for side, image in row.items()} for row in env["rows"]]
    if alter is not None:
        out["alter"] = _alter_names(alter)
    return out


def _named(column: dict[str, Any]) -> dict[str, Any]:
    return {**column, "name": lake_column(str(column["name"]))}


def _alter_names(alter: dict[str, Any]) -> dict[str, Any]:
    out = dict(alter)
    if alter.get("columns") is not None:
        out["columns"] = [_named(c) for c in alter["columns"]]
    if alter.get("pk") is not None:
        out["pk"] = [lake_column(k) for k in alter["pk"]]
    ops = []
    for op in alter.get("ops") or []:
        renamed: dict[str, Any] = {k: lake_column(str(op[k])) for k in ("name", "old", "new", "after")
                                   if op.get(k) is not None}
        if isinstance(op.get("column"), dict):
            renamed["column"] = _named(op["column"])
        if op.get("op") == "primary_key":
            renamed["columns"] = [lake_column(c) for c in op.get("columns") or []]
        ops.append({**op, **renamed})
    if "ops" in alter:
        out["ops"] = ops
    return out


def _add_rows(seg: Segment, pk: list[str], seq: int, env: dict[str, Any]) -> None:
    pos = env.get("pos") or {}
    op = env["op"]
    book = seg.book
    where = f"{pos.get('file')}:{pos.get('offset')}"
    for i, row in enumerate(env["rows"]):
        image = row["before"] if op == "d" else row["after"]
        book[OP].append(op)
        book[SEQ].append(seq)
        book[ROW].append(i)
        book["_binlake_scn"].append(env["scn"])
        book["_binlake_ts"].append(env["ts"])
        book["_binlake_pos"].append(where)
        book["_binlake_gtid"].append(pos.get("gtid"))
        book[DDL_TEXT].append(None)
        for name, values in seg.values.items():
            values.append(image.get(name))
        before = row.get("before") if op == "u" else None
        # Keyed: the old key only when the update moved it. Keyless: the whole old row.
        keep = before is not None and (not pk or any(before.get(k) != image.get(k) for k in pk))
        for k, values in seg.prev_values.items():
            values.append(before.get(k) if keep and before is not None else None)

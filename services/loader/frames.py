"""Pure (Arrow only): a batch of envelopes -> per-table changelog segments, columnar.

Each changelog row is one row change: bookkeeping columns (`_op`, `_seq` the CDC sequence,
`_row` the row's index in its event, `_scn`, `_ts`, `_pos`, `_gtid`) plus the table's
columns (the after image; the before image for a delete). A segment holds the rows of one
schema version, so an ALTER in the middle of a batch just starts a new segment. Updates
that change the primary key also carry the old key (`_prev_key_*`) so the snapshot can
remove it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from services.loader.types import to_array

ROW_OPS = frozenset({"i", "u", "d", "r"})
_RESETS = re.compile(r"^\s*(?:DROP\s+(?:TEMPORARY\s+)?TABLE|TRUNCATE)\b", re.I)
_NAME = r"`(?:[^`]|``)+`|[\w$]+"
_RENAME_COLUMN = re.compile(rf"\bRENAME\s+COLUMN\s+({_NAME})\s+TO\s+({_NAME})", re.I)
_CHANGE_COLUMN = re.compile(rf"\bCHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_NAME})\s+({_NAME})", re.I)


def column_renames(ddl: str) -> list[tuple[str, str]]:
    """(old, new) column names an ALTER TABLE renames."""
    def plain(name: str) -> str:
        return name[1:-1].replace("``", "`") if name.startswith("`") else name

    found = _RENAME_COLUMN.findall(ddl) + _CHANGE_COLUMN.findall(ddl)
    return [(plain(a), plain(b)) for a, b in found if plain(a) != plain(b)]
BOOKKEEPING = pa.schema([
    ("_op", pa.string()), ("_seq", pa.int64()), ("_row", pa.int32()), ("_scn", pa.int64()),
    ("_ts", pa.timestamp("ms", tz="UTC")), ("_pos", pa.string()), ("_gtid", pa.string()),
])
PREV_KEY = "_prev_key_"


@dataclass
class Segment:
    columns: list[dict[str, Any]]
    book: dict[str, list[Any]] = field(default_factory=lambda: {f.name: [] for f in BOOKKEEPING})
    values: dict[str, list[Any]] = field(default_factory=dict)
    prev_keys: dict[str, list[Any]] = field(default_factory=dict)

    def to_arrow(self) -> pa.Table:
        arrays = [pa.array(self.book[f.name], f.type) for f in BOOKKEEPING]
        names = [f.name for f in BOOKKEEPING]
        for col in self.columns:
            arrays.append(to_array(self.values[col["name"]], col))
            names.append(col["name"])
        for name in self.prev_keys:  # this segment's own key (a batch may hold a primary key change)
            col = next(c for c in self.columns if c["name"] == name)
            arrays.append(to_array(self.prev_keys[name], col))
            names.append(PREV_KEY + name)
        return pa.table(arrays, names=names)


@dataclass
class TableChanges:
    db: str
    table: str
    pk: list[str] = field(default_factory=list)
    columns: list[dict[str, Any]] = field(default_factory=list)  # the newest schema seen
    segments: list[tuple[str, Segment]] = field(default_factory=list)  # (schema id, segment)
    ddl: list[tuple[int, str]] = field(default_factory=list)
    reset_seq: int = 0  # a DROP/TRUNCATE at this CDC sequence empties the snapshot
    renames: list[tuple[str, str]] = field(default_factory=list)  # column renames, in order

    @property
    def rows(self) -> int:
        return sum(len(s.book["_op"]) for _, s in self.segments)

    def arrow_segments(self) -> list[pa.Table]:
        return [seg.to_arrow() for _, seg in self.segments]


def _segment(changes: TableChanges, schema: dict[str, Any]) -> Segment:
    sid = str(schema.get("id", ""))
    if not changes.segments or changes.segments[-1][0] != sid:
        seg = Segment(list(schema["columns"]))
        seg.values = {c["name"]: [] for c in seg.columns}
        seg.prev_keys = {k: [] for k in changes.pk}
        changes.segments.append((sid, seg))
    return changes.segments[-1][1]


def group(events: Iterable[tuple[int, dict[str, Any]]]) -> dict[tuple[str, str], TableChanges]:
    """Group (CDC sequence, envelope) pairs of a batch by table, in order."""
    out: dict[tuple[str, str], TableChanges] = {}
    for seq, env in events:
        op, db, table = env["op"], env.get("db"), env.get("table")
        if table is None or op not in ROW_OPS | {"ddl"}:
            continue
        changes = out.setdefault((db or "", table), TableChanges(db or "", table))
        if op == "ddl":
            changes.ddl.append((seq, env.get("ddl") or ""))
            if _RESETS.match(env.get("ddl") or ""):
                changes.reset_seq = seq
            changes.renames += column_renames(env.get("ddl") or "")
            continue
        schema = env["schema"]
        changes.pk = list(env.get("pk") or [])
        changes.columns = list(schema["columns"])
        _add_rows(_segment(changes, schema), changes.pk, seq, env)
    return out


def _add_rows(seg: Segment, pk: list[str], seq: int, env: dict[str, Any]) -> None:
    pos = env.get("pos") or {}
    op = env["op"]
    for i, row in enumerate(env["rows"]):
        image = row["before"] if op == "d" else row["after"]
        book = seg.book
        book["_op"].append(op)
        book["_seq"].append(seq)
        book["_row"].append(i)
        book["_scn"].append(env["scn"])
        book["_ts"].append(env["ts"])
        book["_pos"].append(f"{pos.get('file')}:{pos.get('offset')}")
        book["_gtid"].append(pos.get("gtid"))
        for name, values in seg.values.items():
            values.append(image.get(name))
        before = row.get("before") if op == "u" else None
        moved = before is not None and any(before.get(k) != image.get(k) for k in pk)
        for k in pk:
            seg.prev_keys[k].append(before.get(k) if moved and before is not None else None)

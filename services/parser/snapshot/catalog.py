"""What the snapshot needs to know about a source table, read from information_schema.

`describe` builds the table's `TableSchema` with the same `build_column` the binlog path
uses, so rows read by SELECT carry the schema id of rows decoded from the binlog. It also
picks the chunking key: the primary key, else the first unique key of NOT NULL columns,
else none (the table is then read whole, in one window).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from services.parser import values as v
from services.parser.columns import Column, TableSchema, build_column
from shared.mysql import mysql_quote as quote
from shared.mysql_types import BINARIES

SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})

_CODES = {
    "tinyint": v.TINY, "smallint": v.SHORT, "mediumint": v.INT24, "int": v.LONG, "integer": v.LONG,
    "bigint": v.LONGLONG, "float": v.FLOAT, "double": v.DOUBLE, "decimal": v.NEWDECIMAL, "date": v.DATE,
    "datetime": v.DATETIME2, "timestamp": v.TIMESTAMP2, "time": v.TIME2, "year": v.YEAR, "char": v.STRING,
    "binary": v.STRING, "varchar": v.VARCHAR, "varbinary": v.VARCHAR, "enum": v.ENUM, "set": v.SET,
    "bit": v.BIT, "json": v.JSON,
}
_LOBS = {"tiny": 1, "": 2, "medium": 3, "long": 4}
_GEOMETRY = frozenset({"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
                       "multipolygon", "geometrycollection", "geomcollection"})
_BINARY_TYPES = frozenset(BINARIES)
# Key types whose SQL order the keyset condition `k > last` follows exactly.
KEYSET_CODES = frozenset({v.TINY, v.SHORT, v.INT24, v.LONG, v.LONGLONG, v.NEWDECIMAL, v.DATE, v.DATETIME2,
                          v.TIMESTAMP2, v.TIME2, v.YEAR, v.STRING, v.VARCHAR, v.VAR_STRING})
_NUMERIC = frozenset({v.TINY, v.SHORT, v.INT24, v.LONG, v.LONGLONG, v.FLOAT, v.DOUBLE, v.NEWDECIMAL})
_MEMBER = re.compile(r"'((?:[^']|'')*)'")


class UnsupportedColumn(ValueError):
    """A column type the snapshot cannot read exactly (e.g. MariaDB's UUID or INET6)."""


@dataclass(frozen=True)
class TableShape:
    schema: TableSchema
    key: tuple[str, ...]  # chunking key; () = the whole table in one window
    key_kind: str  # primary | unique | none
    estimate: int
    key_sig: str = ""  # names, types and collations of the key: a resume is only valid while it holds


def members(column_type: str) -> tuple[str, ...]:
    """ENUM/SET members from COLUMN_TYPE, e.g. `enum('a','it''s')`."""
    inner = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    return tuple(m.replace("''", "'").replace("\\\\", "\\") for m in _MEMBER.findall(inner))


def column_from_catalog(row: dict[str, Any]) -> Column:
    """One information_schema.COLUMNS row -> the Column the binlog's TableMap would give."""
    data_type = str(row["DATA_TYPE"]).lower()
    column_type = str(row["COLUMN_TYPE"])
    lob = re.fullmatch(r"(tiny|medium|long|)(text|blob)", data_type)
    code: int | None
    if lob:
        code, length = v.BLOB, _LOBS[lob.group(1)]
    elif data_type in _GEOMETRY:
        code, length = v.GEOMETRY, 4
    elif data_type == "vector":
        code, length = v.VECTOR, 4
    else:
        code, length = _CODES.get(data_type), 0
    if code is None:
        raise UnsupportedColumn(f"column {row['COLUMN_NAME']} has type {column_type}, which binlake cannot snapshot")
    found: tuple[str, ...] = ()
    if code in (v.VARCHAR, v.STRING):
        length = int(row["CHARACTER_OCTET_LENGTH"] or 0)
    elif code == v.ENUM:
        found = members(column_type)
        length = 1 if len(found) < 256 else 2
    elif code == v.SET:
        found = members(column_type)
        length = (len(found) + 7) // 8
        length = 8 if length > 4 else length
    elif code == v.BIT:
        length = int(row["NUMERIC_PRECISION"] or 1)
    elif code == v.JSON:
        length = 4
    collation = "binary" if data_type in _BINARY_TYPES else str(row["COLLATION_NAME"] or "")
    column = build_column(
        str(row["COLUMN_NAME"]), code, str(row["IS_NULLABLE"]).upper() == "YES", collation=collation,
        # Only numeric columns carry the flag (an ENUM member may be called 'unsigned'); the
        # TableMap flags YEAR unsigned too.
        unsigned=(code in _NUMERIC and " unsigned" in column_type.lower()) or code == v.YEAR,
        precision=int(row["NUMERIC_PRECISION"] or 0) if code == v.NEWDECIMAL else 0,
        scale=int(row["NUMERIC_SCALE"] or 0) if code == v.NEWDECIMAL else 0,
        fsp=int(row["DATETIME_PRECISION"] or 0) if code in (v.DATETIME2, v.TIMESTAMP2, v.TIME2) else 0,
        length=length, members=found,
    )
    if code == v.VECTOR:  # vector(3): as the TableMap's VECTOR_DIMENSIONALITY says it
        dimensions = re.search(r"\((\d+)\)", column_type)
        column = dataclasses.replace(column, dimensions=int(dimensions.group(1)) if dimensions else 0)
    return column


def choose_key(columns: tuple[Column, ...],
               indexes: list[dict[str, Any]]) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """(primary key, chunking key, its kind) from information_schema.STATISTICS rows."""
    by_name = {c.name: c for c in columns}
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in indexes:
        grouped.setdefault(str(row["INDEX_NAME"]), []).append(row)
    pk = tuple(str(r["COLUMN_NAME"]) for r in grouped.get("PRIMARY", ()))

    def usable(rows: list[dict[str, Any]]) -> bool:
        cols = [by_name.get(str(r["COLUMN_NAME"])) for r in rows]
        return all(c is not None and not c.nullable and c.ctype.code in KEYSET_CODES for c in cols)

    if pk and usable(grouped["PRIMARY"]):
        return pk, pk, "primary"
    for name in sorted(grouped):
        rows = grouped[name]
        if name != "PRIMARY" and int(rows[0]["NON_UNIQUE"]) == 0 and usable(rows):
            return pk, tuple(str(r["COLUMN_NAME"]) for r in rows), "unique"
    return pk, (), "none"


def placeholder(col: Column) -> str:
    """How a key value is bound: DECIMAL through CAST, or MySQL would compare it as a double."""
    if col.ctype.code == v.NEWDECIMAL:
        return f"CAST(%s AS DECIMAL({col.ctype.precision},{col.ctype.scale}))"
    return "%s"


def key_param(col: Column, raw: Any) -> Any:
    """A key value read by SELECT (bytes, or the str or int the snapshot connection made of
    them) as the parameter of the next chunk's keyset condition."""
    code = col.ctype.code
    if code in (v.TINY, v.SHORT, v.INT24, v.LONG, v.LONGLONG, v.YEAR):
        return int(raw)
    if isinstance(raw, str):
        return raw  # text decoded as UTF-8, or DECIMAL or a temporal value as the server printed it
    if code in (v.STRING, v.VARCHAR, v.VAR_STRING) and col.ctype.encoding:
        return v.decode_text(raw, col.ctype.encoding)
    if code in (v.STRING, v.VARCHAR, v.VAR_STRING):
        return bytes(raw)
    return bytes(raw).decode("ascii")  # DECIMAL and temporal values as the server printed them


def chunk_sql(db: str, table: str, columns: tuple[str, ...], key: tuple[str, ...], *, after: bool,
              limit: int, placeholders: tuple[str, ...] = ()) -> str:
    """The keyset SELECT of one chunk: rows after the last key, in key order.

    `(a, b) > (x, y)` is written out as `a > x OR (a = x AND b > y)`, which every MySQL and
    MariaDB version turns into an index range scan.
    """
    sql = f"SELECT {', '.join(quote(c) for c in columns)} FROM {quote(db)}.{quote(table)}"
    if not key:
        return sql
    marks = placeholders or ("%s",) * len(key)
    if after:
        terms = []
        for i, k in enumerate(key):
            eq = [f"{quote(p)} = {marks[j]}" for j, p in enumerate(key[:i])]
            terms.append("(" + " AND ".join([*eq, f"{quote(k)} > {marks[i]}"]) + ")")
        sql += " WHERE " + " OR ".join(terms)
    return sql + f" ORDER BY {', '.join(quote(k) for k in key)} LIMIT {int(limit)}"


def keyset_params(last: tuple[Any, ...]) -> list[Any]:
    """The parameters of `chunk_sql(after=True)` for the last key read."""
    params: list[Any] = []
    for i in range(len(last)):
        params.extend(last[: i + 1])
    return params


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


async def _dicts(cur: Any, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    await cur.execute(sql, args)
    names = [d[0] for d in cur.description]
    out = []
    for row in await cur.fetchall():
        out.append({n: (_text(x) if isinstance(x, (bytes, bytearray)) else x) for n, x in zip(names, row, strict=True)})
    return out


async def describe(conn: Any, db: str, table: str, stats: v.DecodeStats) -> TableShape | None:
    """The table's schema and chunking key, or None when it does not exist (any more)."""
    async with conn.cursor() as cur:
        cols = await _dicts(cur, "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, "
                                 "NUMERIC_SCALE, DATETIME_PRECISION, CHARACTER_OCTET_LENGTH, COLLATION_NAME "
                                 "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
                                 "ORDER BY ORDINAL_POSITION", (db, table))
        if not cols:
            return None
        indexes = await _dicts(cur, "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME FROM information_schema.STATISTICS "
                                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY INDEX_NAME, SEQ_IN_INDEX",
                               (db, table))
        est = await _dicts(cur, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                                "AND TABLE_NAME = %s", (db, table))
    columns = tuple(column_from_catalog(c) for c in cols)
    pk, key, kind = choose_key(columns, indexes)
    schema = TableSchema(db=db, table=table, columns=columns, pk=pk, stats=stats)
    estimate = int(est[0]["TABLE_ROWS"] or 0) if est else 0
    by_name = {str(c["COLUMN_NAME"]): c for c in cols}
    sig = ";".join(f"{k} {by_name[k]['COLUMN_TYPE']} {by_name[k]['COLLATION_NAME'] or ''}" for k in key)
    return TableShape(schema, key, kind, estimate, sig)


async def list_tables(conn: Any, exclude: frozenset[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every base table outside the system schemas, except the (db, table) pairs in `exclude`, sorted."""
    async with conn.cursor() as cur:
        rows = await _dicts(cur, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                                 "WHERE TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED')", ())
    skip = {(db.casefold(), t.casefold()) for db, t in exclude}
    return sorted((r["TABLE_SCHEMA"], r["TABLE_NAME"]) for r in rows if r["TABLE_SCHEMA"] not in SYSTEM_SCHEMAS
                  and (r["TABLE_SCHEMA"].casefold(), r["TABLE_NAME"].casefold()) not in skip)

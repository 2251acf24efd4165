"""`binlake verify [db.table ...]`: does each source table equal the lake's newest committed state?

Each side is read once and every cell put into one canonical form per DESIGN §4 kind:

| source type | canonical cell | why |
|---|---|---|
| FLOAT | the float32 value | the source reads `col + 0e0` (the stored float32 as a double: exact) |
| DOUBLE | the float64 value | `col + 0e0` too: DOUBLE(M,D) prints rounded to D places |
| DECIMAL | exact text at the column's scale | the lake has decimal(p,s), or a string when p > 38 |
| BIGINT UNSIGNED, BIT | int | decimal(20,0) or long in the lake, bytes for BIT in the source |
| DATE / DATETIME / TIMESTAMP | ISO text (microseconds; TIMESTAMP in UTC with `Z`) | zero and invalid dates are null |
| TIME | signed microseconds | `[-]HHH:MM:SS[.f]` text in the lake |
| SET | tuple of members | `'a,b'` in the source, array<string> in the lake |
| VECTOR (MySQL 9) | tuple of float32 values | float32 bytes in the source, array<float> in the lake |
| JSON | compact JSON with sorted keys and normalized numbers | equal when semantically equal |
| text / ENUM, binary / BLOB / GEOMETRY | str, bytes | BINARY keeps its trailing 0x00 |

The comparison is exact and in bounded memory: a 64-bit digest of every canonical row
goes into an array per side; the two multisets of digests are compared with numpy (so
tables without a primary key compare as multisets: duplicates count). Only when they
differ is the source read again (in the same consistent-snapshot transaction), to show the
first differing keys with the columns that differ; a key's position in that list depends
on its digest, so both sides keep the same keys without holding every differing row.

The source is BINLAKE_SOURCE_URL(_FILE), else the one `binlake up` recorded in its data directory
(`<data dir>/source-url`: on its private server, binlake's least-privilege user); the lake is the
loader's (LoaderConfig: BINLAKE_DATA_DIR, BINLAKE_WAREHOUSE, BINLAKE_CATALOG*). Exit 0: every
table equal, 1: one differs, 2: a configuration error (no source, no lake, a table neither side has).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import islice
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pymysql
import pymysql.cursors
from numpy.typing import NDArray
from pyspark.sql import DataFrame, SparkSession

from services.launcher import source
from services.loader import live
from services.loader.naming import lake_column, quote, source_column
from services.loader.types import spark_type
from shared.errors import ConfigError
from shared.mysql import TLS_CIPHER_SQL, MysqlUrl, display, mysql_quote, parse_name
from shared.mysql_types import BINARIES, INTEGERS, SPATIAL, TEXTS

Cell: TypeAlias = int | float | str | bytes | tuple[str, ...] | tuple[float, ...] | None
Row: TypeAlias = tuple[Cell, ...]
Connection: TypeAlias = "pymysql.connections.Connection[Any]"
Digests: TypeAlias = NDArray[np.uint64]

DETAIL_LINES = 20  # differing keys shown per table
SYSTEM_DBS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})
_CHUNK = 4096
_F32 = struct.Struct("<f")
_EPOCH = dt.datetime(1970, 1, 1)
_TIME = re.compile(r"(-)?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_KINDS = {
    **dict.fromkeys((*INTEGERS, "year", "bit"), "int"),
    **dict.fromkeys((*TEXTS, "enum"), "text"),
    **dict.fromkeys((*BINARIES, *SPATIAL), "bytes"),
    **{t: t for t in ("float", "double", "decimal", "date", "datetime", "timestamp", "time", "set", "json",
                      "vector")},
}
_JSON_CHECK = re.compile(r"json_valid\(`((?:[^`]|``)*)`\)", re.IGNORECASE)


# -- canonical cells -------------------------------------------------------------------------------


def _f32(value: float) -> float:
    return float(_F32.unpack(_F32.pack(value))[0]) + 0.0  # + 0.0: -0 equals 0


def _int(v: Any, _: int) -> Cell:
    if type(v) is int:
        return v
    if isinstance(v, (bytes, bytearray)):
        return int.from_bytes(v, "big")  # BIT in the source
    if isinstance(v, Decimal) and v != v.to_integral_value():
        return str(v)
    return int(v)


def _decimal(v: Any, scale: int) -> Cell:
    d = v if isinstance(v, Decimal) else Decimal(str(v))
    if not d.is_finite():
        return str(d)
    text = format(d, "f")
    dot = text.find(".")
    places = 0 if dot < 0 else len(text) - dot - 1
    if places < scale:  # pad only: more places than the scale stay visible
        text += ("." if dot < 0 else "") + "0" * (scale - places)
    return text[1:] if text[0] == "-" and d == 0 else text


def _date(v: Any, _: int) -> Cell:
    if isinstance(v, dt.date):
        return v.isoformat()
    try:
        return dt.date.fromisoformat(str(v)).isoformat()
    except ValueError:
        return None  # a zero or invalid date (PyMySQL hands those over as text)


def _iso(v: Any) -> str | None:
    if isinstance(v, dt.datetime):
        return v.isoformat(timespec="microseconds")
    try:
        return dt.datetime.fromisoformat(str(v)).isoformat(timespec="microseconds")
    except ValueError:
        return None  # a zero or invalid date


def _datetime(v: Any, _: int) -> Cell:
    return _iso(v)


def _timestamp(v: Any, _: int) -> Cell:
    if isinstance(v, int):
        v = _EPOCH + dt.timedelta(microseconds=v)  # unix_micros() of the lake column
    text = _iso(v)
    return None if text is None else f"{text}Z"


def _time(v: Any, _: int) -> Cell:
    if isinstance(v, dt.timedelta):
        return (v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds
    m = _TIME.fullmatch(str(v))
    if m is None:
        return f"unreadable TIME {v!r}"
    sign, h, mi, s, frac = m.groups()
    micros = ((int(h) * 60 + int(mi)) * 60 + int(s)) * 1_000_000 + int((frac or "").ljust(6, "0"))
    return -micros if sign else micros


def _set(v: Any, _: int) -> Cell:
    if isinstance(v, str):
        return tuple(v.split(",")) if v else ()
    return tuple(str(m) for m in v)


def _vector(v: Any, _: int) -> Cell:
    if isinstance(v, (bytes, bytearray)):  # the source: float32 values, little-endian
        return tuple(float(x) for x in struct.unpack(f"<{len(v) // 4}f", v))
    return tuple(_f32(float(x)) for x in v)


def _json_text(obj: Any) -> str:
    if isinstance(obj, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _json_text(obj[k]) for k in sorted(obj)) + "}"
    if isinstance(obj, list):
        return "[" + ",".join(_json_text(x) for x in obj) + "]"
    if isinstance(obj, Decimal):
        return "0" if obj == 0 else str(obj.normalize())
    return json.dumps(obj, ensure_ascii=False)


def _json(v: Any, _: int) -> Cell:
    text = v.decode() if isinstance(v, (bytes, bytearray)) else str(v)
    try:
        return _json_text(json.loads(text, parse_float=Decimal, parse_int=Decimal))
    except ValueError:
        return f"invalid JSON {text!r}"


def _text(v: Any, _: int) -> Cell:
    if type(v) is str or type(v) is bytes:
        return v
    return bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else str(v)


_CANON: dict[str, Callable[[Any, int], Cell]] = {
    "int": _int, "float": lambda v, _: _f32(float(v)), "double": lambda v, _: float(v) + 0.0,
    "decimal": _decimal, "date": _date, "datetime": _datetime, "timestamp": _timestamp, "time": _time,
    "set": _set, "json": _json, "vector": _vector, "text": _text, "bytes": _text, "other": _text,
}


@dataclass(frozen=True)
class Column:
    """A compared column: how each side reads it, and its canonical kind."""

    name: str
    kind: str  # a key of _CANON
    source_type: str  # COLUMN_TYPE, for messages
    lake_type: str  # the Spark type DESIGN §4 gives it ("" when the mapping has no rule)
    scale: int = 0

    @property
    def source_sql(self) -> str:
        col = mysql_quote(self.name)
        if self.kind == "vector":  # pymysql reads a VECTOR field as ASCII text; as BINARY it is the bytes
            return f"CAST({col} AS BINARY)"
        return f"{col} + 0e0" if self.kind in ("float", "double") else col

    def lake_sql(self, lake_type: str) -> str:
        col = quote(lake_column(self.name))
        if lake_type == "timestamp":
            return f"unix_micros({col})"  # the instant, whatever the session's time zone
        if lake_type == "timestamp_ntz":
            return f"date_format({col}, \"yyyy-MM-dd'T'HH:mm:ss.SSSSSS\")"
        return col

    def canon(self, value: Any) -> Cell:
        if value is None:
            return None
        try:
            return _CANON[self.kind](value, self.scale)
        except _UNREADABLE:
            return f"unreadable {value!r}"


_UNREADABLE = (ValueError, TypeError, ArithmeticError, struct.error)


def row_reader(columns: Sequence[Column]) -> Callable[[Sequence[Any]], Row]:
    """Raw values (a source or lake row) -> canonical cells."""
    plan = [(_CANON[c.kind], c.scale) for c in columns]

    def read(raw: Sequence[Any]) -> Row:
        try:
            return tuple([None if v is None else fn(v, scale) for (fn, scale), v in zip(plan, raw, strict=False)])
        except _UNREADABLE:  # rare: cell by cell, an unreadable value becomes a text naming it
            return tuple(c.canon(v) for c, v in zip(columns, raw, strict=False))

    return read


# -- showing cells ---------------------------------------------------------------------------------


def _f32_text(value: float) -> str:
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if _f32(float(text)) == value:
            return repr(float(text))
    return repr(value)


def show(column: Column, cell: Cell, window: slice | None = None, width: int = 32) -> str:
    """A cell as the messages print it (`window`: the part of a long text or binary to show)."""
    if cell is None:
        return "NULL"
    if isinstance(cell, (str, bytes)) and column.kind in ("text", "bytes", "json", "other"):
        if window is None and len(cell) > width:
            window = slice(0, width)
        if window is None:
            return "0x" + cell.hex() if isinstance(cell, bytes) else repr(cell)
        part = cell[window]
        cut = ("…" if window.start else "", "…" if window.stop < len(cell) else "")
        body = "0x" + part.hex() if isinstance(part, bytes) else repr(part)
        return f"{cut[0]}{body}{cut[1]} ({len(cell)} {'bytes' if isinstance(cell, bytes) else 'chars'})"
    if column.kind == "float" and isinstance(cell, float):
        return _f32_text(cell)
    if column.kind == "time" and isinstance(cell, int):
        sign, us = ("-" if cell < 0 else ""), abs(cell)
        s, frac = divmod(us, 1_000_000)
        text = f"{sign}{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
        return text + (f".{frac:06d}".rstrip("0") if frac else "")
    if column.kind == "set" and isinstance(cell, tuple):
        return repr(",".join(map(str, cell)))
    if column.kind == "vector" and isinstance(cell, tuple):
        return "[" + ", ".join(_f32_text(float(x)) for x in cell) + "]"
    if column.kind in ("datetime", "timestamp") and isinstance(cell, str):
        return re.sub(r"\.?0+(Z?)$", r"\1", cell) if "." in cell else cell  # fraction without trailing zeros
    return str(cell)


def show_pair(column: Column, a: Cell, b: Cell, width: int = 32) -> tuple[str, str]:
    """Two differing cells; long texts and binaries around their first difference."""
    if type(a) is type(b) and isinstance(a, (str, bytes)) and isinstance(b, (str, bytes)) \
            and max(len(a), len(b)) > width:
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        start = max(0, first - 8)
        window = slice(start, start + width)
        return show(column, a, window, width), show(column, b, window, width)
    return show(column, a, width=width), show(column, b, width=width)


def show_row(columns: Sequence[Column], cells: Row, limit: int = 200) -> str:
    text = ", ".join(show(c, v) for c, v in zip(columns, cells, strict=True))
    text = f"({text}{',' if len(cells) == 1 else ''})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- the source --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceTable:
    db: str
    table: str
    columns: list[Column]
    key: list[str]  # primary key columns, [] for a table without one

    @property
    def sql_name(self) -> str:
        return f"{mysql_quote(self.db)}.{mysql_quote(self.table)}"


def _column(row: Sequence[Any], json_columns: set[str]) -> Column:
    name, data_type, column_type, precision, scale = str(row[0]), str(row[1]).lower(), str(row[2]).lower(), row[3], \
        row[4]
    kind = "json" if name in json_columns else _KINDS.get(data_type, "other")
    described: dict[str, Any] = {"type": "geometry" if data_type in SPATIAL else data_type,
                                 "unsigned": "unsigned" in column_type, "precision": precision or 10,
                                 "scale": scale or 0, "length": precision or 1}
    lake_type = spark_type(described) if kind != "other" else ""
    return Column(name, kind, column_type, lake_type, int(scale or 0) if kind == "decimal" else 0)


def describe(conn: Connection, db: str, table: str) -> SourceTable | None:
    """The source table's columns and primary key (None: no such table)."""
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE "
                    "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
                    "ORDER BY ORDINAL_POSITION", (db, table))
        rows = cur.fetchall()
        if not rows:
            return None
        cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
                    "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (db, table))
        key = [str(r[0]) for r in cur.fetchall()]
        json_columns = {str(r[0]) for r in rows if str(r[1]).lower() == "json"}  # MySQL's JSON type
        try:  # MariaDB's JSON is LONGTEXT CHECK (json_valid(`c`)); MySQL has no TABLE_NAME here
            cur.execute("SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
                        "WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s", (db, table))
            for (clause,) in cur.fetchall():
                m = _JSON_CHECK.fullmatch(str(clause).strip())
                if m:
                    json_columns.add(m.group(1).replace("``", "`"))
        except pymysql.err.MySQLError:
            pass
    return SourceTable(db, table, [_column(r, json_columns) for r in rows], key)


def source_rows(conn: Connection, src: SourceTable, columns: Sequence[Column]) -> Iterator[Row]:
    """The table's rows as canonical cells, streamed (unbuffered cursor)."""
    select = ", ".join(c.source_sql for c in columns) or "1"
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute(f"SELECT {select} FROM {src.sql_name}")
        yield from map(row_reader(columns), cur)


@contextmanager
def consistent_read(conn: Connection) -> Iterator[None]:
    """Every read of the source inside sees one snapshot (the re-read finds what the first read saw)."""
    with conn.cursor() as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    try:
        yield
    finally:
        conn.rollback()


def connect(url: str) -> Connection:
    dsn = MysqlUrl.parse(url)
    try:
        conn = pymysql.connect(**dsn.pymysql_settings(), charset="utf8mb4", autocommit=True)
    except pymysql.err.MySQLError as exc:
        raise ConfigError(f"cannot connect to the source {dsn}: {exc}") from None
    with conn.cursor() as cur:
        cur.execute(TLS_CIPHER_SQL)
        dsn.check_tls((cur.fetchone() or ("", ""))[1])
        cur.execute("SET SESSION time_zone = '+00:00'")  # TIMESTAMP in UTC, as in the lake
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SET SESSION net_write_timeout = 3600")  # the lake is read while a re-read waits
    return conn


def source_tables(conn: Connection) -> list[tuple[str, str]]:
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE'")
        return sorted((str(r[0]), str(r[1])) for r in cur.fetchall() if str(r[0]) not in SYSTEM_DBS)


# -- the lake ----------------------------------------------------------------------------------------


def lake_rows(df: DataFrame, columns: Sequence[Column], lake_types: Mapping[str, str]) -> Iterator[Row]:
    """The lake frame's rows as canonical cells, streamed partition by partition."""
    exprs = [c.lake_sql(lake_types[c.name]) for c in columns] or ["1"]
    yield from map(row_reader(columns), df.selectExpr(*exprs).toLocalIterator(prefetchPartitions=True))


# -- comparing ---------------------------------------------------------------------------------------


def _digest(cells: Row) -> int:
    return int.from_bytes(hashlib.blake2b(repr(cells).encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "little")


def _multiset(digests: array[int]) -> tuple[Digests, NDArray[np.int64]]:
    values, counts = np.unique(np.frombuffer(digests, dtype=np.uint64), return_counts=True)
    return values, counts.astype(np.int64)


def _count(values: Digests, counts: NDArray[np.int64], wanted: Digests) -> NDArray[np.int64]:
    """How often each of `wanted` occurs in the multiset (values, counts)."""
    if not len(values):
        return np.zeros(len(wanted), dtype=np.int64)
    at = np.minimum(np.searchsorted(values, wanted), len(values) - 1)
    return np.where(values[at] == wanted, counts[at], 0)


def _chunks(rows: Iterable[Row]) -> Iterator[tuple[list[Row], Digests]]:
    it = iter(rows)
    while chunk := list(islice(it, _CHUNK)):
        yield chunk, np.fromiter((_digest(r) for r in chunk), dtype=np.uint64, count=len(chunk))


@dataclass
class _Kept:
    """The rows of the `limit` smallest key digests seen (so both sides keep the same keys)."""

    limit: int
    rows: dict[int, list[Row]] = field(default_factory=dict)
    cutoff: int | None = None

    def add(self, key: int, row: Row) -> None:
        if self.cutoff is not None and key > self.cutoff:
            return
        self.rows.setdefault(key, []).append(row)
        if len(self.rows) > 2 * self.limit:
            self.prune()

    def prune(self) -> None:
        kept = sorted(self.rows)[: self.limit]
        self.rows = {k: self.rows[k] for k in kept}
        if kept and len(kept) == self.limit:
            self.cutoff = kept[-1]


@dataclass(frozen=True)
class Difference:
    """One differing key (or, in a table without a key, one row whose number of copies differs)."""

    key: str
    text: str
    keyed: bool
    columns: tuple[str, ...] = ()  # the columns whose values differ

    def line(self) -> str:
        return f"  {'key' if self.keyed else 'row'} {self.key}: {self.text}"


class Comparison:
    """Both sides of one table as multisets of row digests, and the first differing keys."""

    def __init__(self, columns: Sequence[Column], key: Sequence[int], limit: int) -> None:
        self.columns, self.key, self.limit = list(columns), list(key), limit
        self.keyed = len(self.key) < len(self.columns)
        self.source, self.lake, self.keys = array("Q"), array("Q"), array("Q")
        self.lake_only, self.source_diff = _Kept(limit), _Kept(limit)
        self.same_key: dict[int, list[Row]] = {}  # source rows of lake-only keys whose digest matched
        self.sv, self.sc = _multiset(self.source)  # source digests and their counts, sorted
        self.lv, self.lc = _multiset(self.lake)
        self.wanted = self.sv  # source digests the lake holds another number of copies of

    def key_digest(self, row: Row, digest: int) -> int:
        return _digest(tuple(row[i] for i in self.key)) if self.keyed else digest

    def read_source(self, rows: Iterable[Row]) -> None:
        for _, digests in _chunks(rows):
            self.source.frombytes(digests.tobytes())
        self.sv, self.sc = _multiset(self.source)

    def read_lake(self, rows: Iterable[Row]) -> None:
        for chunk, digests in _chunks(rows):
            self.lake.frombytes(digests.tobytes())
            for i in np.flatnonzero(_count(self.sv, self.sc, digests) == 0):
                key = self.key_digest(chunk[i], int(digests[i]))
                self.lake_only.add(key, chunk[i])
                self.keys.append(key)
        self.lv, self.lc = _multiset(self.lake)
        self.wanted = self.sv[self.sc != _count(self.lv, self.lc, self.sv)]
        self.lake_only.prune()

    @property
    def equal(self) -> bool:
        return not len(self.wanted) and len(self.source) == len(self.lake)

    def reread_source(self, rows: Iterable[Row]) -> None:
        """Keep the source rows the lake lacks copies of, and those of the lake-only keys."""
        lake_keys = set(self.lake_only.rows) if self.keyed else set()
        for chunk, digests in _chunks(rows):
            differs = _count(self.wanted, np.ones(len(self.wanted), np.int64), digests) > 0
            for i, row in enumerate(chunk):
                if differs[i] or lake_keys:
                    key = self.key_digest(row, int(digests[i]))
                    if differs[i]:
                        self.source_diff.add(key, row)
                        self.keys.append(key)
                    elif key in lake_keys:
                        self.same_key.setdefault(key, []).append(row)
        self.source_diff.prune()

    @property
    def differing(self) -> int:
        return int(np.unique(np.frombuffer(self.keys, dtype=np.uint64)).size)

    def differences(self) -> list[Difference]:
        chosen = sorted(set(self.source_diff.rows) | set(self.lake_only.rows))[: self.limit]
        out: list[tuple[tuple[Any, ...], Difference]] = []
        for key in chosen:
            rows = {_digest(r): r for part in (self.source_diff, self.lake_only) for r in part.rows.get(key, [])}
            rows.update({_digest(r): r for r in self.same_key.get(key, [])})
            digests = np.array(list(rows), dtype=np.uint64)
            sn, ln = _count(self.sv, self.sc, digests), _count(self.lv, self.lc, digests)
            variants = [(r, int(s), int(n)) for r, s, n in zip(rows.values(), sn, ln, strict=True)]
            order = tuple((v is not None, type(v).__name__, v) for v in (variants[0][0][i] for i in self.key))
            out.append((order, self._difference(variants)))
        return [d for _, d in sorted(out, key=lambda o: o[0])]

    def _difference(self, variants: list[tuple[Row, int, int]]) -> Difference:
        first = variants[0][0]
        key_columns = [self.columns[i] for i in self.key]
        key = show_row(key_columns, tuple(first[i] for i in self.key))
        if not self.keyed:
            _, s, n = variants[0]
            return Difference(key, f"{s} in source, {n} in lake", False)
        source = [r for r, s, _ in variants for _ in range(s)]
        lake = [r for r, _, n in variants for _ in range(n)]
        if not lake:
            return Difference(key, "only in source", True)
        if not source:
            return Difference(key, "only in lake", True)
        cells = [(c, a, b) for c, a, b in zip(self.columns, source[0], lake[0], strict=True) if a != b]
        text = "; ".join(f"{_name(c.name)} source={pa} lake={pb}" for c, a, b in cells
                         for pa, pb in [show_pair(c, a, b)])
        if len(source) != 1 or len(lake) != 1:
            text = f"source {_rows(len(source))}, lake {_rows(len(lake))}" + (f"; {text}" if text else "")
        return Difference(key, text, True, tuple(c.name for c, _, _ in cells))


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _name(column: str) -> str:
    return column if re.fullmatch(r"\w+", column) else mysql_quote(column)


@dataclass
class Result:
    table: str
    source_rows: int
    lake_rows: int
    problems: list[str] = field(default_factory=list)  # differences of the table itself (columns, types)
    differences: list[Difference] = field(default_factory=list)  # the first differing keys
    differing: int = 0  # differing keys in all

    @property
    def equal(self) -> bool:
        return not self.problems and not self.differing and self.source_rows == self.lake_rows

    def lines(self, limit: int = DETAIL_LINES) -> list[str]:
        if self.equal:
            return [f"OK    {self.table}: {self.source_rows} rows"]
        out = [f"DIFF  {self.table}: source {self.source_rows} rows, lake {self.lake_rows} rows"]
        out += [f"  {p}" for p in self.problems]
        out += [d.line() for d in self.differences[:limit]]
        rest = self.differing - min(limit, len(self.differences))
        if rest > 0:
            out.append(f"  ... and {rest} more differing {'keys' if self._keyed else 'rows'}")
        return out

    @property
    def _keyed(self) -> bool:
        return not self.differences or self.differences[0].keyed


def _column_problems(src: SourceTable, lake_types: Mapping[str, str]) -> list[str]:
    out = []
    names = {c.name for c in src.columns}
    missing = [_name(c.name) for c in src.columns if c.name not in lake_types]
    extra = [_name(c) for c in lake_types if c not in names]
    if missing:
        out.append(f"columns not in the lake: {', '.join(missing)}")
    if extra:
        out.append(f"columns not in the source: {', '.join(extra)}")
    for c in src.columns:
        have = lake_types.get(c.name)
        if have is not None and c.lake_type and have != c.lake_type:
            out.append(f"column {_name(c.name)}: {have} in the lake, {c.lake_type} expected for {c.source_type}")
    return out


def verify_table(spark: SparkSession, conn: Connection, catalog: str, db: str, table: str,
                 limit: int = DETAIL_LINES) -> Result:
    """Compare one source table with the lake's newest committed state of it."""
    name = display(db, table)
    src = describe(conn, db, table)
    df = live.live_frame(spark, catalog, db, table)
    if src is None and df is None:
        raise ConfigError(f"{name}: no such table in the source or in the lake")
    if src is None:
        assert df is not None
        n = df.count()  # a dropped table: the lake keeps it, empty
        return Result(name, 0, n, ["not in the source"] if n else [])
    if df is None:
        with consistent_read(conn):
            n = sum(1 for _ in source_rows(conn, src, []))
        return Result(name, n, 0, ["not in the lake"] if n else [])
    lake_types = {source_column(f.name): f.dataType.simpleString() for f in df.schema.fields}
    columns = [c for c in src.columns if c.name in lake_types]
    names = [c.name for c in columns]
    key = [names.index(k) for k in src.key] if src.key and set(src.key) <= set(names) else list(range(len(names)))
    cmp = Comparison(columns, key, limit)
    with consistent_read(conn):
        cmp.read_source(source_rows(conn, src, columns))
        cmp.read_lake(lake_rows(df, columns, lake_types))
        if not cmp.equal:
            cmp.reread_source(source_rows(conn, src, columns))
    return Result(name, len(cmp.source), len(cmp.lake), _column_problems(src, lake_types), cmp.differences(),
                  cmp.differing)


# -- which tables ------------------------------------------------------------------------------------


def verify(spark: SparkSession, conn: Connection, catalog: str, names: Sequence[str] = (),
           limit: int = DETAIL_LINES) -> list[Result]:
    """Compare the named tables (default: every source table the lake holds)."""
    lake_tables = [(t.db, t.table) for t in live.tables(spark, catalog)]
    if names:
        known = set(lake_tables) | set(source_tables(conn))
        pairs = [parse_name(n, known) for n in names]
    else:
        pairs = lake_tables
    return [verify_table(spark, conn, catalog, db, table, limit) for db, table in pairs]


# -- configuration and the command -------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyConfig:
    source_url: str = ""  # BINLAKE_SOURCE_URL; default: the source `binlake up` runs (<data_dir>/source-url)


def source_url(configured: str, data_dir: str) -> str:
    """The configured source URL, else the one `binlake up` recorded in its data directory."""
    if configured:
        return configured
    if recorded := source.recorded_url(Path(data_dir)):
        return recorded
    raise ConfigError(f"no source URL: set BINLAKE_SOURCE_URL, or BINLAKE_DATA_DIR to the data directory of "
                      f"`binlake up` (no source recorded in {source.url_file(Path(data_dir))})")


def run(names: Sequence[str], env: Mapping[str, str] | None = None) -> list[Result]:
    """Verify with the loader's lake configuration and the source `binlake up` uses (ConfigError: exit 2)."""
    from services.loader.config import LoaderConfig
    from services.loader.spark import session, stop
    from shared.config import load

    cfg = LoaderConfig.from_env(env)
    if cfg.catalog_type == "hadoop" and "://" not in cfg.root and not Path(cfg.root).is_dir():
        raise ConfigError(f"no lake at {cfg.root}: check BINLAKE_DATA_DIR / BINLAKE_WAREHOUSE")
    conn = connect(source_url(load(VerifyConfig, "verify", env).source_url, cfg.data_dir))
    try:
        spark = session("binlake-verify", "local[2]", cfg.lake_catalog, cfg.spark_conf)
        try:
            results = verify(spark, conn, cfg.catalog, names)
        finally:
            stop(spark)
    finally:
        conn.close()
    if not results:
        raise ConfigError(f"the lake (catalog {cfg.catalog}, {cfg.root}) holds no tables: "
                          "check BINLAKE_DATA_DIR / BINLAKE_WAREHOUSE / BINLAKE_CATALOG*")
    return results


def main() -> None:
    """`binlake verify [db.table ...]`: exit 0 when every table equals the lake, 1 when one differs, 2 on errors."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="binlake verify", description="Compare source tables with the lake.")
    parser.add_argument("tables", nargs="*", help="db.table (default: every table the lake holds); "
                                                  "`db`.`table` when a name holds a dot or a backtick")
    args = parser.parse_args(sys.argv[1:])
    try:
        results = run(args.tables)
    except ConfigError as exc:
        print(f"binlake verify: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for r in results:
        print("\n".join(r.lines()), flush=True)
    raise SystemExit(0 if all(r.equal for r in results) else 1)


if __name__ == "__main__":
    main()

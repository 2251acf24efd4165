"""Pure: one value of a snapshot SELECT -> the same envelope value the binlog path gives.

The snapshot reads through asyncmy with every conversion off and `character_set_results =
NULL`, so each value arrives as the raw bytes the server sends for its text protocol, in the
column's own charset. Decoding them here with the column's codec and the binlog decoders'
formats makes a row read by SELECT byte-for-byte equal to the same row decoded from a rows
event (tests/integration/test_snapshot.py checks the whole type matrix).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from typing import Any

from services.parser import values as v
from services.parser.columns import CODECS, Column
from shared.errors import DecodeError

TextDecoder = Callable[[bytes], Any]


def _float(raw: bytes) -> float:
    return v.shortest_float32(float(raw))


_ascii = operator.methodcaller("decode", "ascii")


def _bit(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def _valid(raw: bytes) -> bool:
    """Whether `YYYY-MM-DD...` is a real date (zero and invalid dates become null)."""
    if raw[:4] != b"0000" and b"01" <= raw[5:7] <= b"12" and b"01" <= raw[8:10] <= b"28":
        return True  # every month has these days: no calendar lookup on the hot path
    try:
        return v.valid_date(int(raw[0:4]), int(raw[5:7]), int(raw[8:10]))
    except ValueError:
        return False


_SEEN_DATES = 65_536  # dates remembered as valid per column (a chunk's dates repeat)


def _temporal(stats: v.DecodeStats, zone: str) -> TextDecoder:
    """DATE, DATETIME and TIMESTAMP: `YYYY-MM-DD[ hh:mm:ss[.f]]` in ISO form, invalid dates null."""
    seen: set[bytes] = set()

    def decode(raw: bytes) -> Any:
        day = raw[:10]
        if day not in seen:  # the calendar check once per date, not once per value
            if not _valid(raw):
                stats.zero_dates += 1
                return None
            if len(seen) >= _SEEN_DATES:
                seen.clear()
            seen.add(day)
        return raw.decode("ascii").replace(" ", "T") + zone

    return decode


def _text(encoding: str) -> TextDecoder:
    if encoding != "cp1252":
        return operator.methodcaller("decode", encoding)  # no Python frame per value

    def decode(raw: bytes) -> str:
        return v.decode_text(raw, encoding)

    return decode


def _set(encoding: str) -> TextDecoder:
    def decode(raw: bytes) -> list[str]:
        return v.decode_text(raw, encoding).split(",") if raw else []

    return decode


def _json(raw: bytes) -> str:
    # MySQL prints JSON with the separators json.dumps uses; re-dumping fixes key order too.
    return json.dumps(json.loads(raw), ensure_ascii=False)


def text_decoder_for(col: Column, stats: v.DecodeStats) -> TextDecoder:
    """The decoder of one column's SELECT value; the SQL NULL never reaches it."""
    code = col.ctype.code
    encoding = col.ctype.encoding or CODECS.get(col.charset or "", "utf-8")
    if code in (v.TINY, v.SHORT, v.INT24, v.LONG, v.LONGLONG, v.YEAR):
        return int
    if code == v.FLOAT:
        return _float
    if code == v.DOUBLE:
        return float
    if code in (v.NEWDECIMAL, v.TIME, v.TIME2):
        return _ascii
    if code in (v.DATE, v.DATETIME, v.DATETIME2):
        return _temporal(stats, "")
    if code in (v.TIMESTAMP, v.TIMESTAMP2):
        return _temporal(stats, "Z")  # the snapshot session runs with time_zone = '+00:00'
    if code in (v.VARCHAR, v.VAR_STRING, v.STRING, v.BLOB):
        return _text(col.ctype.encoding) if col.ctype.encoding else bytes
    if code == v.ENUM:
        return _text(encoding)
    if code == v.SET:
        return _set(encoding)
    if code == v.BIT:
        return _bit
    if code == v.JSON:
        return _json
    if code == v.GEOMETRY:
        return bytes
    raise DecodeError(f"column {col.name} of type {col.type} cannot be snapshotted")


def row_decoder(columns: tuple[Column, ...], stats: v.DecodeStats) -> Callable[[tuple[Any, ...]], dict[str, Any]]:
    """Decode one SELECT row (columns in schema order) into the envelope's row dict.

    The function is generated for the column list, one expression per column, because
    the per-value loop is the snapshot's hot spot (3x faster than zip over decoders).
    """
    scope: dict[str, Any] = {}
    items = []
    for i, col in enumerate(columns):
        scope[f"d{i}"], scope[f"k{i}"] = text_decoder_for(col, stats), col.name
        value = f"d{i}(r[{i}])" if not col.nullable else f"None if (x := r[{i}]) is None else d{i}(x)"
        items.append(f"k{i}: {value}")
    exec(f"def decode(r):\n    return {{{', '.join(items)}}}\n", scope)
    decode: Callable[[tuple[Any, ...]], dict[str, Any]] = scope["decode"]
    return decode


_SMALL = 80  # bytes of the longest value a number, date, time or DECIMAL prints as
_CHECKED = 4096  # columns that may be longer than this are measured on every row


def _most_bytes(col: Column) -> int | None:
    """The most bytes one value of the column can take in a SELECT result (None: gigabytes)."""
    t = col.ctype
    if t.code in (v.VARCHAR, v.VAR_STRING, v.STRING):
        return t.length
    if t.code == v.BLOB:
        return 256 ** t.length - 1 if t.length < 4 else None
    if t.code in (v.ENUM, v.SET):
        return sum(len(m.encode()) + 1 for m in t.values) * 4
    if t.code in (v.JSON, v.GEOMETRY):
        return None
    return _SMALL


def row_size_check(columns: tuple[Column, ...], limit: int) -> tuple[int, tuple[int, ...]] | None:
    """How to bound a row's size cheaply: (bytes of the short columns at most, the long columns).

    None when no row of these columns can exceed `limit`: then no row is measured at all.
    """
    bounds = [_most_bytes(c) for c in columns]
    if all(b is not None for b in bounds) and sum(b for b in bounds if b is not None) <= limit:
        return None
    long = tuple(i for i, b in enumerate(bounds) if b is None or b > _CHECKED)
    return sum(b for b in bounds if b is not None and b <= _CHECKED), long

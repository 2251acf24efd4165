"""Pure: one value of a snapshot SELECT -> the same envelope value the binlog path gives.

The snapshot reads through asyncmy with `character_set_results = NULL`, so each value arrives
as the text the server prints for it, in the column's own charset. asyncmy's C row parser
turns integers and doubles into numbers (`RESULT_CONVERSIONS`, the only conversions of the
snapshot connection) and, for a table whose text columns are all UTF-8 (`reads_unicode`),
decodes text in C as well; the rest is decoded here with the column's codec and the binlog
decoders' formats. A row read by SELECT is so byte-for-byte equal to the same row decoded from
a rows event (tests/integration/test_snapshot.py checks the whole type matrix, both ways).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from typing import Any

from services.parser import values as v
from services.parser.columns import CODECS, Column
from shared.errors import DecodeError

TextDecoder = Callable[[Any], Any]

_INTEGERS = (v.TINY, v.SHORT, v.INT24, v.LONG, v.LONGLONG, v.YEAR)
# Result field type -> conversion asyncmy applies while it parses a row (`int` on its C fast path).
RESULT_CONVERSIONS: dict[int, Callable[[bytes], Any]] = {**dict.fromkeys(_INTEGERS, int), v.DOUBLE: float}
_TEXT_CODES = (v.VARCHAR, v.VAR_STRING, v.STRING, v.BLOB)


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


class _Temporal:
    """DATE, DATETIME and TIMESTAMP: `YYYY-MM-DD[ hh:mm:ss[.f]]` in ISO form, invalid dates null.

    The calendar check runs once per date (`seen`), not once per value; the generated row
    decoders inline `iso` for dates already seen and call the decoder only for the others.
    """

    def __init__(self, stats: v.DecodeStats, zone: str, unicode: bool) -> None:
        self.stats, self.zone, self.unicode = stats, zone, unicode
        self.seen: set[Any] = set()
        self.iso = ('x.replace(" ", "T")' if unicode else 'x.decode("ascii").replace(" ", "T")') + \
            (f" + {zone!r}" if zone else "")  # an expression of the value `x`

    def __call__(self, raw: Any) -> str | None:
        day = raw[:10]
        if day not in self.seen:
            if not _valid(day.encode("ascii") if self.unicode else day):
                self.stats.zero_dates += 1
                return None
            if len(self.seen) >= _SEEN_DATES:
                self.seen.clear()
            self.seen.add(day)
        text = raw if self.unicode else raw.decode("ascii")
        return f"{text.replace(' ', 'T')}{self.zone}"


def _text(encoding: str) -> TextDecoder:
    if encoding != "cp1252":
        return operator.methodcaller("decode", encoding)  # no Python frame per value

    def decode(raw: bytes) -> str:
        return v.decode_text(raw, encoding)

    return decode


def _set(encoding: str) -> TextDecoder:
    def decode(raw: bytes | str) -> list[str]:
        text = raw if isinstance(raw, str) else v.decode_text(raw, encoding)
        return text.split(",") if text else []

    return decode


def _json(raw: bytes | str) -> str:
    # MySQL prints JSON with the separators json.dumps uses; re-dumping fixes key order too.
    return json.dumps(json.loads(raw), ensure_ascii=False)


def _same(value: Any) -> Any:
    return value


def _member_codec(col: Column) -> str:
    """The codec of an ENUM's or a SET's members."""
    return col.ctype.encoding or CODECS.get(col.charset or "", "utf-8")


def _unicode_safe(col: Column) -> bool:
    """Whether asyncmy's `use_unicode` reading gives this column what binlake reads: UTF-8 text
    decoded, binary strings left bytes (the server marks those charset 63)."""
    code = col.ctype.code
    if code in _TEXT_CODES:
        return col.ctype.encoding == "utf-8" if col.ctype.encoding else col.charset == "binary"
    if code in (v.ENUM, v.SET):  # sent as strings in the column's charset
        return CODECS.get(col.charset or "") == "utf-8"
    # numbers, temporal values, BIT, GEOMETRY, MySQL's JSON (always UTF-8); not VECTOR's float32
    # bytes, which asyncmy does not know to leave alone
    return code != v.VECTOR


def reads_unicode(columns: tuple[Column, ...]) -> bool:
    """Whether asyncmy may decode every text value of these columns as UTF-8 itself (its
    `use_unicode`): only when each column with a charset has a UTF-8 one, or is binary."""
    return all(map(_unicode_safe, columns))


def text_decoder_for(col: Column, stats: v.DecodeStats, *, unicode: bool = False) -> TextDecoder:
    """The decoder of one column's SELECT value; the SQL NULL never reaches it.

    The value is the server's bytes, or with `unicode` (see `reads_unicode`) asyncmy's str for
    every value but binary strings, BIT and GEOMETRY, which stay bytes.
    """
    code = col.ctype.code
    if code in _INTEGERS:
        return int
    if code == v.FLOAT:
        return _float
    if code == v.DOUBLE:
        return float
    if code in (v.NEWDECIMAL, v.TIME, v.TIME2):
        return _same if unicode else _ascii
    if code in (v.DATE, v.DATETIME, v.DATETIME2):
        return _Temporal(stats, "", unicode)
    if code in (v.TIMESTAMP, v.TIMESTAMP2):
        return _Temporal(stats, "Z", unicode)  # the snapshot session runs with time_zone = '+00:00'
    if code in _TEXT_CODES:
        return _same if unicode or not col.ctype.encoding else _text(col.ctype.encoding)
    if code == v.ENUM:
        return _same if unicode else _text(_member_codec(col))
    if code == v.SET:
        return _set(_member_codec(col))
    if code == v.BIT:
        return _bit
    if code == v.JSON:
        return _json
    if code == v.GEOMETRY:
        return _same
    if code == v.VECTOR:
        return v.vector_value
    raise DecodeError(f"column {col.name} of type {col.type} cannot be snapshotted")


def _row_expression(columns: tuple[Column, ...], stats: v.DecodeStats, unicode: bool,
                    wrap: str | None) -> tuple[str, dict[str, Any]]:
    """The expression that decodes the row `r`, and the decoders (and date sets) it names."""
    names: dict[str, Any] = {}
    items = []
    for i, col in enumerate(columns):
        decoder = _same if col.ctype.code in RESULT_CONVERSIONS else text_decoder_for(col, stats, unicode=unicode)
        if decoder is _same:
            value = f"r[{i}]"
        elif isinstance(decoder, _Temporal):  # a date seen before needs no call
            names[f"d{i}"], names[f"s{i}"] = decoder, decoder.seen
            value = f"({decoder.iso} if (x := r[{i}])[:10] in s{i} else d{i}(x))"
            value = value if not col.nullable else f"None if r[{i}] is None else {value}"
        else:
            names[f"d{i}"] = decoder
            value = f"d{i}(r[{i}])" if not col.nullable else f"None if (x := r[{i}]) is None else d{i}(x)"
        items.append(f"{col.name!r}: {value}")  # a str literal, whatever the name holds
    row = f"{{{', '.join(items)}}}"
    return (row if wrap is None else f"{{{wrap!r}: {row}}}"), names


def _generated(template: str, expression: str, names: dict[str, Any]) -> Any:
    # The decoders are bound as defaults: read as fast locals, not as globals.
    params = "".join(f", {n}={n}" for n in names)
    scope = dict(names)
    exec(template.format(params=params, expression=expression), scope)
    return scope["decode"]


def row_decoder(columns: tuple[Column, ...], stats: v.DecodeStats, *, unicode: bool = False,
                wrap: str | None = None) -> Callable[[tuple[Any, ...]], dict[str, Any]]:
    """Decode one SELECT row (columns in schema order, as the snapshot connection returns it:
    `RESULT_CONVERSIONS` applied, text decoded when `unicode`) into the envelope's row dict,
    or into `{wrap: row}` (the change a snapshot row becomes).

    The function is generated for the column list, one expression per column, because
    the per-value loop is the snapshot's hot spot (3x faster than zip over decoders);
    values already final are taken as they are.
    """
    expression, names = _row_expression(columns, stats, unicode, wrap)
    decode: Callable[[tuple[Any, ...]], dict[str, Any]] = _generated(
        "def decode(r{params}):\n    return {expression}\n", expression, names)
    return decode


def block_decoder(columns: tuple[Column, ...], stats: v.DecodeStats, *, unicode: bool = False,
                  wrap: str | None = None) -> Callable[[list[tuple[Any, ...]]], list[dict[str, Any]]]:
    """`row_decoder` for a block of rows: one call per block, not per row."""
    expression, names = _row_expression(columns, stats, unicode, wrap)
    decode: Callable[[list[tuple[Any, ...]]], list[dict[str, Any]]] = _generated(
        "def decode(rows{params}):\n    return [{expression} for r in rows]\n", expression, names)
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
    if t.code in (v.JSON, v.GEOMETRY, v.VECTOR):
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


def nbytes(value: bytes | str) -> int:
    """Bytes of a long value as read (str: its UTF-8 length, see `reads_unicode`)."""
    return len(value) if isinstance(value, bytes) or value.isascii() else len(value.encode())


def block_size(rows: list[tuple[Any, ...]], fixed: int, long: tuple[int, ...]) -> tuple[int, int]:
    """Bytes of a block of SELECT rows at most, measured as `row_size_check` says: all of them,
    and a bound of the largest row (at least 1): the sum of each long column's largest value."""
    total, largest = fixed * len(rows), fixed
    for i in long:
        values = list(filter(None, map(operator.itemgetter(i), rows)))
        if not values:
            continue
        ascii_only = isinstance(values[0], bytes) or all(map(str.isascii, values))  # one type per column
        sizes = list(map(len if ascii_only else nbytes, values))
        if sizes:
            total += sum(sizes)
            largest += max(sizes)
    return total, max(largest, 1)

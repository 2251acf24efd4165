"""Snapshot text decoders: the server's text-protocol bytes -> the same values the binlog decoders give (pure)."""

from __future__ import annotations

import calendar
import struct
from typing import Any

import pytest

from services.parser import values as v
from services.parser.columns import Column, build_column
from services.parser.snapshot.catalog import key_param
from services.parser.snapshot.values import (
    block_decoder,
    block_size,
    nbytes,
    reads_unicode,
    row_decoder,
    row_size_check,
    text_decoder_for,
)
from services.parser.values import ColumnType, DecodeStats, decoder_for
from shared.errors import DecodeError
from tests.unit.parser.test_values import (
    date_bin,
    datetime2_bin,
    decimal_bin,
    prefixed,
    time2_bin,
    time_packed,
    timestamp2_bin,
)

UTF8 = "utf8mb4_general_ci"
LATIN1 = "latin1_swedish_ci"


def col(code: int, *, collation: str = "", name: str = "c", **kw: Any) -> Column:
    return build_column(name, code, True, collation=collation, **kw)


def text(c: Column, raw: bytes, stats: DecodeStats | None = None) -> Any:
    return text_decoder_for(c, stats if stats is not None else DecodeStats())(raw)


def binlog(c: Column, data: bytes, stats: DecodeStats | None = None) -> Any:
    """The binlog path's value of the same column, from its row-image bytes."""
    value, end = decoder_for(c.ctype, stats if stats is not None else DecodeStats())(data, 0)
    assert end == len(data)
    return value


def same(c: Column, raw: bytes, data: bytes) -> Any:
    """Decode both ways, check they agree (value and type), return the value."""
    ours, theirs = text(c, raw), binlog(c, data)
    assert ours == theirs
    assert type(ours) is type(theirs)
    return ours


# -- numbers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "unsigned", "fmt", "value"),
    [
        (v.TINY, False, "<b", -128), (v.TINY, True, "<B", 255), (v.SHORT, False, "<h", -32768),
        (v.SHORT, True, "<H", 65535), (v.LONG, False, "<i", -2147483648), (v.LONG, True, "<I", 4294967295),
        (v.LONGLONG, False, "<q", -9223372036854775808), (v.LONGLONG, True, "<Q", 18446744073709551615),
        (v.LONGLONG, False, "<q", 0),
    ],
)
def test_integers(code: int, unsigned: bool, fmt: str, value: int) -> None:
    assert same(col(code, unsigned=unsigned), str(value).encode(), struct.pack(fmt, value)) == value


@pytest.mark.parametrize("value", [-8388608, 8388607, -1])
def test_int24(value: int) -> None:
    assert same(col(v.INT24), str(value).encode(), value.to_bytes(3, "little", signed=True)) == value


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b"1.1", 1.1), (b"0.1", 0.1), (b"-3.40282e38", -3.40282e38), (b"3.1415927", 3.1415927), (b"0", 0.0),
     (b"1e-45", 1e-45), (b"16777216", 16777216.0)],
)
def test_float_is_the_shortest_float32(raw: bytes, expected: float) -> None:
    c = col(v.FLOAT)
    got = same(c, raw, struct.pack("<f", float(raw)))
    assert got == expected


@pytest.mark.parametrize("raw", [b"0.1", b"-1.7976931348623157e308", b"5e-324", b"123456789.12345679", b"-0"])
def test_double(raw: bytes) -> None:
    assert same(col(v.DOUBLE), raw, struct.pack("<d", float(raw))) == float(raw)


@pytest.mark.parametrize(
    ("text_value", "precision", "scale"),
    [("-12.50", 10, 2), ("0.00", 10, 2), ("12345678901234567890.123456789", 30, 9), ("7", 5, 0),
     ("-0.000000001", 12, 9), ("99999999999999999999999999999999999.999999999999999999999999999999", 65, 30)],
)
def test_decimal_text_is_kept(text_value: str, precision: int, scale: int) -> None:
    c = col(v.NEWDECIMAL, precision=precision, scale=scale)
    assert same(c, text_value.encode(), decimal_bin(text_value, precision, scale)) == text_value


# -- temporal types -----------------------------------------------------------------------------


@pytest.mark.parametrize("ymd", [(2024, 2, 29), (1, 1, 1), (9999, 12, 31), (2023, 1, 28), (2023, 4, 30)])
def test_date(ymd: tuple[int, int, int]) -> None:
    raw = "{:04d}-{:02d}-{:02d}".format(*ymd).encode()
    assert same(col(v.DATE), raw, date_bin(*ymd)) == raw.decode()


@pytest.mark.parametrize("ymd", [(0, 0, 0), (2023, 2, 29), (2024, 0, 10), (2024, 1, 0), (0, 1, 1), (2024, 4, 31),
                                 (2024, 13, 1)])
def test_zero_or_invalid_date_is_null_and_counted(ymd: tuple[int, int, int]) -> None:
    raw = "{:04d}-{:02d}-{:02d}".format(*ymd).encode()
    ours, theirs = DecodeStats(), DecodeStats()
    assert text(col(v.DATE), raw, ours) is None
    assert binlog(col(v.DATE), date_bin(*ymd), theirs) is None
    assert ours.zero_dates == theirs.zero_dates == 1


@pytest.mark.parametrize(
    ("raw", "fsp", "parts", "expected"),
    [
        (b"2024-01-02 03:04:05", 0, (2024, 1, 2, 3, 4, 5, 0), "2024-01-02T03:04:05"),
        (b"2024-01-02 03:04:05.123456", 6, (2024, 1, 2, 3, 4, 5, 123456), "2024-01-02T03:04:05.123456"),
        (b"1000-01-01 00:00:00.5", 1, (1000, 1, 1, 0, 0, 0, 500000), "1000-01-01T00:00:00.5"),
        (b"9999-12-31 23:59:59.999", 3, (9999, 12, 31, 23, 59, 59, 999000), "9999-12-31T23:59:59.999"),
    ],
)
def test_datetime_uses_a_t_separator(raw: bytes, fsp: int, parts: tuple[int, int, int, int, int, int, int],
                                     expected: str) -> None:
    c = col(v.DATETIME2, fsp=fsp)
    assert same(c, raw, datetime2_bin(*parts, fsp)) == expected


@pytest.mark.parametrize("raw", [b"0000-00-00 00:00:00", b"2023-02-30 10:00:00", b"2023-00-01 00:00:00.000"])
def test_zero_or_invalid_datetime_is_null_and_counted(raw: bytes) -> None:
    stats = DecodeStats()
    assert text(col(v.DATETIME2, fsp=0), raw, stats) is None
    assert stats.zero_dates == 1


@pytest.mark.parametrize(
    ("raw", "fsp", "micro"),
    [(b"2024-01-02 03:04:05", 0, 0), (b"1970-01-01 00:00:01.000001", 6, 1), (b"2038-01-19 03:14:07.12", 2, 120000)],
)
def test_timestamp_is_utc_with_a_z(raw: bytes, fsp: int, micro: int) -> None:
    c = col(v.TIMESTAMP2, fsp=fsp)
    fields = [int(raw[a:b]) for a, b in ((0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19))]
    secs = calendar.timegm((*fields, 0, 0, 0))
    got = same(c, raw, timestamp2_bin(secs, micro, fsp))
    assert got == raw[:10].decode() + "T" + raw[11:].decode() + "Z"


def test_zero_timestamp_is_null_and_counted() -> None:
    stats = DecodeStats()
    assert text(col(v.TIMESTAMP2, fsp=3), b"0000-00-00 00:00:00.000", stats) is None
    assert stats.zero_dates == 1


@pytest.mark.parametrize(
    ("raw", "fsp"),
    [(b"-838:59:59", 0), (b"838:59:59", 0), (b"00:00:00", 0), (b"-00:00:00.5", 1), (b"12:34:56.789012", 6),
     (b"-01:00:00.000001", 6), (b"100:00:00.12", 2)],
)
def test_time_text_is_kept(raw: bytes, fsp: int) -> None:
    c = col(v.TIME2, fsp=fsp)
    assert same(c, raw, time2_bin(time_packed(raw.decode()), fsp)) == raw.decode()


def test_old_temporal_codes() -> None:
    assert text(col(v.TIME), b"-01:02:03") == "-01:02:03"
    assert text(col(v.DATETIME), b"2024-01-02 03:04:05") == "2024-01-02T03:04:05"
    assert text(col(v.TIMESTAMP), b"2024-01-02 03:04:05") == "2024-01-02T03:04:05Z"


@pytest.mark.parametrize(("raw", "byte", "expected"), [(b"0000", 0, 0), (b"1901", 1, 1901), (b"2155", 255, 2155)])
def test_year(raw: bytes, byte: int, expected: int) -> None:
    assert same(col(v.YEAR, unsigned=True), raw, bytes([byte])) == expected


# -- strings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("collation", "raw", "expected"),
    [
        (LATIN1, b"caf\xe9 \x80", "caf\u00e9 \u20ac"),
        (LATIN1, b"a\x81\x8d\x8f\x90\x9db", "a\x81\x8d\x8f\x90\x9db"),  # bytes cp1252 leaves undefined
        (UTF8, "h\u00e9llo \U0001f389 \u4e2d".encode(), "h\u00e9llo \U0001f389 \u4e2d"),
        (UTF8, b"", ""),
        ("utf8mb3_general_ci", "\u00fc".encode(), "\u00fc"),
        ("ascii_general_ci", b"plain", "plain"),
        ("latin2_general_ci", b"\xb1", "\u0105"),
    ],
)
@pytest.mark.parametrize("code", [v.VARCHAR, v.STRING])
def test_text_in_the_column_charset(code: int, collation: str, raw: bytes, expected: str) -> None:
    c = col(code, collation=collation, length=80)
    assert same(c, raw, prefixed(raw, 1)) == expected


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_text_and_blob_lobs(size: int) -> None:
    value = "\u00fcber \U0001f600"
    assert same(col(v.BLOB, collation=UTF8, length=size), value.encode(), prefixed(value.encode(), size)) == value
    raw = bytes(range(200))
    assert same(col(v.BLOB, collation="binary", length=size), raw, prefixed(raw, size)) == raw


def test_binary_keeps_its_zero_padding() -> None:
    """SELECT returns BINARY(n) padded to n bytes; the binlog decoder pads the stripped image."""
    c = col(v.STRING, collation="binary", length=4)
    assert same(c, b"\x01\x00\x00\x00", prefixed(b"\x01", 1)) == b"\x01\x00\x00\x00"
    assert same(c, b"\x00\x00\x00\x00", prefixed(b"", 1)) == b"\x00\x00\x00\x00"


def test_varbinary_is_bytes() -> None:
    c = col(v.VARCHAR, collation="binary", length=8)
    assert same(c, b"\x01\x00", prefixed(b"\x01\x00", 1)) == b"\x01\x00"
    assert text(c, b"") == b""


def test_geometry_is_bytes() -> None:
    point = struct.pack("<I", 4326) + bytes.fromhex("0101000000") + struct.pack("<dd", 1.5, -2.25)
    c = col(v.GEOMETRY, collation=UTF8, length=4)
    assert same(c, point, prefixed(point, 4)) == point


# -- ENUM / SET / BIT / JSON --------------------------------------------------------------------


MEMBERS = ("a", "b", "caf\u00e9", "it's")


@pytest.mark.parametrize(("collation", "raw", "idx"), [(UTF8, b"b", 2), (UTF8, "caf\u00e9".encode(), 3),
                                                       (LATIN1, b"caf\xe9", 3), (UTF8, b"it's", 4), (UTF8, b"", 0)])
def test_enum_is_its_member(collation: str, raw: bytes, idx: int) -> None:
    c = col(v.ENUM, collation=collation, length=1, members=MEMBERS)
    got = same(c, raw, bytes([idx]))
    assert got == ("", *MEMBERS)[idx]


def test_enum_without_a_charset_decodes_as_utf8() -> None:
    assert text(col(v.ENUM, length=1, members=("\u00e9",)), "\u00e9".encode()) == "\u00e9"


@pytest.mark.parametrize(
    ("raw", "bits", "expected"),
    [(b"", 0, []), (b"x", 0b001, ["x"]), (b"x,z", 0b101, ["x", "z"]), (b"x,y,z", 0b111, ["x", "y", "z"])],
)
def test_set_is_a_list_of_members(raw: bytes, bits: int, expected: list[str]) -> None:
    c = col(v.SET, collation=UTF8, length=1, members=("x", "y", "z"))
    assert same(c, raw, bytes([bits])) == expected


def test_latin1_set_members() -> None:
    c = col(v.SET, collation=LATIN1, length=1, members=("\u00e9t\u00e9", "\u20ac"))
    assert same(c, b"\xe9t\xe9,\x80", bytes([0b11])) == ["\u00e9t\u00e9", "\u20ac"]


@pytest.mark.parametrize(
    ("raw", "nbits", "expected"),
    [(b"\x15", 5, 21), (b"\x00", 1, 0), (b"\x02\x01", 10, 513), (b"\xff" * 8, 64, 2**64 - 1)],
)
def test_bit_is_an_int(raw: bytes, nbits: int, expected: int) -> None:
    assert same(col(v.BIT, length=nbits), raw, raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"a": 1, "b": [true, null, 2.5]}', '{"a": 1, "b": [true, null, 2.5]}'),
        (b'{"a":1,"b":"x"}', '{"a": 1, "b": "x"}'),
        ('{"k": "caf\u00e9 \U0001f389"}'.encode(), '{"k": "caf\u00e9 \U0001f389"}'),
        (b'"\\u00e9"', '"\u00e9"'),
        (b"null", "null"),
        (b"[]", "[]"),
        (b"12", "12"),
    ],
)
def test_json_is_re_dumped(raw: bytes, expected: str) -> None:
    assert text(col(v.JSON, length=4), raw) == expected


def test_unsupported_type_is_a_decode_error() -> None:
    c = Column("odd", "type99", True, ColumnType(99))
    with pytest.raises(DecodeError, match="column odd of type type99 cannot be snapshotted"):
        text_decoder_for(c, DecodeStats())


# -- rows -------------------------------------------------------------------------------------------


def test_row_decoder_maps_columns_in_order_and_null_to_none() -> None:
    columns = (
        col(v.LONG, name="id"),
        col(v.VARCHAR, name="note", collation=LATIN1, length=20),
        col(v.DATETIME2, name="at", fsp=0),
        col(v.SET, name="tags", collation=UTF8, length=1, members=("x", "y")),
        col(v.VARCHAR, name="bin", collation="binary", length=8),
        col(v.FLOAT, name="f"),
    )
    stats = DecodeStats()
    decode = row_decoder(columns, stats)
    got = decode((7, b"caf\xe9", b"0000-00-00 00:00:00", b"", b"\x00", b"1.1"))  # ints come parsed
    assert got == {"id": 7, "note": "caf\u00e9", "at": None, "tags": [], "bin": b"\x00", "f": 1.1}
    assert list(got) == ["id", "note", "at", "tags", "bin", "f"]
    assert stats.zero_dates == 1
    assert decode((None,) * 6) == dict.fromkeys(["id", "note", "at", "tags", "bin", "f"])
    assert stats.zero_dates == 1  # NULL never reaches the decoder


def test_row_decoder_treats_empty_values_as_values_not_null() -> None:
    decode = row_decoder((col(v.VARCHAR, name="s", collation=UTF8, length=4), col(v.LONG, name="n")), DecodeStats())
    assert decode((b"", 0)) == {"s": "", "n": 0}


def test_row_decoder_with_odd_column_names() -> None:
    names = ["a'b", 'q"uote', "new\nline", "x}y", "d0", "k0", "r"]
    columns = tuple(col(v.LONG, name=n) for n in names)
    decode = row_decoder(columns, DecodeStats())
    assert decode(tuple(range(len(names)))) == {n: i for i, n in enumerate(names)}


def test_row_decoder_of_no_columns() -> None:
    assert row_decoder((), DecodeStats())(()) == {}


def test_row_decoder_equals_the_binlog_row() -> None:
    """One row of mixed types: SELECT bytes and binlog row-image bytes give the same dict."""
    columns = (
        col(v.LONG, name="id"), col(v.NEWDECIMAL, name="amount", precision=10, scale=2),
        col(v.TIMESTAMP2, name="ts", fsp=3), col(v.ENUM, name="e", collation=UTF8, length=1, members=("p", "q")),
        col(v.BIT, name="flags", length=8), col(v.YEAR, name="y", unsigned=True),
    )
    select = (-5, b"3.10", b"2001-09-09 01:46:40.250", b"q", b"\x15", 0)  # as the snapshot connection parses them
    images = (struct.pack("<i", -5), decimal_bin("3.10", 10, 2), timestamp2_bin(1_000_000_000, 250_000, 3),
              b"\x02", b"\x15", b"\x00")
    stats = DecodeStats()
    from_select = row_decoder(columns, stats)(select)
    from_binlog = {c.name: binlog(c, data) for c, data in zip(columns, images, strict=True)}
    assert from_select == from_binlog
    assert from_select["ts"] == "2001-09-09T01:46:40.250Z"


def test_row_decoder_with_unicode_text_wraps_the_row_as_a_change_and_equals_the_bytes_path() -> None:
    """A table of UTF-8 text: asyncmy hands str (binary strings, BIT and GEOMETRY stay bytes)."""
    columns = (
        col(v.LONG, name="id"), col(v.NEWDECIMAL, name="amount", precision=10, scale=2),
        col(v.DATETIME2, name="at", fsp=3), col(v.TIMESTAMP2, name="ts", fsp=0), col(v.DATE, name="day"),
        col(v.VARCHAR, name="note", collation=UTF8, length=40), col(v.ENUM, name="e", collation=UTF8, length=1,
                                                                   members=("p", "q")),
        col(v.SET, name="tags", collation=UTF8, length=1, members=("x", "y")), col(v.BIT, name="flags", length=8),
        col(v.VARCHAR, name="bin", collation="binary", length=8), col(v.FLOAT, name="f"), col(v.TIME2, name="t"),
        col(v.JSON, name="doc", length=4), col(v.DOUBLE, name="d"),
    )
    assert reads_unicode(columns)
    as_bytes = (7, b"3.10", b"2001-09-09 01:46:40.250", b"0000-00-00 00:00:00", b"2020-02-29", "é😀".encode(),
                b"q", b"x,y", b"\x15", b"\xff\x00", b"1.1", b"-01:02:03", b'{"b": 1, "a": "\xc3\xa9"}', 0.5)
    as_str = (7, "3.10", "2001-09-09 01:46:40.250", "0000-00-00 00:00:00", "2020-02-29", "é😀", "q", "x,y",
              b"\x15", b"\xff\x00", "1.1", "-01:02:03", '{"b": 1, "a": "é"}', 0.5)
    raw_stats, uni_stats = DecodeStats(), DecodeStats()
    from_bytes = row_decoder(columns, raw_stats)(as_bytes)
    from_str = row_decoder(columns, uni_stats, unicode=True, wrap="after")(as_str)
    assert from_str == {"after": from_bytes}
    block = block_decoder(columns, DecodeStats(), unicode=True, wrap="after")
    assert block([as_str, as_str]) == [from_str, from_str] and block([]) == []
    assert from_bytes["at"] == "2001-09-09T01:46:40.250" and from_bytes["ts"] is None
    assert from_bytes["tags"] == ["x", "y"] and from_bytes["flags"] == 0x15
    assert from_bytes["doc"] == '{"b": 1, "a": "é"}'
    assert raw_stats.zero_dates == uni_stats.zero_dates == 1
    nulls = row_decoder(tuple(c for c in columns if c.nullable), DecodeStats(), unicode=True)
    assert set(nulls((None,) * len([c for c in columns if c.nullable])).values()) == {None}


def test_only_tables_whose_text_is_all_utf8_are_read_as_unicode() -> None:
    utf8 = col(v.VARCHAR, name="a", collation=UTF8, length=4)
    assert reads_unicode((col(v.LONG), col(v.BLOB, collation="binary", length=2), utf8))
    assert not reads_unicode((utf8, col(v.VARCHAR, name="b", collation=LATIN1, length=4)))
    assert not reads_unicode((col(v.ENUM, collation=LATIN1, length=1, members=("a",)),))
    # asyncmy would leave these bytes (charset 63) or decode them as UTF-8 where binlake does not.
    assert not reads_unicode((col(v.ENUM, collation="binary", length=1, members=("a",)),))
    assert not reads_unicode((col(v.VARCHAR, collation="dec8_swedish_ci", length=4),))  # a charset without a codec
    assert not reads_unicode((col(v.VARCHAR, length=4),))  # no collation known
    assert reads_unicode((col(v.SET, collation="utf8mb3_general_ci", length=1, members=("a",)), col(v.BIT, length=1),
                          col(v.GEOMETRY, length=4), col(v.JSON, length=4)))


def test_block_size_measures_utf8_bytes_and_bounds_the_largest_row() -> None:
    columns = (col(v.LONG, name="id"), col(v.BLOB, name="t", collation=UTF8, length=4),
               col(v.BLOB, name="b", collation="binary", length=4))
    fixed, long = row_size_check(columns, 100) or (0, ())
    assert long == (1, 2)
    rows = [(1, "ab", b"x" * 10), (2, "é" * 5, None), (3, "", b"")]
    assert [nbytes(x) for x in ("ab", "é" * 5, b"\xff")] == [2, 10, 1]
    total, largest = block_size(rows, fixed, long)
    assert total == 3 * fixed + 2 + 10 + 10
    assert largest == fixed + 10 + 10  # no row is larger (the sum of each column's largest)
    assert block_size([(1, "", None)], 0, long) == (0, 1)  # a bound that can divide a budget


def test_key_param_takes_what_the_connection_made_of_a_key() -> None:
    assert key_param(col(v.LONG), 5) == 5
    assert key_param(col(v.VARCHAR, collation=UTF8, length=8), "é") == "é"
    assert key_param(col(v.VARCHAR, collation=LATIN1, length=8), b"caf\xe9") == "café"
    assert key_param(col(v.NEWDECIMAL, precision=5, scale=2), "1.50") == "1.50"
    assert key_param(col(v.NEWDECIMAL, precision=5, scale=2), b"1.50") == "1.50"
    assert key_param(col(v.VARCHAR, collation="binary", length=8), b"\x00") == b"\x00"

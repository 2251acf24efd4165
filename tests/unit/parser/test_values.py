"""Value decoders fed hand-built row-image bytes in MySQL's binary formats (DESIGN §4 value mapping)."""

from __future__ import annotations

import calendar
import random
import re
import struct
from typing import Any

import pytest

from services.parser import values as v
from services.parser.values import ColumnType, DecodeStats, decoder_for, shortest_float32, time_text
from shared.errors import DecodeError

DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def decode(ctype: ColumnType, data: bytes, stats: DecodeStats | None = None) -> Any:
    """Decode `data` surrounded by junk bytes; checks the decoder consumes exactly `data`."""
    buf = b"\xaa" + data + b"\xbb\xcc"
    value, end = decoder_for(ctype, stats if stats is not None else DecodeStats())(buf, 1)
    assert end == 1 + len(data)
    return value


# -- reference encoders (following the server's own code) -----------------------------------------


def decimal_bin(text: str, precision: int, scale: int) -> bytes:
    """MySQL decimal2bin: 9-digit groups in 4 big-endian bytes, partial groups per DIG2BYTES."""
    negative = text.startswith("-")
    whole, _, frac = text.lstrip("-").partition(".")
    intg = precision - scale
    whole = whole.lstrip("0").rjust(intg, "0")
    frac = frac.ljust(scale, "0")
    assert len(whole) == intg and len(frac) == scale
    intg0, intg0x = divmod(intg, 9)
    frac0, frac0x = divmod(scale, 9)
    out = bytearray()
    if intg0x:
        out += int(whole[:intg0x]).to_bytes(DIG2BYTES[intg0x], "big")
    for k in range(intg0):
        out += int(whole[intg0x + 9 * k : intg0x + 9 * k + 9]).to_bytes(4, "big")
    for k in range(frac0):
        out += int(frac[9 * k : 9 * k + 9]).to_bytes(4, "big")
    if frac0x:
        out += int(frac[9 * frac0 :]).to_bytes(DIG2BYTES[frac0x], "big")
    if negative:
        out = bytearray(b ^ 0xFF for b in out)
    out[0] ^= 0x80
    return bytes(out)


def c_mod(a: int, b: int) -> int:
    """C's `%`: the remainder has the sign of the dividend."""
    r = abs(a) % b
    return -r if a < 0 else r


def c_div(a: int, b: int) -> int:
    """C's integer `/`: truncates toward zero."""
    q = abs(a) // b
    return -q if a < 0 else q


def time_packed(text: str) -> int:
    """`[-]H:MM:SS[.ffffff]` -> MySQL's packed TIME ((hms << 24) + micro, sign applied)."""
    m = re.fullmatch(r"(-?)(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?", text)
    assert m
    sign, h, mi, s, frac = m.groups()
    micro = int((frac or "").ljust(6, "0"))
    packed = ((int(h) << 12 | int(mi) << 6 | int(s)) << 24) + micro
    return -packed if sign else packed


def time2_bin(packed: int, fsp: int) -> bytes:
    """my_time_packed_to_binary (sql-common/my_time.cc), C integer semantics included."""
    int_part = packed >> 24  # MY_PACKED_TIME_GET_INT_PART: arithmetic shift
    frac_part = c_mod(packed, 1 << 24)  # MY_PACKED_TIME_GET_FRAC_PART: C remainder
    if fsp in (1, 2):
        return (int_part + 0x800000).to_bytes(3, "big") + bytes([c_div(frac_part, 10_000) & 0xFF])
    if fsp in (3, 4):
        return (int_part + 0x800000).to_bytes(3, "big") + (c_div(frac_part, 100) & 0xFFFF).to_bytes(2, "big")
    if fsp in (5, 6):
        return (packed + 0x800000000000).to_bytes(6, "big")
    return (int_part + 0x800000).to_bytes(3, "big")


def frac_bin(micro: int, fsp: int) -> bytes:
    n = (fsp + 1) // 2
    return (micro // {0: 1, 1: 10_000, 2: 100, 3: 1}[n]).to_bytes(n, "big") if n else b""


def datetime2_bin(y: int, mo: int, d: int, h: int, mi: int, s: int, micro: int, fsp: int) -> bytes:
    ymd = ((y * 13 + mo) << 5) | d
    hms = (h << 12) | (mi << 6) | s
    return (((ymd << 17) | hms) + 0x8000000000).to_bytes(5, "big") + frac_bin(micro, fsp)


def timestamp2_bin(secs: int, micro: int, fsp: int) -> bytes:
    return secs.to_bytes(4, "big") + frac_bin(micro, fsp)


def date_bin(y: int, m: int, d: int) -> bytes:
    return (y << 9 | m << 5 | d).to_bytes(3, "little")


# -- integers and floats ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "unsigned", "size", "value"),
    [
        (v.TINY, False, 1, -128), (v.TINY, False, 1, 127), (v.TINY, True, 1, 0), (v.TINY, True, 1, 255),
        (v.SHORT, False, 2, -32768), (v.SHORT, False, 2, 32767), (v.SHORT, True, 2, 65535),
        (v.INT24, False, 3, -8388608), (v.INT24, False, 3, 8388607), (v.INT24, False, 3, -1),
        (v.INT24, True, 3, 16777215),
        (v.LONG, False, 4, -2147483648), (v.LONG, False, 4, 2147483647), (v.LONG, True, 4, 4294967295),
        (v.LONGLONG, False, 8, -9223372036854775808), (v.LONGLONG, False, 8, 9223372036854775807),
        (v.LONGLONG, True, 8, 18446744073709551615), (v.LONGLONG, True, 8, 0),
    ],
)
def test_integers(code, unsigned, size, value):
    data = value.to_bytes(size, "little", signed=not unsigned)
    assert decode(ColumnType(code, unsigned=unsigned), data) == value


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (1.1, 1.1), (0.1, 0.1), (-2.5, -2.5), (0.3, 0.3), (3.4028235e38, 3.4028235e38), (123456.7, 123456.7),
        (16777217.0, 16777216.0), (1.17549435e-38, 1.1754944e-38), (0.0, 0.0), (-0.0, -0.0),
        (1 / 3, 0.33333334), (2.0**-20, 9.536743e-07),
    ],
)
def test_float_is_shortest_float32_repr(x, expected):
    got = decode(ColumnType(v.FLOAT), struct.pack("<f", x))
    assert repr(got) == repr(expected)
    assert repr(shortest_float32(f32(x))) == repr(expected)


@pytest.mark.parametrize(("x", "expected"), [(1e-45, 1e-45), (3e-45, 3e-45), (1e-40, 1e-40)])
def test_shortest_float32_subnormal(x, expected):
    assert repr(shortest_float32(f32(x))) == repr(expected)


@pytest.mark.parametrize("x", [1.1, -2.5e-300, 1.7976931348623157e308, 0.1 + 0.2])
def test_double(x):
    assert decode(ColumnType(v.DOUBLE), struct.pack("<d", x)) == x


# -- DECIMAL --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "scale", "text", "expected"),
    [
        (10, 2, "0", "0.00"),
        (10, 2, "1.5", "1.50"),
        (10, 2, "-12.50", "-12.50"),
        (10, 2, "99999999.99", "99999999.99"),
        (10, 2, "-99999999.99", "-99999999.99"),
        (10, 2, "-0.00", "0.00"),
        (10, 2, "0.01", "0.01"),
        (10, 2, "-0.01", "-0.01"),
        (5, 0, "0", "0"),
        (5, 0, "12345", "12345"),
        (5, 0, "-99999", "-99999"),
        (5, 0, "-0", "0"),
        (18, 9, "123456789.123456789", "123456789.123456789"),
        (18, 9, "-0.000000001", "-0.000000001"),
        (18, 9, "1", "1.000000000"),
        (5, 5, "0.12345", "0.12345"),
        (5, 5, "-0.00001", "-0.00001"),
        (65, 30, "12345678901234567890123456789012345.123456789012345678901234567890",
         "12345678901234567890123456789012345.123456789012345678901234567890"),
        (65, 30, "-99999999999999999999999999999999999.999999999999999999999999999999",
         "-99999999999999999999999999999999999.999999999999999999999999999999"),
        (65, 30, "1000000000.000000000000000000000000000001", "1000000000.000000000000000000000000000001"),
        (65, 30, "0", "0." + "0" * 30),
        (20, 0, "18446744073709551615", "18446744073709551615"),
    ],
)
def test_decimal(precision, scale, text, expected):
    data = decimal_bin(text, precision, scale)
    intg, frac = precision - scale, scale
    size = intg // 9 * 4 + DIG2BYTES[intg % 9] + frac // 9 * 4 + DIG2BYTES[frac % 9]
    assert len(data) == size
    assert decode(ColumnType(v.NEWDECIMAL, precision=precision, scale=scale), data) == expected


def test_decimal_random_values_of_every_shape_round_trip():
    """Every precision and scale, random digits and signs: the decoder gives back the text encoded."""
    rnd = random.Random(5)
    for precision in range(1, 66):
        for scale in sorted({s for s in (0, 1, 2, 30, rnd.randint(0, 30)) if s <= precision}):
            decoder = decoder_for(ColumnType(v.NEWDECIMAL, precision=precision, scale=scale), DecodeStats())
            for _ in range(20):
                whole = str(rnd.randrange(10 ** rnd.randint(0, precision - scale))) if precision > scale else "0"
                frac = "".join(rnd.choice("0123456789") for _ in range(scale))
                negative = rnd.random() < 0.5
                text = ("-" if negative else "") + whole + ("." + frac if scale else "")
                want = text if not negative or (whole.strip("0") or frac.strip("0")) else text[1:]
                assert decoder(decimal_bin(text, precision, scale), 0)[0] == want, (precision, scale, text)


def test_decimal_reference_encoder_matches_mysql_docs():
    # The MySQL manual's example: 1234567890.1234 as DECIMAL(14,4) -> 81 0D FB 38 D2 04 D2.
    assert decimal_bin("1234567890.1234", 14, 4) == bytes.fromhex("810DFB38D204D2")
    assert decimal_bin("-1234567890.1234", 14, 4) == bytes.fromhex("7EF204C72DFB2D")


# -- dates and times ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ymd", "expected"),
    [((2021, 2, 28), "2021-02-28"), ((1000, 1, 1), "1000-01-01"), ((9999, 12, 31), "9999-12-31"),
     ((2024, 2, 29), "2024-02-29")],
)
def test_date(ymd, expected):
    stats = DecodeStats()
    assert decode(ColumnType(v.DATE), date_bin(*ymd), stats) == expected
    assert stats.zero_dates == 0


@pytest.mark.parametrize("ymd", [(0, 0, 0), (2021, 2, 30), (2023, 2, 29), (2021, 0, 1), (2021, 1, 0), (0, 1, 1)])
def test_date_zero_or_invalid_is_null_and_counted(ymd):
    stats = DecodeStats()
    assert decode(ColumnType(v.DATE), date_bin(*ymd), stats) is None
    assert stats.zero_dates == 1


@pytest.mark.parametrize(
    ("parts", "fsp", "expected"),
    [
        ((2020, 1, 2, 3, 4, 5, 120_000), 3, "2020-01-02T03:04:05.120"),
        ((1000, 1, 1, 0, 0, 0, 0), 0, "1000-01-01T00:00:00"),
        ((9999, 12, 31, 23, 59, 59, 999_999), 6, "9999-12-31T23:59:59.999999"),
        ((2020, 1, 2, 3, 4, 5, 0), 1, "2020-01-02T03:04:05.0"),
        ((2020, 1, 2, 3, 4, 5, 500_000), 1, "2020-01-02T03:04:05.5"),
        ((2020, 1, 2, 3, 4, 5, 990_000), 2, "2020-01-02T03:04:05.99"),
        ((2020, 1, 2, 3, 4, 5, 123_400), 4, "2020-01-02T03:04:05.1234"),
        ((2020, 1, 2, 3, 4, 5, 123_450), 5, "2020-01-02T03:04:05.12345"),
        ((2020, 1, 2, 3, 4, 5, 1), 6, "2020-01-02T03:04:05.000001"),
    ],
)
def test_datetime2(parts: tuple[int, ...], fsp: int, expected: Any) -> None:
    y, mo, d, h, mi, sec, micro = parts
    assert decode(ColumnType(v.DATETIME2, fsp=fsp), datetime2_bin(y, mo, d, h, mi, sec, micro, fsp)) == expected


@pytest.mark.parametrize("fsp", range(7))
def test_datetime2_zero_is_null(fsp):
    stats = DecodeStats()
    assert decode(ColumnType(v.DATETIME2, fsp=fsp), datetime2_bin(0, 0, 0, 0, 0, 0, 0, fsp), stats) is None
    assert stats.zero_dates == 1


@pytest.mark.parametrize(
    ("parts", "fsp", "expected"),
    [
        ((1970, 1, 1, 0, 0, 1, 0), 0, "1970-01-01T00:00:01Z"),
        ((2038, 1, 19, 3, 14, 7, 999_999), 6, "2038-01-19T03:14:07.999999Z"),
        ((2020, 1, 2, 3, 4, 5, 500_000), 1, "2020-01-02T03:04:05.5Z"),
        ((2020, 1, 2, 3, 4, 5, 10_000), 2, "2020-01-02T03:04:05.01Z"),
        ((2020, 1, 2, 3, 4, 5, 120_000), 3, "2020-01-02T03:04:05.120Z"),
        ((2020, 1, 2, 3, 4, 5, 123_400), 4, "2020-01-02T03:04:05.1234Z"),
        ((2020, 1, 2, 3, 4, 5, 123_450), 5, "2020-01-02T03:04:05.12345Z"),
    ],
)
def test_timestamp2(parts, fsp, expected):
    *ymdhms, micro = parts
    secs = calendar.timegm((*ymdhms, 0, 0, 0))
    assert decode(ColumnType(v.TIMESTAMP2, fsp=fsp), timestamp2_bin(secs, micro, fsp)) == expected


@pytest.mark.parametrize("fsp", range(7))
def test_timestamp2_zero_is_null(fsp):
    stats = DecodeStats()
    assert decode(ColumnType(v.TIMESTAMP2, fsp=fsp), timestamp2_bin(0, 0, fsp), stats) is None
    assert stats.zero_dates == 1


@pytest.mark.parametrize(
    ("text", "fsp"),
    [
        ("00:00:00", 0), ("838:59:59", 0), ("-838:59:59", 0), ("-00:00:01", 0), ("12:34:56", 0),
        ("-00:00:00.5", 1), ("00:00:00.5", 1), ("-00:00:01.0", 1), ("-838:59:58.9", 1), ("-00:00:00.1", 1),
        ("-01:02:03.50", 2), ("-00:00:00.99", 2), ("-00:00:00.01", 2), ("-00:00:01.00", 2), ("10:00:00.01", 2),
        ("-00:00:00.001", 3), ("-12:34:56.789", 3), ("-01:00:00.000", 3), ("838:59:59.999", 3),
        ("-00:00:00.9999", 4), ("-00:00:05.0001", 4),
        ("-00:00:00.00001", 5), ("01:00:00.12345", 5),
        ("-00:00:00.000001", 6), ("-838:59:58.999999", 6), ("-00:00:01.000001", 6), ("838:59:59.000000", 6),
    ],
)
def test_time2(text, fsp):
    data = time2_bin(time_packed(text), fsp)
    assert len(data) == 3 + (fsp + 1) // 2
    assert decode(ColumnType(v.TIME2, fsp=fsp), data) == text


def test_time2_reference_encoder_borrow_rule():
    # -00:00:00.5 with fsp 1: int part -1 (floor), fraction byte -50 as unsigned char.
    assert time2_bin(time_packed("-00:00:00.5"), 1) == bytes.fromhex("7FFFFF") + bytes([256 - 50])
    assert time2_bin(time_packed("-00:00:01.0"), 1) == bytes.fromhex("7FFFFF00")
    # -01:02:03.50 with fsp 2: floor(packed >> 24) = -(hms + 1), fraction byte -50.
    hms = (1 << 12) | (2 << 6) | 3
    assert time2_bin(time_packed("-01:02:03.50"), 2) == (0x800000 - hms - 1).to_bytes(3, "big") + bytes([206])


@pytest.mark.parametrize(
    ("packed", "fsp", "expected"),
    [
        (0, 0, "00:00:00"),
        (-500_000, 1, "-00:00:00.5"),
        (((838 << 12) | (59 << 6) | 59) << 24, 0, "838:59:59"),
        (-((((1 << 12) | (2 << 6) | 3) << 24) + 500_000), 2, "-01:02:03.50"),
        ((((1 << 12) | (2 << 6) | 3) << 24) + 7, 6, "01:02:03.000007"),
    ],
)
def test_time_text(packed, fsp, expected):
    assert time_text(packed, fsp) == expected


@pytest.mark.parametrize(("byte", "expected"), [(0, 0), (1, 1901), (255, 2155), (121, 2021)])
def test_year(byte, expected):
    assert decode(ColumnType(v.YEAR), bytes([byte])) == expected


def test_old_temporal_types():
    stats = DecodeStats()
    assert decode(ColumnType(v.TIME), (-((12 * 10000) + 34 * 100 + 56)).to_bytes(3, "little", signed=True)) == (
        "-12:34:56"
    )
    secs = calendar.timegm((2020, 1, 2, 3, 4, 5, 0, 0, 0))
    assert decode(ColumnType(v.TIMESTAMP), secs.to_bytes(4, "little")) == "2020-01-02T03:04:05Z"
    assert decode(ColumnType(v.DATETIME), (20200102030405).to_bytes(8, "little")) == "2020-01-02T03:04:05"
    assert decode(ColumnType(v.DATETIME), bytes(8), stats) is None
    assert stats.zero_dates == 1


# -- strings and binaries -------------------------------------------------------------------------


def prefixed(raw: bytes, size: int) -> bytes:
    return len(raw).to_bytes(size, "little") + raw


@pytest.mark.parametrize(
    ("ctype", "data", "expected"),
    [
        (ColumnType(v.VARCHAR, length=255, encoding="utf-8"), prefixed(b"abc", 1), "abc"),
        (ColumnType(v.VARCHAR, length=256, encoding="utf-8"), prefixed(b"abc", 2), "abc"),
        (ColumnType(v.VARCHAR, length=1020, encoding="utf-8"), prefixed("h\u00e9llo \U0001f389 \u4e2d".encode(), 2),
         "h\u00e9llo \U0001f389 \u4e2d"),
        (ColumnType(v.VARCHAR, length=40, encoding="utf-8"), prefixed(b"", 1), ""),
        (ColumnType(v.VARCHAR, length=300, encoding="utf-8"), prefixed(b"x" * 300, 2), "x" * 300),
        (ColumnType(v.VARCHAR, length=20, encoding="cp1252"), prefixed(b"\x80 caf\xe9", 1), "\u20ac caf\u00e9"),
        (ColumnType(v.VARCHAR, length=20, encoding="cp1252"), prefixed(b"a\x81\x8d\x8f\x90\x9db", 1),
         "a\x81\x8d\x8f\x90\x9db"),
        (ColumnType(v.VAR_STRING, length=20, encoding="utf-8"), prefixed(b"ok", 1), "ok"),
        (ColumnType(v.STRING, length=40, encoding="utf-8"), prefixed("\u00e9t\u00e9".encode(), 1), "\u00e9t\u00e9"),
        (ColumnType(v.STRING, length=400, encoding="utf-8"), prefixed(b"long char", 2), "long char"),
        (ColumnType(v.STRING, length=4), prefixed(b"\x01", 1), b"\x01\x00\x00\x00"),
        (ColumnType(v.STRING, length=4), prefixed(b"", 1), b"\x00\x00\x00\x00"),
        (ColumnType(v.STRING, length=4), prefixed(b"\x01\x02\x03\x04", 1), b"\x01\x02\x03\x04"),
        (ColumnType(v.STRING, length=300), prefixed(b"\xff", 2), b"\xff" + b"\x00" * 299),
        (ColumnType(v.VARCHAR, length=8), prefixed(b"\x01\x00", 1), b"\x01\x00"),
        (ColumnType(v.VARCHAR, length=8), prefixed(b"\x01", 1), b"\x01"),
    ],
)
def test_strings(ctype, data, expected):
    got = decode(ctype, data)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_blob_and_text_length_prefixes(size):
    raw = bytes(range(256)) * 2 if size > 1 else bytes(range(200))
    assert decode(ColumnType(v.BLOB, length=size), prefixed(raw, size)) == raw
    text = "\u00fcber \U0001f600" * 3
    assert decode(ColumnType(v.BLOB, length=size, encoding="utf-8"), prefixed(text.encode(), size)) == text


def test_geometry_is_raw_bytes():
    point = struct.pack("<I", 4326) + bytes.fromhex("0101000000") + struct.pack("<dd", 1.5, -2.25)
    assert decode(ColumnType(v.GEOMETRY, length=4), prefixed(point, 4)) == point


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"\x04\x01", "true"), (b"\x04\x00", "null"), (b"\x0c\x03abc", '"abc"'), (b"", "null")],
)
def test_json_binary(data, expected):
    assert decode(ColumnType(v.JSON, length=4), prefixed(data, 4)) == expected


# -- ENUM / SET / BIT -----------------------------------------------------------------------------

MEMBERS = ("a", "b", "c", "d")


@pytest.mark.parametrize(("idx", "expected"), [(0, ""), (1, "a"), (4, "d")])
def test_enum(idx, expected):
    assert decode(ColumnType(v.ENUM, length=1, values=MEMBERS), bytes([idx])) == expected


def test_enum_two_bytes():
    members = tuple(f"m{i}" for i in range(300))
    assert decode(ColumnType(v.ENUM, length=2, values=members), (300).to_bytes(2, "little")) == "m299"


@pytest.mark.parametrize("idx", [5, 255])
def test_enum_out_of_range(idx):
    with pytest.raises(DecodeError, match="ENUM index"):
        decode(ColumnType(v.ENUM, length=1, values=MEMBERS), bytes([idx]))


@pytest.mark.parametrize(
    ("size", "bits", "expected"),
    [(1, 0, []), (1, 0b0101, ["a", "c"]), (1, 0b1111, ["a", "b", "c", "d"]), (2, 0b1000, ["d"])],
)
def test_set(size, bits, expected):
    assert decode(ColumnType(v.SET, length=size, values=MEMBERS), bits.to_bytes(size, "little")) == expected


def test_set_64_members():
    members = tuple(f"s{i}" for i in range(64))
    bits = (1 << 63) | 1
    assert decode(ColumnType(v.SET, length=8, values=members), bits.to_bytes(8, "little")) == ["s0", "s63"]


@pytest.mark.parametrize(
    ("nbits", "data", "expected"),
    [
        (1, b"\x00", 0), (1, b"\x01", 1),
        (10, b"\x02\x01", 0x201),
        (64, b"\xff" * 8, 2**64 - 1), (64, bytes.fromhex("8000000000000001"), 2**63 + 1),
    ],
)
def test_bit(nbits, data, expected):
    assert decode(ColumnType(v.BIT, length=nbits), data) == expected


def test_unsupported_type_is_a_decode_error():
    with pytest.raises(DecodeError, match="type code 99"):
        decoder_for(ColumnType(99), DecodeStats())

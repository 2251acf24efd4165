"""Pure value decoders: one MySQL row-image value -> its exact envelope value (DESIGN §4).

Every decoder has the shape `decode(buf, pos) -> (value, next_pos)` and is built once per
column by `decoder_for`, so the per-row loop does no type dispatch. The formats follow the
server's own `Field_*::pack` / `my_*_packed_from_binary` code, not mysql-replication, whose
readers lose negative TIME fractions, YEAR 0, BINARY padding and the TIMESTAMP zone.
"""

from __future__ import annotations

import calendar
import json
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import DecodeError

Decoder = Callable[[bytes, int], tuple[Any, int]]

# Binlog column type codes (include/mysql_com.h enum_field_types).
TINY, SHORT, LONG, FLOAT, DOUBLE, TIMESTAMP, LONGLONG, INT24 = 1, 2, 3, 4, 5, 7, 8, 9
DATE, TIME, DATETIME, YEAR, VARCHAR, BIT = 10, 11, 12, 13, 15, 16
TIMESTAMP2, DATETIME2, TIME2 = 17, 18, 19
VECTOR, JSON, NEWDECIMAL, ENUM, SET, BLOB, VAR_STRING, STRING, GEOMETRY = 242, 245, 246, 247, 248, 252, 253, 254, 255

_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


@dataclass
class DecodeStats:
    """Counters the decoders bump; exported as metrics by the parser."""

    zero_dates: int = 0
    schemas_compiled: int = 0  # TableMaps turned into decoders (the rest hit the cache)


@dataclass(frozen=True)
class ColumnType:
    """What a decoder needs to know about one column, taken from the TableMap metadata."""

    code: int
    unsigned: bool = False
    precision: int = 0
    scale: int = 0
    fsp: int = 0
    length: int = 0  # VARCHAR/CHAR max bytes, BLOB/JSON/GEOMETRY/VECTOR length-prefix size, BIT bits, ENUM/SET bytes
    encoding: str | None = None  # Python codec of the column charset; None for binary
    values: tuple[str, ...] = ()  # ENUM / SET members


def _int(fmt: str) -> Decoder:
    unpack = struct.Struct(fmt).unpack_from
    size = struct.calcsize(fmt)

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        return unpack(buf, pos)[0], pos + size

    return decode


def _int24(signed: bool) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        return int.from_bytes(buf[pos : pos + 3], "little", signed=signed), pos + 3

    return decode


_F32 = struct.Struct("<f")


def shortest_float32(x: float) -> float:
    """The shortest decimal that round-trips through float32 (what MySQL prints for FLOAT)."""
    bits = _F32.pack(x)
    # Subnormals carry fewer significant digits than normal floats' 6..9.
    for digits in range(1 if abs(x) < 1.1754943508222875e-38 else 6, 10):
        candidate = float(f"{x:.{digits}g}")
        if _F32.pack(candidate) == bits:
            return candidate
    return x


def _float(buf: bytes, pos: int) -> tuple[Any, int]:
    return shortest_float32(_F32.unpack_from(buf, pos)[0]), pos + 4


def _decimal(precision: int, scale: int) -> Decoder:
    """DECIMAL: 9-digit groups in 4 big-endian bytes, partial groups in fewer, the sign in the
    top bit and negatives in ones' complement. Read as one integer and taken apart with shifts:
    a third of the cost of slicing and formatting group by group."""
    intg = precision - scale
    intg0, intg0x = divmod(intg, 9)
    frac0, frac0x = divmod(scale, 9)
    lead = _DIG2BYTES[intg0x]
    trail = _DIG2BYTES[frac0x]
    size = lead + 4 * intg0 + 4 * frac0 + trail
    bits = 8 * size
    sign = 1 << (bits - 1)
    ones = (1 << bits) - 1
    # (shift, mask) of each integer group after the lead, most significant first; the fraction's
    # groups also carry the power of ten they make room for.
    int_groups = [(bits - 8 * lead - 32 * (i + 1), 0xFFFFFFFF) for i in range(intg0)]
    frac_groups = [(8 * trail + 32 * (frac0 - 1 - i), 0xFFFFFFFF, 1_000_000_000) for i in range(frac0)]
    if trail:
        frac_groups.append((0, (1 << (8 * trail)) - 1, 10**frac0x))
    lead_shift = bits - 8 * lead
    text_of = f"{{}}.{{:0{scale}d}}".format

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        raw = int.from_bytes(buf[pos : pos + size], "big")
        negative = not raw & sign
        raw = (raw ^ ones if negative else raw) & ~sign & ones
        integer = raw >> lead_shift
        for shift, mask in int_groups:
            integer = integer * 1_000_000_000 + ((raw >> shift) & mask)
        if scale:
            fraction = 0
            for shift, mask, base in frac_groups:
                fraction = fraction * base + ((raw >> shift) & mask)
            text = text_of(integer, fraction)
            zero = not integer and not fraction
        else:
            text = str(integer)
            zero = not integer
        return ("-" + text if negative and not zero else text), pos + size

    return decode


def _fraction(fsp: int) -> tuple[int, Callable[[bytes, int], int]]:
    """(bytes, reader) of the fractional-seconds part, as microseconds."""
    n = (fsp + 1) // 2
    if n == 0:
        return 0, lambda buf, pos: 0
    scale = {1: 10_000, 2: 100, 3: 1}[n]
    return n, lambda buf, pos: int.from_bytes(buf[pos : pos + n], "big") * scale


def _frac_text(micro: int, fsp: int) -> str:
    return "." + f"{micro:06d}"[:fsp] if fsp else ""


def valid_date(year: int, month: int, day: int) -> bool:
    return year > 0 and 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]


def _date(stats: DecodeStats) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        v = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
        day, month, year = v & 31, (v >> 5) & 15, v >> 9
        if not valid_date(year, month, day):
            stats.zero_dates += 1
            return None, pos + 3
        return f"{year:04d}-{month:02d}-{day:02d}", pos + 3

    return decode


_SEEN = 65_536  # dates and times of day remembered (for every DATETIME column: the texts are the same)
_DAYS: dict[int, str | None] = {}  # packed year/month/day -> "YYYY-MM-DDT", or None when not a date
_TIMES: dict[int, str] = {}  # packed time of day -> "hh:mm:ss"


def _datetime2(fsp: int, stats: DecodeStats) -> Decoder:
    """DATETIME(fsp): 5 bytes of packed date and time, then the fraction. The date's text (or its
    invalidity) and the time of day's text are remembered (`_DAYS`, `_TIMES`, bounded): most rows
    of a busy table share the day, many the second."""
    nfrac = (fsp + 1) // 2
    frac_scale = (0, 10_000, 100, 1)[nfrac]
    frac_mask = (1 << (8 * nfrac)) - 1
    frac_bits = 8 * nfrac
    days, times = _DAYS, _TIMES

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        end = pos + 5 + nfrac
        packed = int.from_bytes(buf[pos:end], "big")
        v = (packed >> frac_bits) - 0x8000000000
        ymd = v >> 17
        try:
            day = days[ymd]
        except KeyError:
            year, month = divmod(ymd >> 5, 13)
            d = ymd & 31
            day = f"{year:04d}-{month:02d}-{d:02d}T" if valid_date(year, month, d) else None
            if len(days) >= _SEEN:
                days.clear()
            days[ymd] = day
        if day is None:
            stats.zero_dates += 1
            return None, end
        hms = v & 0x1FFFF
        try:
            clock = times[hms]
        except KeyError:
            clock = f"{hms >> 12:02d}:{(hms >> 6) & 63:02d}:{hms & 63:02d}"
            if len(times) >= _SEEN:
                times.clear()
            times[hms] = clock
        if not fsp:
            return day + clock, end
        return day + clock + f".{(packed & frac_mask) * frac_scale:06d}"[: fsp + 1], end

    return decode


def _timestamp2(fsp: int, stats: DecodeStats) -> Decoder:
    nfrac, read_frac = _fraction(fsp)

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        secs = int.from_bytes(buf[pos : pos + 4], "big")
        end = pos + 4 + nfrac
        if secs == 0:
            stats.zero_dates += 1
            return None, end
        t = time.gmtime(secs)
        frac = _frac_text(read_frac(buf, pos + 4), fsp)
        return (
            f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}{frac}Z",
            end,
        )

    return decode


def time_text(packed: int, fsp: int) -> str:
    """Format MySQL's packed TIME (int part << 24 | microseconds, signed) as `[-]HH:MM:SS[.f]`."""
    sign = "-" if packed < 0 else ""
    packed = abs(packed)
    hms, micro = packed >> 24, packed & 0xFFFFFF
    hours, minutes, seconds = (hms >> 12) & 1023, (hms >> 6) & 63, hms & 63
    return f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}{_frac_text(micro, fsp)}"


def _time2(fsp: int) -> Decoder:
    n = (fsp + 1) // 2

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        if n == 3:
            packed = int.from_bytes(buf[pos : pos + 6], "big") - 0x800000000000
        else:
            intpart = int.from_bytes(buf[pos : pos + 3], "big") - 0x800000
            frac = int.from_bytes(buf[pos + 3 : pos + 3 + n], "big") if n else 0
            # Negative values with a fraction borrow one second (my_time_packed_from_binary).
            if intpart < 0 and frac:
                intpart += 1
                frac -= 1 << (8 * n)
            packed = (intpart << 24) + frac * (10_000 if n == 1 else 100)
        return time_text(packed, fsp), pos + 3 + n

    return decode


def _old_time(buf: bytes, pos: int) -> tuple[Any, int]:
    v = int.from_bytes(buf[pos : pos + 3], "little", signed=True)
    sign, v = ("-" if v < 0 else ""), abs(v)
    return f"{sign}{v // 10000:02d}:{v // 100 % 100:02d}:{v % 100:02d}", pos + 3


def _old_timestamp(stats: DecodeStats) -> Decoder:
    inner = _timestamp2(0, stats)

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        return inner(buf[pos : pos + 4][::-1], 0)[0], pos + 4

    return decode


def _old_datetime(stats: DecodeStats) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(buf[pos : pos + 8], "little")
        d, t = divmod(v, 1_000_000)
        year, month, day = d // 10000, d // 100 % 100, d % 100
        if not valid_date(year, month, day):
            stats.zero_dates += 1
            return None, pos + 8
        return f"{year:04d}-{month:02d}-{day:02d}T{t // 10000:02d}:{t // 100 % 100:02d}:{t % 100:02d}", pos + 8

    return decode


def _year(buf: bytes, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    return (1900 + b if b else 0), pos + 1


def decode_text(raw: bytes, encoding: str) -> str:
    """Decode with the column charset; MySQL's latin1 is cp1252 plus the 5 bytes it leaves undefined."""
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError:
        if encoding != "cp1252":
            raise
        return "".join(bytes((b,)).decode("cp1252", errors="ignore") or chr(b) for b in raw)


def _string(prefix: int, encoding: str | None, pad_to: int = 0) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        n = buf[pos] if prefix == 1 else int.from_bytes(buf[pos : pos + prefix], "little")
        start = pos + prefix
        raw = buf[start : start + n]
        if encoding is not None:
            return decode_text(raw, encoding), start + n
        if pad_to and n < pad_to:
            raw = raw + b"\x00" * (pad_to - n)  # BINARY(n) keeps the zero padding the server strips
        return raw, start + n

    return decode


def _enum(size: int, members: Sequence[str]) -> Decoder:
    table = ("", *members)

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        idx = buf[pos] if size == 1 else int.from_bytes(buf[pos : pos + size], "little")
        if idx >= len(table):
            raise DecodeError(f"ENUM index {idx} outside its {len(members)} members")
        return table[idx], pos + size

    return decode


def _set(size: int, members: Sequence[str]) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        bits = int.from_bytes(buf[pos : pos + size], "little")
        return [m for i, m in enumerate(members) if bits >> i & 1], pos + size

    return decode


def _bit(nbits: int) -> Decoder:
    nbytes = (nbits + 7) // 8

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        return int.from_bytes(buf[pos : pos + nbytes], "big"), pos + nbytes

    return decode


def _json_binary(prefix: int) -> Decoder:
    from pymysqlreplication.json_binary import parse_json

    def plain(v: Any) -> Any:
        if isinstance(v, bytes):
            return v.decode("utf-8")
        if isinstance(v, dict):
            return {plain(k): plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        n = int.from_bytes(buf[pos : pos + prefix], "little")
        start = pos + prefix
        raw = buf[start : start + n]
        if not raw:
            return "null", start
        return json.dumps(plain(parse_json(raw[0], raw[1:])), ensure_ascii=False), start + n

    return decode


def vector_value(raw: bytes) -> list[float]:
    """A VECTOR's bytes (float32, little-endian) as the envelope carries it: a list of floats."""
    if len(raw) % 4:
        raise DecodeError(f"VECTOR value of {len(raw)} bytes is not a whole number of float32s")
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def _vector(prefix: int) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        size = int.from_bytes(buf[pos:pos + prefix], "little")
        pos += prefix
        return vector_value(buf[pos:pos + size]), pos + size

    return decode


def decoder_for(col: ColumnType, stats: DecodeStats) -> Decoder:
    """Build the decoder of one column; raises DecodeError for a type binlake cannot map."""
    code, u = col.code, col.unsigned
    if code == TINY:
        return _int("<B" if u else "<b")
    if code == SHORT:
        return _int("<H" if u else "<h")
    if code == INT24:
        return _int24(signed=not u)
    if code == LONG:
        return _int("<I" if u else "<i")
    if code == LONGLONG:
        return _int("<Q" if u else "<q")
    if code == FLOAT:
        return _float
    if code == DOUBLE:
        return _int("<d")
    if code == NEWDECIMAL:
        return _decimal(col.precision, col.scale)
    if code == DATE:
        return _date(stats)
    if code == DATETIME2:
        return _datetime2(col.fsp, stats)
    if code == TIMESTAMP2:
        return _timestamp2(col.fsp, stats)
    if code == TIME2:
        return _time2(col.fsp)
    if code == TIME:
        return _old_time
    if code == TIMESTAMP:
        return _old_timestamp(stats)
    if code == DATETIME:
        return _old_datetime(stats)
    if code == YEAR:
        return _year
    if code in (VARCHAR, VAR_STRING):
        return _string(1 if col.length <= 255 else 2, col.encoding)
    if code == STRING:
        return _string(1 if col.length <= 255 else 2, col.encoding, pad_to=col.length)
    if code == ENUM:
        return _enum(col.length, col.values)
    if code == SET:
        return _set(col.length, col.values)
    if code in (BLOB, GEOMETRY):
        return _string(col.length, col.encoding if code == BLOB else None)
    if code == JSON:
        return _json_binary(col.length)
    if code == VECTOR:
        return _vector(col.length)
    if code == BIT:
        return _bit(col.length)
    raise DecodeError(f"column type code {code} is not supported by binlake")

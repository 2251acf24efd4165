"""Pure: a DDL statement -> the structured change the lake applies without parsing SQL again.

`describe` gives the statement's kind; for ALTER TABLE one op per column-level spec, in
statement order; for CREATE TABLE the column list and primary key; for renames the
(old, new) pairs. A column is the dict the binlog path puts into the envelope schema: the
information_schema.COLUMNS row the server would show is synthesised and handed to the
snapshot's `column_from_catalog`, the one owner of the type mapping. An added column
carries the value every existing row gets, in the envelope's encoding: the text the server
would print for it goes through the snapshot's text decoders. A value only the server
knows (an expression, AUTO_INCREMENT, a TIMESTAMP literal, whose meaning depends on the
session time zone) travels as `default_expr`, its SQL text, instead.

Assumed, because the statement does not say: a column without CHARACTER SET/COLLATE is
utf8mb4 (the table's default charset is not in the statement), and TIMESTAMP follows
explicit_defaults_for_timestamp=ON (the default of MySQL 8 and MariaDB >= 10.10).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal, NotRequired, TypedDict, cast

from services.parser import ddl
from services.parser import values as v
from services.parser.columns import CODECS, Column
from services.parser.ddl import Token
from services.parser.snapshot.catalog import UnsupportedColumn, column_from_catalog
from services.parser.snapshot.values import text_decoder_for

Kind = Literal["create", "alter", "drop", "truncate", "rename", "index", "other"]


class ColumnInfo(TypedDict):
    """A column as `Column.describe` puts it into the envelope schema."""

    name: str
    type: str
    nullable: bool
    unsigned: NotRequired[bool]
    precision: NotRequired[int]
    scale: NotRequired[int]
    fsp: NotRequired[int]
    length: NotRequired[int]
    values: NotRequired[list[str]]
    charset: NotRequired[str]


class UnknownColumn(TypedDict):
    """A column of a type binlake cannot map (e.g. MariaDB's UUID); `unknown` is the type as written."""

    name: str
    unknown: str


class _ColumnChange(TypedDict):
    column: NotRequired[ColumnInfo]
    unknown: NotRequired[str]  # instead of column: the type as written
    name: NotRequired[str]  # with unknown: the column's name
    default: NotRequired[Any]  # the value existing rows get, envelope-encoded
    default_expr: NotRequired[str]  # instead of default: the SQL only the server can evaluate
    first: NotRequired[bool]
    after: NotRequired[str]


class AddOp(_ColumnChange):
    op: Literal["add"]
    if_not_exists: NotRequired[bool]


class ModifyOp(_ColumnChange):
    op: Literal["modify"]
    old: str
    if_exists: NotRequired[bool]


class DropOp(TypedDict):
    op: Literal["drop"]
    name: str
    if_exists: NotRequired[bool]


class RenameOp(TypedDict):
    op: Literal["rename"]
    old: str
    new: str


class DropPrimaryKeyOp(TypedDict):
    op: Literal["drop_primary_key"]


class PrimaryKeyOp(TypedDict):
    op: Literal["primary_key"]
    columns: list[str]


class ReloadOp(TypedDict):
    """The statement changed existing rows without row events (DROP/TRUNCATE/EXCHANGE PARTITION,
    CONVERT TO CHARACTER SET): the lake reads the table again; `removes`: rows may be gone."""

    op: Literal["reload"]
    what: str  # the spec's leading words, e.g. "DROP PARTITION"
    removes: bool


RenameTableOp = TypedDict("RenameTableOp", {"op": Literal["rename_table"], "from": list[str], "to": list[str]})
Op = AddOp | ModifyOp | DropOp | RenameOp | DropPrimaryKeyOp | PrimaryKeyOp | RenameTableOp | ReloadOp


class Alter(TypedDict):
    """`env["alter"]` of a DDL envelope."""

    kind: Kind
    ops: list[Op]
    columns: list[ColumnInfo | UnknownColumn] | None  # CREATE TABLE with a column list; else None
    pk: list[str] | None  # CREATE TABLE: primary key columns ([] = none); else None
    renames: list[list[str]]  # [old_db, old_table, new_db, new_table]
    # CREATE TABLE IF NOT EXISTS: MySQL logs it even when the table exists (then it changed nothing)
    if_not_exists: NotRequired[bool]


_IF_NOT_EXISTS = re.compile(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\s+IF\s+NOT\s+EXISTS\b", re.I)
_KINDS: dict[str, Kind] = {k: k for k in ("create", "alter", "drop", "truncate", "rename", "index")}

# -- literals -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Lit:
    kind: str  # null / str / num (its text) / bytes (X'..', 0x..) / bits (b'..' as int) / bad
    value: Any = None


_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "%": "\\%", "_": "\\_"}


def _string(text: str) -> _Lit:
    """A quoted literal token: '..' / ".." with its escapes, _charset'..', N'..', X'..', B'..'."""
    at = min(i for i in (text.find("'"), text.find('"')) if i >= 0)
    prefix, quote, body = text[:at].lower(), text[at], text[at + 1 : -1]
    if prefix == "x":
        return _Lit("bytes", bytes.fromhex(body)) if re.fullmatch(r"(?:[0-9a-fA-F]{2})*", body) else _Lit("bad")
    if prefix == "b":
        return _Lit("bits", int(body or "0", 2)) if re.fullmatch(r"[01]*", body) else _Lit("bad")
    unescaped = re.sub(rf"\\(.)|{quote}{quote}", lambda m: _ESCAPES.get(m[1], m[1]) if m[1] else quote, body,
                       flags=re.S)
    return _Lit("str", unescaped)


def _is_string(t: Token) -> bool:
    return t.kind == "quoted" and not t.text.startswith("`")


def _value(toks: list[Token], i: int) -> tuple[_Lit | None, str, int]:
    """The value at toks[i]: (literal, or None for an expression; its SQL text; index after it)."""
    if i >= len(toks):
        return None, "", i
    t, w = toks[i], toks[i].word
    nxt = toks[i + 1] if i + 1 < len(toks) else Token("", "")
    if w == "NULL":
        return _Lit("null"), t.text, i + 1
    if w in ("TRUE", "FALSE"):
        return _Lit("num", "1" if w == "TRUE" else "0"), t.text, i + 1
    if t.kind == "num":
        return _Lit("num", t.text), t.text, i + 1
    if t.text in ("-", "+") and nxt.kind == "num":
        return _Lit("num", t.text + nxt.text), t.text + nxt.text, i + 2
    if re.fullmatch(r"0x[0-9a-fA-F]+", t.text):
        digits = t.text[2:]
        return _Lit("bytes", bytes.fromhex(digits.rjust(len(digits) + len(digits) % 2, "0"))), t.text, i + 1
    if re.fullmatch(r"0b[01]+", t.text):
        return _Lit("bits", int(t.text[2:], 2)), t.text, i + 1
    if (w in ("DATE", "TIME", "DATETIME", "TIMESTAMP") or w.startswith("_")) and _is_string(nxt):  # _latin1 'x'
        return _Lit("str", _string(nxt.text).value), f"{t.text} {nxt.text}", i + 2
    if _is_string(t):
        lit, j = _string(t.text), i + 1
        while lit.kind == "str" and j < len(toks) and _is_string(toks[j]) and toks[j].text[0] in "'\"":
            lit, j = _Lit("str", lit.value + _string(toks[j].text).value), j + 1  # 'a' 'b' is 'ab'
        return lit, " ".join(x.text for x in toks[i:j]), j
    if w == "NEXT" and nxt.word == "VALUE":
        return None, " ".join(x.text for x in toks[i : i + 4]), i + 4  # NEXT VALUE FOR seq
    if nxt.kind == "group":
        return None, t.text + nxt.text, i + 2  # NOW(), CURRENT_TIMESTAMP(3), UUID()
    return None, t.text, i + 1  # (expr), CURRENT_TIMESTAMP, ...


def _number(lit: _Lit) -> Decimal:
    if lit.kind in ("num", "str"):
        d = Decimal(str(lit.value).strip())
    elif lit.kind == "bytes":
        d = Decimal(int.from_bytes(lit.value, "big"))
    elif lit.kind == "bits":
        d = Decimal(lit.value)
    else:
        raise ValueError(f"no number in {lit}")
    if not d.is_finite():
        raise ValueError(f"not a number: {lit.value}")
    return d


def _integer(lit: _Lit) -> int:
    return int(_number(lit).to_integral_value(ROUND_HALF_UP))


def _bytes(lit: _Lit) -> bytes:
    if lit.kind == "bytes":
        return bytes(lit.value)
    if lit.kind == "bits":
        n = int(lit.value)
        return n.to_bytes(max(1, (n.bit_length() + 7) // 8), "big")
    if lit.kind == "num":
        return _number_text(str(lit.value)).encode("ascii")
    if lit.kind == "str":
        return str(lit.value).encode("utf-8")  # the connection charset of nearly every client
    raise ValueError(f"no bytes in {lit}")


def _number_text(text: str) -> str:
    """How the server prints a numeric literal stored into a string column."""
    d = Decimal(text)
    if "e" in text.lower():
        return repr(float(d)).removesuffix(".0").replace("e+", "e")
    return str(abs(d)) if d.is_zero() else str(d)


def _text(lit: _Lit, encoding: str) -> str:
    if lit.kind == "str":
        return str(lit.value)
    if lit.kind == "num":
        return _number_text(str(lit.value))
    return v.decode_text(_bytes(lit), encoding)


# -- temporal literals ----------------------------------------------------------------------

_DATETIME = re.compile(
    r"(\d{1,4})[^\d\s](\d{1,2})[^\d\s](\d{1,2})(?:(?:\s+|T)(\d{1,2})[^\d\s](\d{1,2})[^\d\s](\d{1,2})(?:\.(\d*))?)?"
)
_DATETIME_DIGITS = re.compile(r"(\d{2}|\d{4})(\d{2})(\d{2})(?:(\d{2})(\d{2})(\d{2})(?:\.(\d*))?)?")
_TIME = re.compile(r"(-)?\s*(?:(\d+)\s+)?(\d+):(\d{1,2})(?::(\d{1,2}))?(?:\.(\d*))?")
_TIME_DIGITS = re.compile(r"(-)?(\d+)(?:\.(\d*))?")


def _fraction(digits: str, fsp: int, rounds: bool) -> tuple[str, int]:
    """(fsp fraction digits, carry second): MySQL rounds extra digits, MariaDB truncates them."""
    kept = (digits + "0" * fsp)[:fsp]
    if not rounds or len(digits) <= fsp or digits[fsp] < "5":
        return kept, 0
    n = int(kept or "0") + 1
    return ("0" * fsp, 1) if n == 10**fsp else (f"{n:0{fsp}d}", 0)


def _datetime_text(lit: _Lit, fsp: int, date_only: bool, rounds: bool) -> str:
    """`YYYY-MM-DD[ HH:MM:SS[.f]]` as the server prints the literal stored into a DATE/DATETIME."""
    if lit.kind not in ("str", "num"):
        raise ValueError(f"not a date: {lit}")
    text = str(lit.value).strip()
    if lit.kind == "num" and Decimal(text) == 0:
        text = "0000-00-00 00:00:00"
    m = _DATETIME.fullmatch(text) or _DATETIME_DIGITS.fullmatch(text)
    if m is None:
        raise ValueError(f"not a date: {text!r}")
    y, mo, d, h, mi, s = (int(g or 0) for g in m.groups()[:6])
    if len(m[1]) <= 2:
        y += 2000 if y < 70 else 1900
    frac, carry = _fraction(m[7] or "", fsp, rounds)
    if carry:
        t = datetime(y, mo, d, h, mi, s) + timedelta(seconds=1)
        y, mo, d, h, mi, s = t.year, t.month, t.day, t.hour, t.minute, t.second
    if date_only:
        return f"{y:04d}-{mo:02d}-{d:02d}"
    return f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}" + (f".{frac}" if fsp else "")


def _time_text(lit: _Lit, fsp: int, rounds: bool) -> str:
    """`[-]HH:MM:SS[.f]` as the server prints the literal stored into a TIME."""
    if lit.kind not in ("str", "num"):
        raise ValueError(f"not a time: {lit}")
    text = str(lit.value).strip()
    m = _TIME.fullmatch(text)
    if m:
        sign, days, h, mi, s, digits = m[1], int(m[2] or 0), int(m[3]), int(m[4]), int(m[5] or 0), m[6] or ""
    elif (c := _TIME_DIGITS.fullmatch(text)) is not None:  # [H]HHMMSS, MMSS, SS
        sign, days, n, digits = c[1], 0, c[2], c[3] or ""
        h, mi, s = int(n[:-4] or 0), int(n[-4:-2] or 0), int(n[-2:])
    else:
        raise ValueError(f"not a time: {text!r}")
    frac, carry = _fraction(digits, fsp, rounds)
    total = ((days * 24 + h) * 60 + mi) * 60 + s + carry
    sign = sign if sign and (total or frac.strip("0")) else ""
    return f"{sign}{total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}" + (f".{frac}" if fsp else "")


# -- a value stored into a column ------------------------------------------------------------


class _ServerOnly(ValueError):
    """The stored value depends on the server's state (the session time zone)."""


def _member(text: str, members: tuple[str, ...]) -> str:
    key = text.rstrip(" ").casefold()
    for m in members:
        if m == text or m.casefold() == key:
            return m
    raise ValueError(f"{text!r} is not one of {members}")


def _server_text(col: Column, lit: _Lit, float_scale: int | None, rounds: bool) -> bytes:
    """The bytes the server's text protocol would send for `lit` stored into `col`."""
    t, code = col.ctype, col.ctype.code
    encoding = t.encoding or CODECS.get(col.charset or "", "utf-8")
    if code in (v.TINY, v.SHORT, v.INT24, v.LONG, v.LONGLONG):
        return str(_integer(lit)).encode()
    if code == v.YEAR:
        s = str(lit.value).strip()
        if lit.kind == "str" and s.isdigit() and len(s) <= 2:
            n = int(s)
            return str(n + (2000 if n < 70 else 1900)).encode()  # '0' and '00' are 2000
        n = _integer(lit)
        return str(n + (2000 if n < 70 else 1900) if lit.kind == "num" and 0 < n < 100 else n).encode()
    if code == v.NEWDECIMAL:
        d = _number(lit).quantize(Decimal(1).scaleb(-t.scale), ROUND_HALF_UP)
        return f"{abs(d) if d.is_zero() else d:f}".encode()
    if code in (v.FLOAT, v.DOUBLE):
        d = _number(lit)
        if float_scale is not None:  # FLOAT(M,D) stores D decimals
            d = d.quantize(Decimal(1).scaleb(-float_scale), ROUND_HALF_UP)
        return repr(float(d)).encode()
    if code == v.BIT:
        n = int.from_bytes(_bytes(lit), "big") if lit.kind == "str" else _integer(lit)
        return n.to_bytes(max(1, (t.length + 7) // 8), "big")
    if code in (v.DATE, v.DATETIME2, v.TIMESTAMP2):
        return _datetime_text(lit, t.fsp, code == v.DATE, rounds).encode()
    if code == v.TIME2:
        return _time_text(lit, t.fsp, rounds).encode()
    if code == v.ENUM:
        n = _integer(lit) if lit.kind == "num" else 0
        return (t.values[n - 1] if n > 0 else _member(_text(lit, encoding), t.values)).encode(encoding)
    if code == v.SET:
        if lit.kind == "num":
            bits = _integer(lit)
            picked = {m for i, m in enumerate(t.values) if bits >> i & 1}
        else:
            text = _text(lit, encoding)
            picked = {_member(p, t.values) for p in text.split(",")} if text else set()
        return ",".join(m for m in t.values if m in picked).encode(encoding)
    if code == v.JSON:
        return _text(lit, "utf-8").encode()
    if t.encoding is None:  # BINARY, VARBINARY, BLOB, GEOMETRY
        raw = _bytes(lit)
        return raw.ljust(t.length, b"\0") if code == v.STRING else raw  # BINARY(n) is stored padded
    text = _text(lit, t.encoding)
    return (text.rstrip(" ") if code == v.STRING else text).encode(t.encoding)  # CHAR reads back unpadded


def _stored(col: Column, lit: _Lit, float_scale: int | None, mariadb: bool) -> Any:
    """The envelope value of `lit` stored into `col`; ValueError when only the server knows it."""
    if lit.kind == "null":
        return None
    value = text_decoder_for(col, v.DecodeStats())(_server_text(col, lit, float_scale, rounds=not mariadb))
    if col.ctype.code == v.TIMESTAMP2 and value is not None:
        raise _ServerOnly("a TIMESTAMP literal is read in the session time zone")
    return value


def _implicit(col: Column) -> _Lit:
    """What the server stores into a NOT NULL column without DEFAULT (checked against MariaDB in the tests)."""
    code = col.ctype.code
    if code == v.ENUM:
        return _Lit("num", "1")
    if code == v.JSON:
        return _Lit("str", "null")  # MySQL's JSON (MariaDB's JSON is LONGTEXT and gets "")
    if code in (v.STRING, v.VARCHAR, v.BLOB, v.SET, v.GEOMETRY):
        return _Lit("str", "")
    return _Lit("num", "0")  # numbers, BIT, YEAR; the zero date and time


# -- column definitions ---------------------------------------------------------------------

_TYPES = {  # a type as written -> information_schema DATA_TYPE
    "int1": "tinyint", "bool": "tinyint", "boolean": "tinyint", "int2": "smallint", "int3": "mediumint",
    "middleint": "mediumint", "integer": "int", "int4": "int", "int8": "bigint", "serial": "bigint",
    "dec": "decimal", "numeric": "decimal", "fixed": "decimal", "float4": "float", "float8": "double",
    "real": "double", "character": "char", "nchar": "char", "nvarchar": "varchar", "varcharacter": "varchar",
    "long": "mediumtext",
}
_LOB_BYTES = ((255, "tiny"), (65535, ""), (16777215, "medium"))
_TO_BINARY = {"char": "binary", "varchar": "varbinary", "tinytext": "tinyblob", "text": "blob",
              "mediumtext": "mediumblob", "longtext": "longblob"}
# Bytes per character where more than one; binlog lengths of CHAR/VARCHAR are in bytes.
_MAXLEN = {"utf8mb4": 4, "utf8mb3": 3, "ucs2": 2, "utf16": 4, "utf16le": 4, "utf32": 4, "ujis": 3, "eucjpms": 3,
           "gb18030": 4, "big5": 2, "sjis": 2, "cp932": 2, "gbk": 2, "gb2312": 2, "euckr": 2}
_TABLE_KEYS = frozenset({"INDEX", "KEY", "UNIQUE", "FULLTEXT", "SPATIAL", "FOREIGN", "CHECK", "PARTITION"})


@dataclass
class _Def:
    """One column definition, parsed."""

    name: str
    type_text: str
    row: dict[str, Any] | None  # the information_schema.COLUMNS row; None: not mappable
    default: _Lit | None = None
    default_text: str = ""
    expr: str | None = None  # DEFAULT (expr), generated column, AUTO_INCREMENT
    float_scale: int | None = None
    primary: bool = False
    first: bool = False
    after: str | None = None

    def column(self) -> Column | None:
        try:
            return column_from_catalog(self.row) if self.row is not None else None
        except UnsupportedColumn:
            return None


@dataclass
class _Attrs:
    nullable: bool = True
    unsigned: bool = False
    charset: str | None = None
    collation: str | None = None
    compressed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # _Def fields


def _name(t: Token) -> str:
    return str(_string(t.text).value) if _is_string(t) else ddl.unquote(t.text)


def _type(toks: list[Token]) -> tuple[str, Token | None, int, str | None]:
    """(DATA_TYPE, its (args) group, tokens used, charset the type implies)."""
    words = [t.word.lower() for t in toks[:3]] + ["", "", ""]
    i, charset = 0, None
    if words[0] == "national":
        i, charset = 1, "utf8mb3"
    first, nxt = words[i], words[i + 1]
    charset = "utf8mb3" if first in ("nchar", "nvarchar") else charset
    data_type, i = _TYPES.get(first, first), i + 1
    pairs = {("double", "precision"): "double", ("char", "varying"): "varchar", ("character", "varying"): "varchar",
             ("nchar", "varying"): "varchar", ("nchar", "varchar"): "varchar", ("long", "varchar"): "mediumtext",
             ("long", "varbinary"): "mediumblob", ("char", "byte"): "binary"}
    if (first, nxt) in pairs:
        data_type, i = pairs[first, nxt], i + 1
    args = toks[i] if i < len(toks) and toks[i].kind == "group" else None
    return data_type, args, i + (args is not None), charset


def _attrs(toks: list[Token], start: int) -> _Attrs:
    """Everything after the type: NULL, DEFAULT, keys, charset, position, generated columns."""
    a, i = _Attrs(), start
    while i < len(toks):
        w, nw = toks[i].word, toks[i + 1].word if i + 1 < len(toks) else ""
        i += 1
        if w == "NOT" and nw == "NULL":
            a.nullable, i = False, i + 1
        elif w == "NULL":
            a.nullable = True
        elif w == "DEFAULT":
            lit, text, i = _value(toks, i)
            a.extra.update(default=lit, default_text=text, expr=None if lit else text)
        elif w == "ON" and nw == "UPDATE":
            i = _value(toks, i + 1)[2]
        elif w in ("UNSIGNED", "ZEROFILL"):
            a.unsigned = True
        elif w == "AUTO_INCREMENT" or (w == "SERIAL" and nw == "DEFAULT"):  # SERIAL DEFAULT VALUE
            a.extra["expr"] = "AUTO_INCREMENT"
            a.nullable = a.nullable and w != "SERIAL"
            i += 2 if w == "SERIAL" else 0
        elif w == "PRIMARY" or (w == "KEY" and (i < 2 or toks[i - 2].word != "UNIQUE")):
            a.extra["primary"], a.nullable = True, False
        elif (w in ("CHARACTER", "CHAR") and nw == "SET") or w == "CHARSET":
            i += w != "CHARSET"
            a.charset, i = (_name(toks[i]).lower() if i < len(toks) else None), i + 1
        elif w == "COLLATE" and i < len(toks):
            a.collation, i = _name(toks[i]).lower(), i + 1
        elif w in ("ASCII", "UNICODE", "BYTE"):
            a.charset = {"ASCII": "latin1", "UNICODE": "ucs2", "BYTE": "binary"}[w]
        elif w == "AS" and nw == "" and i < len(toks) and toks[i].kind == "group":  # [GENERATED ALWAYS] AS (expr)
            a.extra["expr"], i = f"AS {toks[i].text}", i + 1
        elif w in ("COMMENT", "CONSTRAINT"):
            i += 1  # its text or name, which may look like a keyword
        elif w == "FIRST":
            a.extra["first"] = True
        elif w == "AFTER" and i < len(toks):
            a.extra["after"], i = _name(toks[i]), i + 1
        elif w == "COMPRESSED":
            a.compressed = True  # MariaDB's compressed columns have binlog types binlake cannot decode
        elif w == "REFERENCES":
            break
    return a


def _charset(data_type: str, implied: str | None, a: _Attrs, mariadb: bool) -> tuple[str, str | None]:
    """(DATA_TYPE after CHARACTER SET binary / MariaDB's JSON, COLLATION_NAME)."""
    charset = a.charset or implied or (a.collation.split("_", 1)[0] if a.collation else None) or "utf8mb4"
    charset = "utf8mb3" if charset == "utf8" else charset
    if data_type == "json":
        return ("longtext", "utf8mb4_bin") if mariadb else ("json", None)
    if charset == "binary" or a.collation == "binary":
        return _TO_BINARY.get(data_type, data_type), None
    return data_type, f"{charset}_general_ci"  # only the charset part reaches the envelope


def _column(name: str, toks: list[Token], mariadb: bool) -> _Def:
    """A column definition (the tokens after its name) -> `_Def` with its catalog row."""
    written, args, used, implied = _type(toks)
    a = _attrs(toks, used)
    written_text = "".join(t.text if t.kind == "group" or not n else " " + t.text for n, t in enumerate(toks[:used]))
    d = _Def(name, written_text, None, **a.extra)
    if toks and toks[0].word == "SERIAL":
        a.unsigned, a.nullable, d.expr = True, False, "AUTO_INCREMENT"
    data_type, collation = _charset(written, implied, a, mariadb)
    parts = [t for t in ddl.tokens(args.text[1:-1]) if t.kind != "comma"] if args else []
    nums = [int(t.text) if t.kind == "num" and t.text.isdigit() else 0 for t in parts]
    maxlen = _MAXLEN.get((collation or "").split("_", 1)[0], 1)
    row: dict[str, Any] = {"COLUMN_NAME": name, "DATA_TYPE": data_type, "COLUMN_TYPE": data_type,
                           "IS_NULLABLE": "YES" if a.nullable else "NO", "COLLATION_NAME": collation,
                           "CHARACTER_OCTET_LENGTH": None, "NUMERIC_PRECISION": None, "NUMERIC_SCALE": None,
                           "DATETIME_PRECISION": None}
    if data_type == "float" and len(nums) == 1 and nums[0] > 24:
        row["DATA_TYPE"] = data_type = "double"
    if data_type in ("float", "double") and len(nums) == 2:
        d.float_scale = nums[1]
    if data_type in ("tinyint", "smallint", "mediumint", "int", "bigint", "decimal", "float", "double"):
        row["COLUMN_TYPE"] = data_type + (" unsigned" if a.unsigned else "")
    if data_type == "decimal":
        row["NUMERIC_PRECISION"], row["NUMERIC_SCALE"] = (nums + [10, 0][len(nums):])[:2] if nums else (10, 0)
    elif data_type == "bit":
        row["NUMERIC_PRECISION"] = nums[0] if nums else 1
    elif data_type in ("datetime", "timestamp", "time"):
        row["DATETIME_PRECISION"] = nums[0] if nums else 0
    elif data_type in ("char", "varchar", "binary", "varbinary"):
        n = nums[0] if nums else 1
        row["CHARACTER_OCTET_LENGTH"] = n if data_type in ("binary", "varbinary") else n * maxlen
    elif data_type in ("text", "blob") and nums:
        size = nums[0] * (maxlen if data_type == "text" else 1)
        row["DATA_TYPE"] = next((p for limit, p in _LOB_BYTES if size <= limit), "long") + data_type
    elif data_type in ("enum", "set"):
        members = [str(_string(t.text).value).rstrip(" ") for t in parts if _is_string(t)]
        quoted = ",".join("'" + m.replace("\\", "\\\\").replace("'", "''") + "'" for m in members)
        row["COLUMN_TYPE"] = f"{data_type}({quoted})"
    elif data_type == "vector":
        row["COLUMN_TYPE"] = f"vector({nums[0] if nums else 2048})"  # MySQL's default dimension
    # MariaDB's VECTOR (11.7+) is another type: the binlake of a MariaDB source does not map it
    d.row = None if a.compressed or not written or (data_type == "vector" and mariadb) else row
    return d


def _defaults(op: _ColumnChange, d: _Def, mariadb: bool) -> None:
    """Fill `column` and `default`/`default_expr` (or `unknown`) and the position of an add/modify op."""
    col = d.column()
    if col is None:
        op["unknown"], op["name"] = d.type_text, d.name
    else:
        op["column"] = cast(ColumnInfo, col.describe())
        if d.expr is not None:
            op["default_expr"] = d.expr
        elif d.default is None and col.nullable:
            op["default"] = None
        else:
            try:
                op["default"] = _stored(col, d.default or _implicit(col), d.float_scale, mariadb)
            except (ValueError, ArithmeticError, LookupError):
                op["default_expr"] = d.default_text
    if d.first:
        op["first"] = True
    if d.after is not None:
        op["after"] = d.after


# -- statements -----------------------------------------------------------------------------


def _key_columns(toks: list[Token]) -> list[str]:
    """The column names of the first `(a, b(10) DESC)` group."""
    group = next((t for t in toks if t.kind == "group"), None)
    parts = ddl.split_top_level(group.text[1:-1]) if group else []
    return [_name(ddl.tokens(p)[0]) for p in parts]


def _table_key(toks: list[Token]) -> list[str] | None:
    """A key item (`[CONSTRAINT [x]] PRIMARY KEY (..)`, INDEX, UNIQUE, ...): its primary key columns ([] for
    any other key); None when the item is a column."""
    words = [t.word for t in toks] + ["", "", "", ""]
    i = 0
    if words[0] == "CONSTRAINT":
        i = 4 if words[1:4] == ["IF", "NOT", "EXISTS"] else 1
        i += words[i] not in ("PRIMARY", "UNIQUE", "FOREIGN", "CHECK")  # the constraint's name
    w = words[i]
    if w == "PRIMARY":
        return _key_columns(toks[i:])
    if w in _TABLE_KEYS or (w, words[i + 1]) in (("PERIOD", "FOR"), ("SYSTEM", "VERSIONING")) or i:
        return []
    return None


def _first_word(text: str) -> str:
    return next((t.word for t in ddl.tokens(text)), "")


def _create(rest: str, mariadb: bool) -> tuple[list[ColumnInfo | UnknownColumn] | None, list[str] | None]:
    """(columns, primary key) of CREATE TABLE; (None, None) for LIKE, and no columns for ... SELECT."""
    toks = ddl.tokens(rest)
    if not toks or toks[0].kind != "group":
        return None, None  # LIKE x, [AS] SELECT
    defs: list[_Def] = []
    pk: list[str] = []
    for item in ddl.split_top_level(toks[0].text[1:-1]):
        it = ddl.tokens(item)
        if it[0].word == "LIKE":
            return None, None
        key = _table_key(it)
        if key is None:
            defs.append(_column(_name(it[0]), it[1:], mariadb))
        pk += key or []
    pk += [d.name for d in defs if d.primary and d.name not in pk]
    if any(t.word in ("AS", "SELECT") or (t.kind == "group" and _first_word(t.text[1:-1]) == "SELECT")
           for t in toks[1:]):
        return None, pk  # the SELECT adds columns the statement does not spell
    columns: list[ColumnInfo | UnknownColumn] = []
    for d in defs:
        if d.row is not None and d.name in pk:
            d.row["IS_NULLABLE"] = "NO"  # primary key columns are NOT NULL
        col = d.column()
        columns.append(cast(ColumnInfo, col.describe()) if col else {"name": d.name, "unknown": d.type_text})
    return columns, pk


def _column_op(op: AddOp | ModifyOp, d: _Def, mariadb: bool) -> list[Op]:
    _defaults(op, d, mariadb)
    return [op, {"op": "primary_key", "columns": [d.name]}] if d.primary else [op]


def _at(toks: list[Token], i: int) -> Token:
    """toks[i], or an empty token past the end (a truncated statement the server never logged)."""
    return toks[i] if i < len(toks) else Token("", "")


def _if(toks: list[Token], i: int, *words: str) -> int:
    """The index after an optional `IF [NOT] EXISTS` at toks[i]."""
    return i + len(words) if [t.word for t in toks[i : i + len(words)]] == list(words) else i


def _add(toks: list[Token], mariadb: bool) -> list[Op]:
    """ADD [COLUMN] [IF NOT EXISTS] c def | ADD [COLUMN] (a def, b def) | ADD [CONSTRAINT x] PRIMARY KEY (..)."""
    key = None if toks[1].word == "COLUMN" else _table_key(toks[1:])
    if key is not None:
        return [{"op": "primary_key", "columns": key}] if key else []
    i = 1 + (toks[1].word == "COLUMN")
    j = _if(toks, i, "IF", "NOT", "EXISTS")
    group = _at(toks, j).kind == "group"
    items = [ddl.tokens(p) for p in ddl.split_top_level(toks[j].text[1:-1])] if group else [toks[j:]]
    ops: list[Op] = []
    for it in items:
        if not it:
            continue
        op: AddOp = {"op": "add"}
        if j > i:
            op["if_not_exists"] = True
        ops += _column_op(op, _column(_name(it[0]), it[1:], mariadb), mariadb)
    return ops


def _drop(toks: list[Token]) -> list[Op]:
    """DROP [COLUMN] [IF EXISTS] c | DROP PRIMARY KEY; dropping any other key changes no column."""
    w1 = toks[1].word
    if w1 == "PRIMARY":
        return [{"op": "drop_primary_key"}]
    if w1 in _TABLE_KEYS | {"CONSTRAINT", "PERIOD", "SYSTEM"}:
        return []
    i = 1 + (w1 == "COLUMN")
    j = _if(toks, i, "IF", "EXISTS")
    op: DropOp = {"op": "drop", "name": _name(_at(toks, j))}
    if j > i:
        op["if_exists"] = True
    return [op]


def _modify(toks: list[Token], change: bool, mariadb: bool) -> list[Op]:
    """MODIFY [COLUMN] [IF EXISTS] c def | CHANGE [COLUMN] [IF EXISTS] old new def."""
    i = 1 + (toks[1].word == "COLUMN")
    j = _if(toks, i, "IF", "EXISTS")
    old = _name(_at(toks, j))
    new = _name(_at(toks, j + 1)) if change else old
    op: ModifyOp = {"op": "modify", "old": old}
    if j > i:
        op["if_exists"] = True
    return _column_op(op, _column(new, toks[j + 1 + change :], mariadb), mariadb)


# (first word, second word) -> rows may be removed. EXCHANGE and CONVERT move rows in and out.
_RELOADS = {("DROP", "PARTITION"): True, ("TRUNCATE", "PARTITION"): True, ("EXCHANGE", "PARTITION"): True,
            ("CONVERT", "PARTITION"): True, ("CONVERT", "TABLE"): True, ("CONVERT", "TO"): False}


def _reload(toks: list[Token]) -> ReloadOp | None:
    """A spec that changes rows without row events, else None (ADD/REORGANIZE/COALESCE PARTITION keep them)."""
    words = (toks[0].word, toks[1].word)
    if words not in _RELOADS:
        return None
    return {"op": "reload", "what": " ".join(words), "removes": _RELOADS[words]}


def _spec(spec: str, table: tuple[str, str], db: str, mariadb: bool, lower_names: bool) -> list[Op]:
    """The ops of one ALTER TABLE spec (`ADD COLUMN ...`, `DROP x`, `RENAME TO t2`, ...)."""
    toks = ddl.tokens(spec)
    toks += [Token("", "")] * (4 - min(len(toks), 4))  # so that short specs index safely
    head = toks[0].word
    reload = _reload(toks)
    if reload is not None:
        return [reload]
    if head == "ADD":
        return _add(toks, mariadb)
    if head == "DROP":
        return _drop(toks)
    if head in ("MODIFY", "CHANGE"):
        return _modify(toks, head == "CHANGE", mariadb)
    if head == "RENAME" and toks[1].word == "COLUMN":
        j = _if(toks, 2, "IF", "EXISTS")
        return [{"op": "rename", "old": _name(_at(toks, j)), "new": _name(_at(toks, j + 2))}]
    target = ddl.rename_target(spec, db, lower_names=lower_names) if head == "RENAME" else None
    return [{"op": "rename_table", "from": list(table), "to": list(target)}] if target else []


def describe(sql: str, db: str, *, mariadb: bool = True, lower_names: bool = False) -> Alter:
    """The structured change of one DDL statement; `db` is the session's database for unqualified names.

    :param mariadb: the source's flavour (MariaDB's JSON is LONGTEXT; it truncates extra fractional
        digits where MySQL rounds them)
    :param lower_names: the source runs with lower_case_table_names=1: renames name tables in lower
        case, as the server stores them (`ddl.stored_name`); column names keep their spelling
    """
    stmt = ddl.parse(sql, db, lower_names=lower_names)
    out: Alter = {"kind": _KINDS.get(stmt.kind, "other"), "ops": [], "columns": None, "pk": None, "renames": []}
    if stmt.kind == "create":
        out["columns"], out["pk"] = _create(stmt.rest, mariadb)
        if _IF_NOT_EXISTS.match(ddl.strip_comments(sql)):
            out["if_not_exists"] = True
    elif stmt.kind == "alter":
        table = stmt.tables[0]
        for spec in ddl.split_top_level(stmt.rest):
            for op in _spec(spec, table, db, mariadb, lower_names):
                out["ops"].append(op)
                if op["op"] == "rename_table":
                    out["renames"].append([*op["from"], *op["to"]])
                    table = (op["to"][0], op["to"][1])
    elif stmt.kind == "rename":
        pairs = zip(stmt.tables[0::2], stmt.tables[1::2], strict=False)
        out["renames"] = [[*old, *new] for old, new in pairs]
        out["ops"] = [{"op": "rename_table", "from": r[:2], "to": r[2:]} for r in out["renames"]]
    return out

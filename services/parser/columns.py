"""Table schemas from TableMap events: column names, MySQL types and one decoder per column.

Names and types come from the TableMap optional metadata (binlog_row_metadata=FULL), so a row
always decodes with the columns it was written with, before or after any ALTER TABLE.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any

from services.parser import values as v
from services.parser.rows import Image, image_decoder
from shared.envelope import pack_schema
from shared.errors import DecodeError, SourceMisconfigured

_TYPE_NAMES = {
    v.TINY: "tinyint", v.SHORT: "smallint", v.INT24: "mediumint", v.LONG: "int", v.LONGLONG: "bigint",
    v.FLOAT: "float", v.DOUBLE: "double", v.NEWDECIMAL: "decimal", v.DATE: "date",
    v.DATETIME2: "datetime", v.DATETIME: "datetime", v.TIMESTAMP2: "timestamp", v.TIMESTAMP: "timestamp",
    v.TIME2: "time", v.TIME: "time", v.YEAR: "year", v.ENUM: "enum", v.SET: "set", v.JSON: "json",
    v.GEOMETRY: "geometry", v.BIT: "bit", v.VECTOR: "vector",
}
_BLOB_SIZES = {1: "tiny", 2: "", 3: "medium", 4: "long"}

# MySQL charset name -> Python codec. MySQL's latin1 is really cp1252.
CODECS = {
    "utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "latin1": "cp1252", "ascii": "ascii",
    "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be",
    "cp1250": "cp1250", "cp1251": "cp1251", "cp1256": "cp1256", "cp1257": "cp1257", "cp850": "cp850",
    "cp852": "cp852", "cp866": "cp866", "cp932": "cp932", "latin2": "iso8859-2", "latin5": "iso8859-9",
    "latin7": "iso8859-13", "greek": "iso8859-7", "hebrew": "iso8859-8", "koi8r": "koi8-r",
    "koi8u": "koi8-u", "gbk": "gbk", "gb2312": "gb2312", "gb18030": "gb18030", "big5": "big5",
    "sjis": "shift_jis", "ujis": "euc-jp", "eucjpms": "euc-jp", "euckr": "euc-kr", "tis620": "tis-620",
    "macroman": "mac-roman", "swe7": "ascii", "armscii8": "armscii8", "keybcs2": "cp852",
}


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool
    ctype: v.ColumnType
    charset: str | None = None
    dimensions: int = 0  # VECTOR: floats per value (0 when the source does not say)

    def describe(self) -> dict[str, Any]:
        """The column as it travels in the envelope's `schema`."""
        out: dict[str, Any] = {"name": self.name, "type": self.type, "nullable": self.nullable}
        t = self.ctype
        if t.unsigned:
            out["unsigned"] = True
        if t.code == v.NEWDECIMAL:
            out["precision"], out["scale"] = t.precision, t.scale
        if t.code in (v.DATETIME2, v.TIMESTAMP2, v.TIME2):
            out["fsp"] = t.fsp
        if t.code in (v.VARCHAR, v.VAR_STRING, v.STRING):
            out["length"] = t.length  # in bytes, as the binlog knows it
        if t.code == v.BIT:
            out["length"] = t.length
        if t.values:
            out["values"] = list(t.values)
        if self.dimensions:
            out["dimensions"] = self.dimensions
        if self.charset:
            out["charset"] = self.charset
        return out


@dataclass(frozen=True)
class TableSchema:
    """One table as a TableMap describes it, with its compiled row decoders."""

    db: str
    table: str
    columns: tuple[Column, ...]
    pk: tuple[str, ...]
    names: tuple[str, ...] = field(init=False)
    decoders: tuple[v.Decoder, ...] = field(init=False)
    image: Image = field(init=False)  # one row image -> (row, next position)
    described: dict[str, Any] = field(init=False)
    packed: bytes = field(init=False)
    id: str = field(init=False)
    stats: v.DecodeStats = field(default_factory=v.DecodeStats, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "names", tuple(c.name for c in self.columns))
        decoders = []
        for c in self.columns:
            try:
                decoders.append(v.decoder_for(c.ctype, self.stats))
            except DecodeError as exc:
                raise DecodeError(f"{self.db}.{self.table}.{c.name}: {exc}") from None
        set_(self, "decoders", tuple(decoders))
        set_(self, "image", image_decoder(self.names, self.decoders))
        cols = [c.describe() for c in self.columns]
        sid = hashlib.blake2b(pack_schema({"c": cols, "pk": list(self.pk)}), digest_size=8).hexdigest()
        set_(self, "id", sid)
        set_(self, "described", {"id": sid, "columns": cols})
        set_(self, "packed", pack_schema(self.described))


def column_from_library(col: Any, nullable: bool, dbms: str) -> Column:
    """Translate a mysql-replication `Column` (TableMap metadata) into ours."""
    code = col.type
    length = 0
    if code in (v.VARCHAR, v.VAR_STRING, v.STRING):
        length = col.max_length
    elif code in (v.BLOB, v.GEOMETRY, v.JSON, v.VECTOR):
        length = col.length_size
    elif code in (v.ENUM, v.SET):
        length = col.size
    elif code == v.BIT:
        length = col.bits
    members: tuple[str, ...] = ()
    if code == v.ENUM:
        members = tuple(col.enum_values[1:])
    elif code == v.SET:
        members = tuple(col.set_values or ())
    return build_column(col.name, code, nullable, collation=col.collation_name or "",
                        fallback_codec=col.character_set_name, unsigned=bool(col.unsigned),
                        precision=getattr(col, "precision", 0), scale=getattr(col, "decimals", 0),
                        fsp=getattr(col, "fsp", 0), length=length, members=members)


def build_column(name: str, code: int, nullable: bool, *, collation: str, fallback_codec: str | None = None,
                 unsigned: bool = False, precision: int = 0, scale: int = 0, fsp: int = 0, length: int = 0,
                 members: tuple[str, ...] = ()) -> Column:
    """One column from its type facts; the binlog's TableMap and the snapshot's catalog both use it.

    `length` is what the binlog knows: VARCHAR/CHAR max bytes, BLOB/JSON/GEOMETRY length-prefix
    size, ENUM/SET bytes, BIT bits.
    """
    charset = "binary" if collation == "binary" else (collation.split("_", 1)[0] or None)
    encoding = None if charset in (None, "binary") else CODECS.get(charset, fallback_codec)
    type_name = _TYPE_NAMES.get(code, "")
    if code in (v.VARCHAR, v.VAR_STRING):
        type_name = "varbinary" if encoding is None else "varchar"
    elif code == v.STRING:
        type_name = "binary" if encoding is None else "char"
    elif code == v.BLOB:
        type_name = _BLOB_SIZES.get(length, "") + ("blob" if encoding is None else "text")
    if code == v.GEOMETRY:
        encoding, charset = None, None
    ctype = v.ColumnType(
        code=code, unsigned=unsigned, precision=precision, scale=scale, fsp=fsp, length=length,
        encoding=encoding if code in (v.VARCHAR, v.VAR_STRING, v.STRING, v.BLOB) else None,
        values=members,
    )
    keep_charset = charset if code in (v.VARCHAR, v.VAR_STRING, v.STRING, v.BLOB, v.ENUM, v.SET) else None
    return Column(name=name, type=type_name or f"type{code}", nullable=nullable, ctype=ctype, charset=keep_charset)


def schema_from_table_map(event: Any, stats: v.DecodeStats | None = None) -> TableSchema:
    """Build a TableSchema from a mysql-replication TableMapEvent."""
    if not event.columns or any(c.name is None for c in event.columns):
        raise SourceMisconfigured(
            f"TableMap of {event.schema}.{event.table} carries no column names; "
            "set binlog_row_metadata=FULL on the source"
        )
    nulls = event.null_bitmask
    columns = tuple(
        column_from_library(c, bool(nulls[i >> 3] & (1 << (i & 7))), event.dbms)
        for i, c in enumerate(event.columns)
    )
    dimensions = iter(getattr(event, "binlake_vector_dimensions", ()))
    columns = tuple(dataclasses.replace(c, dimensions=next(dimensions, 0)) if c.ctype.code == v.VECTOR else c
                    for c in columns)
    meta = event.optional_metadata
    pk_idx = list(meta.simple_primary_key_list or []) or list(meta.primary_keys_with_prefix or {})
    return TableSchema(db=event.schema, table=event.table, columns=columns,
                       pk=tuple(columns[i].name for i in pk_idx), stats=stats or v.DecodeStats())

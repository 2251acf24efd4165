"""Pure: DESIGN §4 envelope values -> Arrow arrays with the lake's Spark types.

| MySQL | Arrow (-> Spark) |
|---|---|
| TINYINT..BIGINT | int8..int64 (unsigned widen: tinyint->int16, smallint->int32, int->int64) |
| BIGINT UNSIGNED, BIT(64) | decimal(20,0) |
| DECIMAL(p,s) | decimal(p,s); p > 38 -> string |
| FLOAT / DOUBLE | float32 / float64 |
| DATE | date32 |
| DATETIME(fsp) | timestamp[us] -> timestamp_ntz |
| TIMESTAMP(fsp) | timestamp[us, UTC] -> timestamp (UTC session) |
| TIME, CHAR/VARCHAR/TEXT, ENUM, JSON | string |
| YEAR | int32 |
| BIT(n<64) | int64 |
| BINARY/VARBINARY/BLOB, GEOMETRY | binary |
| SET | list<string> -> array<string> |
| VECTOR (MySQL 9) | list<float32> -> array<float> |

Conversion is columnar: a column of ISO strings is cast by Arrow in one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shared.mysql_types import BINARIES, TEXTS

_INTS = {"tinyint": (pa.int8(), pa.int16()), "smallint": (pa.int16(), pa.int32()),
         "mediumint": (pa.int32(), pa.int32()), "int": (pa.int32(), pa.int64())}
_STRINGS = {*TEXTS, "enum", "json", "time"}
_BINARY = {*BINARIES, "geometry"}


def arrow_type(col: dict[str, Any]) -> pa.DataType:
    """The Arrow type of an envelope schema column."""
    t = col["type"]
    unsigned = bool(col.get("unsigned"))
    if t in _INTS:
        return _INTS[t][1 if unsigned else 0]
    if t == "bigint":
        return pa.decimal128(20, 0) if unsigned else pa.int64()
    if t == "decimal":
        p, s = int(col.get("precision", 10)), int(col.get("scale", 0))
        return pa.decimal128(p, s) if p <= 38 else pa.string()
    if t == "float":
        return pa.float32()
    if t == "double":
        return pa.float64()
    if t == "date":
        return pa.date32()
    if t == "datetime":
        return pa.timestamp("us")
    if t == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if t == "year":
        return pa.int32()
    if t == "bit":
        return pa.decimal128(20, 0) if int(col.get("length", 1)) >= 64 else pa.int64()
    if t == "set":
        return pa.list_(pa.string())
    if t == "vector":
        return pa.list_(pa.float32())
    if t in _BINARY:
        return pa.binary()
    return pa.string()  # char/varchar/text/enum/json/time and anything unknown


def to_array(values: Sequence[Any], col: dict[str, Any]) -> pa.Array:
    """Build the Arrow array of one column from its envelope values."""
    target = arrow_type(col)
    if pa.types.is_decimal(target) or pa.types.is_date(target) or pa.types.is_timestamp(target):
        text = pa.array([None if v is None else str(v) for v in values], pa.string())
        if pa.types.is_timestamp(target) and target.tz is not None:
            text = pc.replace_substring(text, "Z", "")  # the instant is UTC either way
            return pc.cast(pc.cast(text, pa.timestamp("us")), target)
        return pc.cast(text, target)
    return pa.array(values, target)


def spark_type(col: dict[str, Any]) -> str:
    """The Spark SQL type of a column in the lake (DATETIME is timestamp_ntz, which Arrow cannot say).

    Iceberg has no 8/16-bit integers: TINYINT and SMALLINT are `int` in the lake.
    """
    if col["type"] == "datetime":
        return "timestamp_ntz"
    t = arrow_type(col)
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return _SPARK_OF_ARROW.get(t, "string")


# Spark SQL type <-> the Arrow type its values are cast to on the way into Spark.
_ARROW_OF_SPARK = {"boolean": pa.bool_(), "tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(),
                   "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(), "date": pa.date32(),
                   "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us"),
                   "string": pa.string(), "binary": pa.binary(), "array<string>": pa.list_(pa.string()),
                   "array<float>": pa.list_(pa.float32())}
_SPARK_OF_ARROW = {a: s for s, a in _ARROW_OF_SPARK.items() if s not in ("boolean", "tinyint", "smallint")} | {
    pa.int8(): "int", pa.int16(): "int"}


def arrow_of_spark(spark: str) -> pa.DataType:
    """The Arrow type that carries values of Spark SQL type `spark` into a DataFrame."""
    if spark.startswith("decimal("):
        p, s = (int(x) for x in spark[8:-1].split(","))
        return pa.decimal128(p, s)
    return _ARROW_OF_SPARK[spark]


# Iceberg's legal type promotions (the only in-place type changes a table allows).
_PROMOTIONS = {("int", "bigint"), ("float", "double")}


def promotable(old: str, new: str) -> bool:
    """Can an Iceberg column of Spark type `old` be promoted in place to `new`?"""
    if (old, new) in _PROMOTIONS:
        return True
    if old.startswith("decimal(") and new.startswith("decimal("):
        (p1, s1), (p2, s2) = (tuple(int(x) for x in t[8:-1].split(",")) for t in (old, new))
        return s1 == s2 and p2 >= p1
    return False

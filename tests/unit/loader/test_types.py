"""services.loader.types: envelope values (DESIGN §4) -> Arrow arrays and Spark types (pure, pyarrow only)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from services.loader.types import arrow_type, promotable, spark_type, to_array

UTC = dt.UTC


def col(t: str, **kw: Any) -> dict[str, Any]:
    return {"name": "c", "type": t, "nullable": True, **kw}


# (column, Arrow type, Spark type) for every row of the DESIGN §4 table
TYPES: list[tuple[dict[str, Any], pa.DataType, str]] = [
    # Iceberg has no 8/16-bit integers: the lake stores TINYINT and SMALLINT as int.
    (col("tinyint"), pa.int8(), "int"),
    (col("tinyint", unsigned=True), pa.int16(), "int"),
    (col("smallint"), pa.int16(), "int"),
    (col("smallint", unsigned=True), pa.int32(), "int"),
    (col("mediumint"), pa.int32(), "int"),
    (col("mediumint", unsigned=True), pa.int32(), "int"),
    (col("int"), pa.int32(), "int"),
    (col("int", unsigned=True), pa.int64(), "bigint"),
    (col("bigint"), pa.int64(), "bigint"),
    (col("bigint", unsigned=True), pa.decimal128(20, 0), "decimal(20,0)"),
    (col("decimal", precision=10, scale=2), pa.decimal128(10, 2), "decimal(10,2)"),
    (col("decimal", precision=38, scale=10), pa.decimal128(38, 10), "decimal(38,10)"),
    (col("decimal", precision=39, scale=0), pa.string(), "string"),
    (col("decimal", precision=65, scale=30), pa.string(), "string"),
    (col("float"), pa.float32(), "float"),
    (col("double"), pa.float64(), "double"),
    (col("date"), pa.date32(), "date"),
    *[(col("datetime", fsp=f), pa.timestamp("us"), "timestamp_ntz") for f in range(7)],
    *[(col("timestamp", fsp=f), pa.timestamp("us", tz="UTC"), "timestamp") for f in range(7)],
    (col("time", fsp=6), pa.string(), "string"),
    (col("year"), pa.int32(), "int"),
    (col("char", charset="utf8mb4", length=20), pa.string(), "string"),
    (col("varchar", charset="latin1", length=10), pa.string(), "string"),
    *[(col(t), pa.string(), "string") for t in ("tinytext", "text", "mediumtext", "longtext")],
    *[(col(t), pa.binary(), "binary")
      for t in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry")],
    (col("bit", length=1), pa.int64(), "bigint"),
    (col("bit", length=63), pa.int64(), "bigint"),
    (col("bit", length=64), pa.decimal128(20, 0), "decimal(20,0)"),
    (col("enum", values=["a", "b"]), pa.string(), "string"),
    (col("set", values=["x", "y", "z"]), pa.list_(pa.string()), "array<string>"),
    (col("json"), pa.string(), "string"),
]


@pytest.mark.parametrize(("column", "arrow", "spark"), TYPES, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_arrow_and_spark_type_of_every_type(column, arrow, spark):
    assert arrow_type(column) == arrow
    assert spark_type(column) == spark


@pytest.mark.parametrize(("column", "arrow", "spark"), TYPES, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_null_is_null_in_every_type(column, arrow, spark):
    array = to_array([None, None], column)
    assert array.type == arrow
    assert array.null_count == 2


def check(column: dict[str, Any], values: list[Any], expected: list[Any]) -> pa.Array:
    array = to_array(values, column)
    assert array.type == arrow_type(column)
    assert array.to_pylist() == expected
    return array


@pytest.mark.parametrize(("t", "unsigned", "values"), [
    ("tinyint", False, [-128, 127, 0]),
    ("tinyint", True, [0, 255]),
    ("smallint", False, [-32768, 32767]),
    ("smallint", True, [65535]),
    ("mediumint", False, [-8388608, 8388607]),
    ("mediumint", True, [16777215]),
    ("int", False, [-2147483648, 2147483647]),
    ("int", True, [4294967295, 0]),
    ("bigint", False, [-9223372036854775808, 9223372036854775807]),
])
def test_integer_edges_fit(t, unsigned, values):
    check(col(t, unsigned=unsigned), [*values, None], [*values, None])


def test_unsigned_bigint_max_is_an_exact_decimal_20_0():
    a = check(col("bigint", unsigned=True), [18446744073709551615, 0, 9223372036854775808, None],
              [Decimal("18446744073709551615"), Decimal(0), Decimal("9223372036854775808"), None])
    assert a.type == pa.decimal128(20, 0)


def test_bit_64_all_ones_is_an_exact_decimal_and_small_bits_are_long():
    check(col("bit", length=64), [2**64 - 1, 0, 1], [Decimal(2**64 - 1), Decimal(0), Decimal(1)])
    check(col("bit", length=1), [1, 0, None], [1, 0, None])
    check(col("bit", length=63), [2**63 - 1], [2**63 - 1])


def test_decimal_up_to_38_digits_is_exact():
    check(col("decimal", precision=10, scale=2), ["-12345678.90", "0.00", "0.01", "-0.01", "99999999.99"],
          [Decimal("-12345678.90"), Decimal("0.00"), Decimal("0.01"), Decimal("-0.01"), Decimal("99999999.99")])
    check(col("decimal", precision=5, scale=0), ["-99999", "42"], [Decimal(-99999), Decimal(42)])
    check(col("decimal", precision=18, scale=9), ["123456789.123456789"], [Decimal("123456789.123456789")])
    big = "9" * 28 + "." + "9" * 10
    a = check(col("decimal", precision=38, scale=10), [big, "-" + big], [Decimal(big), Decimal("-" + big)])
    assert str(a.to_pylist()[0]) == big  # no rounding through float


def test_decimal_65_30_stays_its_canonical_string():
    values = ["12345678901234567890123456789012345.123456789012345678901234567890",
              "-1.000000000000000000000000000001", None]
    check(col("decimal", precision=65, scale=30), values, values)


def test_float_and_double():
    a = to_array([1.1, -3.4e38, 0.0, None], col("float"))
    assert a.type == pa.float32()
    assert a.to_pylist()[0] == pytest.approx(1.1, rel=1e-7)
    assert a.to_pylist()[1:] == [pytest.approx(-3.4e38, rel=1e-7), 0.0, None]
    check(col("double"), [1.7976931348623157e308, -0.5, None], [1.7976931348623157e308, -0.5, None])


def test_date_edges():
    check(col("date"), ["1000-01-01", "9999-12-31", "2024-02-29", None],
          [dt.date(1000, 1, 1), dt.date(9999, 12, 31), dt.date(2024, 2, 29), None])


@pytest.mark.parametrize(("fsp", "text", "micro"), [
    (0, "2020-01-02T03:04:05", 0),
    (1, "2020-01-02T03:04:05.1", 100000),
    (2, "2020-01-02T03:04:05.12", 120000),
    (3, "2020-01-02T03:04:05.120", 120000),
    (4, "2020-01-02T03:04:05.1234", 123400),
    (5, "2020-01-02T03:04:05.12345", 123450),
    (6, "2020-01-02T03:04:05.123456", 123456),
])
def test_datetime_every_fsp_is_exact_in_microseconds_without_zone(fsp, text, micro):
    a = check(col("datetime", fsp=fsp), [text, None], [dt.datetime(2020, 1, 2, 3, 4, 5, micro), None])
    assert a.type == pa.timestamp("us") and a.type.tz is None


def test_datetime_extremes():
    check(col("datetime", fsp=6), ["9999-12-31T23:59:59.999999", "1000-01-01T00:00:00.000001"],
          [dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(1000, 1, 1, 0, 0, 0, 1)])


@pytest.mark.parametrize(("fsp", "text", "expected"), [
    (0, "1970-01-01T00:00:01Z", dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)),
    (6, "2038-01-19T03:14:07.999999Z", dt.datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=UTC)),
    (2, "2001-02-03T04:05:06.78Z", dt.datetime(2001, 2, 3, 4, 5, 6, 780000, tzinfo=UTC)),
    (3, "2020-06-01T10:00:00.500Z", dt.datetime(2020, 6, 1, 10, 0, 0, 500000, tzinfo=UTC)),
])
def test_timestamp_with_z_is_the_utc_instant(fsp, text, expected):
    a = to_array([text, None], col("timestamp", fsp=fsp))
    assert a.type == pa.timestamp("us", tz="UTC")
    got = a.to_pylist()
    assert got[1] is None
    assert got[0] == expected and got[0].utcoffset() == dt.timedelta(0)
    # the stored integer is microseconds since the epoch of that instant, not of a local time
    micros = (expected - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
    assert a.cast(pa.int64()).to_pylist()[0] == micros


def test_time_stays_its_string_including_negative_fractions():
    values = ["-838:59:59", "838:59:59", "00:00:00", "-00:00:00.5", "-01:02:03.25", "-00:00:00.000001", None]
    check(col("time", fsp=6), values, values)


def test_year_zero_stays_zero():
    check(col("year"), [0, 1901, 2155, None], [0, 1901, 2155, None])


def test_strings_keep_their_text():
    values = ["ab", "", "ü😀", "äöü€", "é" * 300, "x" * 70000, None]
    check(col("varchar", charset="utf8mb4"), values, values)
    check(col("enum", values=["a", "c"]), ["c", "a", None], ["c", "a", None])
    check(col("json"), ['{"a": [1, 2.5, null]}'], ['{"a": [1, 2.5, null]}'])


def test_binary_keeps_trailing_zero_bytes():
    values = [b"\x01\x00\x00\x00", b"\x00\x00\x00\x00", b"", b"\xab" * 1000, None]
    check(col("binary", length=4), values, values)
    check(col("blob"), values, values)
    point = b"\x00\x00\x00\x00\x01\x01\x00\x00\x00" + b"\x00" * 7 + b"\xf0?" + b"\x00" * 7 + b"@"
    check(col("geometry"), [point], [point])


def test_set_is_a_list_of_strings_and_empty_stays_empty():
    a = check(col("set", values=["x", "y", "z"]), [[], ["x", "z"], None], [[], ["x", "z"], None])
    assert a.type == pa.list_(pa.string())
    assert a.null_count == 1  # the empty set is not null


def test_an_empty_column_has_its_type():
    for column, arrow, _ in TYPES:
        assert to_array([], column).type == arrow


# -- promotions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), [
    ("int", "bigint"),
    ("float", "double"),
    ("decimal(10,2)", "decimal(12,2)"),
    ("decimal(10,2)", "decimal(38,2)"),
    ("decimal(20,0)", "decimal(21,0)"),
])
def test_iceberg_promotions(old, new):
    assert promotable(old, new)


@pytest.mark.parametrize(("old", "new"), [
    ("bigint", "int"),
    ("double", "float"),
    ("int", "double"),
    ("int", "float"),
    ("int", "string"),
    ("string", "int"),
    ("int", "decimal(20,0)"),
    ("bigint", "decimal(20,0)"),
    ("decimal(20,0)", "bigint"),
    ("decimal(12,2)", "decimal(10,2)"),
    ("decimal(10,2)", "decimal(12,3)"),
    ("decimal(10,2)", "decimal(10,1)"),
    ("date", "timestamp"),
    ("timestamp_ntz", "timestamp"),
    ("timestamp", "timestamp_ntz"),
    ("string", "binary"),
    ("array<string>", "string"),
])
def test_other_type_changes_are_not_promotions(old, new):
    assert not promotable(old, new)


def test_a_modify_between_mysql_types_promotes_where_iceberg_allows():
    """The pairs schema_change meets: Spark types of the old and the new MySQL column."""
    def change(old: dict[str, Any], new: dict[str, Any]) -> bool:
        return promotable(spark_type(old), spark_type(new))

    assert spark_type(col("tinyint")) == spark_type(col("smallint")) == spark_type(col("int"))  # no change at all
    assert change(col("int"), col("bigint"))
    assert change(col("int"), col("int", unsigned=True))
    assert change(col("smallint", unsigned=True), col("int", unsigned=True))
    assert change(col("float"), col("double"))
    assert change(col("decimal", precision=10, scale=2), col("decimal", precision=18, scale=2))
    assert not change(col("bigint"), col("bigint", unsigned=True))  # long -> decimal(20,0): a rewrite
    assert not change(col("decimal", precision=10, scale=2), col("decimal", precision=12, scale=4))
    assert not change(col("decimal", precision=38, scale=0), col("decimal", precision=39, scale=0))  # -> string
    assert not change(col("datetime"), col("timestamp"))
    assert not change(col("varchar"), col("int"))

"""services.loader.schema_change.literal: envelope values (DESIGN §4) -> Spark SQL literals (pure text, no Spark).

Text travels hex-encoded (`CAST(X'..' AS STRING)`), so no quote, backslash or non-ASCII
character of a default can end up in the SQL itself.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.loader.schema_change import literal

HEX_STRING = re.compile(r"CAST\(X'([0-9a-f]*)' AS STRING\)")


def text(s: str) -> str:
    return f"CAST(X'{s.encode().hex()}' AS STRING)"


def decoded(sql: str) -> list[str]:
    """The strings a literal carries, decoded from their hex."""
    return [bytes.fromhex(h).decode() for h in HEX_STRING.findall(sql)]


@pytest.mark.parametrize(("value", "kind", "sql"), [
    # numbers
    (0, "int", "CAST(0 AS int)"),
    (-128, "int", "CAST(-128 AS int)"),  # TINYINT: an int column in the lake
    (2147483647, "int", "CAST(2147483647 AS int)"),
    (-9223372036854775808, "bigint", "CAST(-9223372036854775808 AS bigint)"),
    (18446744073709551615, "decimal(20,0)", "CAST(18446744073709551615 AS decimal(20,0))"),  # BIGINT UNSIGNED
    (2021, "int", "CAST(2021 AS int)"),  # YEAR
    (5, "bigint", "CAST(5 AS bigint)"),  # BIT(n)
    (1.5, "double", "CAST(1.5 AS double)"),
    (-0.25, "float", "CAST(-0.25 AS float)"),
    (3, "double", "CAST(3 AS double)"),
    (1e16, "double", "CAST(1e+16 AS double)"),
    (1e-05, "float", "CAST(1e-05 AS float)"),
    # numbers into a string column: the number's text
    (7, "string", text("7")),
    (2.5, "string", text("2.5")),
    # DECIMAL: its canonical string, exact
    ("12.50", "decimal(10,2)", f"CAST({text('12.50')} AS decimal(10,2))"),
    ("-0.001", "decimal(5,3)", f"CAST({text('-0.001')} AS decimal(5,3))"),
    ("1" * 65, "string", f"CAST({text('1' * 65)} AS string)"),  # DECIMAL(65,0) is a string in the lake
    # DATE / DATETIME / TIMESTAMP
    ("2020-01-02", "date", f"CAST({text('2020-01-02')} AS date)"),
    (dt.date(2020, 1, 2), "date", f"CAST({text('2020-01-02')} AS date)"),
    ("2020-01-02T03:04:05.123456", "timestamp_ntz", f"CAST({text('2020-01-02T03:04:05.123456')} AS timestamp_ntz)"),
    (dt.datetime(2020, 1, 2, 3, 4, 5, 6), "timestamp_ntz",
     f"CAST({text('2020-01-02T03:04:05.000006')} AS timestamp_ntz)"),
    ("1970-01-01T00:00:01Z", "timestamp", f"CAST({text('1970-01-01T00:00:01')} AS timestamp)"),  # UTC session
    ("2038-01-19T03:14:07.999999Z", "timestamp", f"CAST({text('2038-01-19T03:14:07.999999')} AS timestamp)"),
    # TIME, CHAR/VARCHAR/TEXT, ENUM, JSON: strings
    ("-838:59:59.000001", "string", f"CAST({text('-838:59:59.000001')} AS string)"),
    ("", "string", f"CAST({text('')} AS string)"),
    ("null", "string", f"CAST({text('null')} AS string)"),  # JSON null, not SQL NULL
    # BINARY/BLOB/GEOMETRY: bytes, trailing zeros kept
    (b"\x01\x00\x00", "binary", "X'010000'"),
    (b"", "binary", "X''"),
    # SET
    (["a", "b"], "array<string>", f"CAST(array(CAST({text('a')} AS string), CAST({text('b')} AS string)) "
                                  "AS array<string>)"),
    ([], "array<string>", "CAST(array() AS array<string>)"),
    # NULL
    (None, "int", "CAST(NULL AS int)"),
    (None, "string", "CAST(NULL AS string)"),
    (None, "decimal(20,0)", "CAST(NULL AS decimal(20,0))"),
    (None, "timestamp_ntz", "CAST(NULL AS timestamp_ntz)"),
    (None, "array<string>", "CAST(NULL AS array<string>)"),
])
def test_literal_of_every_value_kind(value, kind, sql):
    assert literal(value, kind) == sql


@pytest.mark.parametrize("value", [
    "it's", 'say "hi"', "back`tick", "back\\slash", "semi; DROP TABLE t; --", "new\nline", "nul\x00byte",
    "äöü€", "😀", "${x}", "%_",
])
def test_strings_are_hex_so_nothing_escapes_the_literal(value):
    sql = literal(value, "string")
    assert re.fullmatch(r"CAST\(CAST\(X'[0-9a-f]*' AS STRING\) AS string\)", sql)
    assert decoded(sql) == [value]


def test_set_members_with_quotes_and_commas_stay_members():
    value = ["a,b", "it's", "ü", ""]
    sql = literal(value, "array<string>")
    assert sql.startswith("CAST(array(") and sql.endswith(") AS array<string>)")
    assert "'," not in sql.replace("X'", "")  # no member text outside its hex
    assert decoded(sql) == value


@given(st.text())
def test_any_text_round_trips(value):
    sql = literal(value, "string")
    assert sql.isascii()
    assert decoded(sql) == [value]


@given(st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False)))
def test_numbers_are_plain_sql_numbers(value):
    sql = literal(value, "double")
    assert re.fullmatch(r"CAST\(-?\d+(\.\d+)?(e[+-]\d+)? AS double\)", sql)

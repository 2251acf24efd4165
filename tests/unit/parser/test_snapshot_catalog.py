"""Snapshot catalog: information_schema rows -> the Column the binlog gives, chunking keys and keyset SQL (pure)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pymysqlreplication.column import Column as LibColumn

from services.parser import values as v
from services.parser.columns import Column, TableSchema, build_column, column_from_library
from services.parser.snapshot.catalog import (
    UnsupportedColumn,
    choose_key,
    chunk_sql,
    column_from_catalog,
    key_param,
    keyset_params,
    members,
    placeholder,
)

UTF8 = "utf8mb4_general_ci"
LATIN1 = "latin1_swedish_ci"


def cat(name: str, data_type: str, column_type: str | None = None, *, nullable: bool = False,
        precision: int | None = None, scale: int | None = None, fsp: int | None = None,
        octets: int | None = None, collation: str | None = None) -> dict[str, Any]:
    """One information_schema.COLUMNS row as `describe` reads it."""
    return {
        "COLUMN_NAME": name, "DATA_TYPE": data_type, "COLUMN_TYPE": column_type or data_type,
        "IS_NULLABLE": "YES" if nullable else "NO", "NUMERIC_PRECISION": precision, "NUMERIC_SCALE": scale,
        "DATETIME_PRECISION": fsp, "CHARACTER_OCTET_LENGTH": octets, "COLLATION_NAME": collation,
    }


def lib(name: str, code: int, **kw: Any) -> LibColumn:
    """A mysql-replication Column as a TableMap with binlog_row_metadata=FULL describes it."""
    kw.setdefault("unsigned", False)
    kw.setdefault("collation_name", None)
    kw.setdefault("character_set_name", None)
    kw.setdefault("enum_values", None)
    kw.setdefault("set_values", None)
    return LibColumn(type=code, name=name, **kw)


# (information_schema row, TableMap column, expected type name)
PAIRS = [
    (cat("c", "tinyint", "tinyint(4)", precision=3, scale=0), lib("c", v.TINY), "tinyint"),
    (cat("c", "smallint", "smallint(5) unsigned", precision=5, scale=0), lib("c", v.SHORT, unsigned=True),
     "smallint"),
    (cat("c", "mediumint", "mediumint(9)", precision=7, scale=0), lib("c", v.INT24), "mediumint"),
    (cat("c", "int", "int(10) unsigned", precision=10, scale=0), lib("c", v.LONG, unsigned=True), "int"),
    (cat("c", "bigint", "bigint(20) unsigned zerofill", precision=20, scale=0),
     lib("c", v.LONGLONG, unsigned=True), "bigint"),
    (cat("c", "float", "float", precision=12), lib("c", v.FLOAT, size=4), "float"),
    (cat("c", "double", "double", precision=22), lib("c", v.DOUBLE, size=8), "double"),
    (cat("c", "decimal", "decimal(10,2)", precision=10, scale=2), lib("c", v.NEWDECIMAL, precision=10, decimals=2),
     "decimal"),
    (cat("c", "decimal", "decimal(65,30) unsigned", precision=65, scale=30),
     lib("c", v.NEWDECIMAL, precision=65, decimals=30, unsigned=True), "decimal"),
    (cat("c", "date", nullable=True), lib("c", v.DATE), "date"),
    (cat("c", "datetime", "datetime(3)", fsp=3), lib("c", v.DATETIME2, fsp=3), "datetime"),
    (cat("c", "timestamp", "timestamp(6)", fsp=6), lib("c", v.TIMESTAMP2, fsp=6), "timestamp"),
    (cat("c", "time", fsp=0), lib("c", v.TIME2, fsp=0), "time"),
    (cat("c", "year", "year(4)"), lib("c", v.YEAR, unsigned=True), "year"),
    (cat("c", "varchar", "varchar(10)", octets=40, collation=UTF8),
     lib("c", v.VARCHAR, max_length=40, collation_name=UTF8, character_set_name="utf8"), "varchar"),
    (cat("c", "varchar", "varchar(300)", octets=300, collation=LATIN1),
     lib("c", v.VARCHAR, max_length=300, collation_name=LATIN1, character_set_name="cp1252"), "varchar"),
    (cat("c", "varbinary", "varbinary(16)", octets=16),
     lib("c", v.VARCHAR, max_length=16, collation_name="binary"), "varbinary"),
    (cat("c", "char", "char(3)", octets=3, collation=LATIN1),
     lib("c", v.STRING, max_length=3, collation_name=LATIN1, character_set_name="cp1252"), "char"),
    (cat("c", "char", "char(100)", octets=400, collation=UTF8),
     lib("c", v.STRING, max_length=400, collation_name=UTF8, character_set_name="utf8"), "char"),
    (cat("c", "binary", "binary(4)", octets=4), lib("c", v.STRING, max_length=4, collation_name="binary"),
     "binary"),
    (cat("c", "tinytext", octets=255, collation=UTF8),
     lib("c", v.BLOB, length_size=1, collation_name=UTF8, character_set_name="utf8"), "tinytext"),
    (cat("c", "text", octets=65535, collation=UTF8),
     lib("c", v.BLOB, length_size=2, collation_name=UTF8, character_set_name="utf8"), "text"),
    (cat("c", "mediumtext", octets=16777215, collation=LATIN1),
     lib("c", v.BLOB, length_size=3, collation_name=LATIN1, character_set_name="cp1252"), "mediumtext"),
    (cat("c", "longtext", octets=4294967295, collation=UTF8),
     lib("c", v.BLOB, length_size=4, collation_name=UTF8, character_set_name="utf8"), "longtext"),
    (cat("c", "tinyblob", octets=255), lib("c", v.BLOB, length_size=1, collation_name="binary"), "tinyblob"),
    (cat("c", "blob", octets=65535), lib("c", v.BLOB, length_size=2, collation_name="binary"), "blob"),
    (cat("c", "mediumblob", octets=16777215), lib("c", v.BLOB, length_size=3, collation_name="binary"),
     "mediumblob"),
    (cat("c", "longblob", octets=4294967295), lib("c", v.BLOB, length_size=4, collation_name="binary"),
     "longblob"),
    (cat("c", "enum", "enum('a','it''s')", octets=16, collation=UTF8),
     lib("c", v.ENUM, size=1, enum_values=["", "a", "it's"], collation_name=UTF8, character_set_name="utf8"),
     "enum"),
    (cat("c", "set", "set('x','y','z')", octets=20, collation=LATIN1),
     lib("c", v.SET, size=1, set_values=["x", "y", "z"], collation_name=LATIN1, character_set_name="cp1252"),
     "set"),
    (cat("c", "bit", "bit(10)", precision=10), lib("c", v.BIT, bits=10, bytes=2), "bit"),
    (cat("c", "json", nullable=True), lib("c", v.JSON, length_size=4), "json"),
    (cat("c", "geometry"), lib("c", v.GEOMETRY, length_size=4), "geometry"),
    (cat("c", "point"), lib("c", v.GEOMETRY, length_size=4), "geometry"),
]


@pytest.mark.parametrize(("row", "col", "type_name"), PAIRS, ids=[p[0]["COLUMN_TYPE"] for p in PAIRS])
def test_catalog_column_equals_the_binlog_column(row: dict[str, Any], col: LibColumn, type_name: str) -> None:
    ours = column_from_catalog(row)
    theirs = column_from_library(col, row["IS_NULLABLE"] == "YES", "mariadb")
    assert ours == theirs
    assert ours.type == type_name
    assert ours.describe() == theirs.describe()


def test_a_table_of_every_type_has_the_binlog_schema_id() -> None:
    ours = tuple(column_from_catalog({**row, "COLUMN_NAME": f"c{i}"}) for i, (row, _, _) in enumerate(PAIRS))
    theirs = tuple(
        column_from_library(LibColumn(**{**col.data, "name": f"c{i}"}), row["IS_NULLABLE"] == "YES", "mariadb")
        for i, (row, col, _) in enumerate(PAIRS)
    )
    a = TableSchema(db="d", table="t", columns=ours, pk=("c0",))
    b = TableSchema(db="d", table="t", columns=theirs, pk=("c0",))
    assert a.id == b.id and a.packed == b.packed


@pytest.mark.parametrize(
    ("row", "name", "nullable", "charset", "encoding"),
    [
        (cat("name", "varchar", "varchar(8)", octets=32, collation="utf8mb4_0900_ai_ci", nullable=True), "varchar",
         True, "utf8mb4", "utf-8"),
        (cat("name", "char", "char(2)", octets=2, collation=LATIN1), "char", False, "latin1", "cp1252"),
        (cat("name", "varbinary", "varbinary(8)", octets=8, collation=None), "varbinary", False, "binary", None),
        (cat("name", "binary", "binary(8)", octets=8, collation=None), "binary", False, "binary", None),
        (cat("name", "mediumblob", octets=1 << 24), "mediumblob", False, "binary", None),
        (cat("name", "tinytext", octets=255, collation=LATIN1), "tinytext", False, "latin1", "cp1252"),
        (cat("name", "enum", "enum('a')", collation=LATIN1), "enum", False, "latin1", None),
        (cat("name", "int", "int(11)", precision=10, scale=0), "int", False, None, None),
    ],
)
def test_type_name_charset_and_codec(row: dict[str, Any], name: str, nullable: bool, charset: str | None,
                                     encoding: str | None) -> None:
    c = column_from_catalog(row)
    assert (c.name, c.type, c.nullable, c.charset, c.ctype.encoding) == ("name", name, nullable, charset, encoding)


def test_binary_types_ignore_a_reported_collation() -> None:
    """Binary types get charset "binary" whatever COLLATION_NAME says (MySQL reports NULL, some forks 'binary')."""
    c = column_from_catalog(cat("b", "varbinary", "varbinary(3)", octets=3, collation="binary"))
    assert c.charset == "binary" and c.ctype.encoding is None and c.type == "varbinary"


# -- lengths --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data_type", "octets", "code"),
    [("varchar", 40, v.VARCHAR), ("varchar", 1020, v.VARCHAR), ("char", 12, v.STRING), ("binary", 255, v.STRING),
     ("varbinary", 65532, v.VARCHAR), ("varchar", None, v.VARCHAR)],
)
def test_char_lengths_are_character_octet_length(data_type: str, octets: int | None, code: int) -> None:
    c = column_from_catalog(cat("s", data_type, f"{data_type}(1)", octets=octets, collation=UTF8))
    assert (c.ctype.code, c.ctype.length) == (code, octets or 0)
    assert c.describe()["length"] == (octets or 0)


@pytest.mark.parametrize(("prefix", "size"), [("tiny", 1), ("", 2), ("medium", 3), ("long", 4)])
def test_lob_length_prefix_sizes(prefix: str, size: int) -> None:
    for kind in ("text", "blob"):
        c = column_from_catalog(cat("l", f"{prefix}{kind}", octets=123, collation=UTF8))
        assert (c.ctype.code, c.ctype.length, c.type) == (v.BLOB, size, f"{prefix}{kind}")


def enum_type(kind: str, n: int) -> str:
    return f"{kind}(" + ",".join(f"'m{i}'" for i in range(n)) + ")"


@pytest.mark.parametrize(("n", "size"), [(1, 1), (255, 1), (256, 2), (1000, 2)])
def test_enum_size(n: int, size: int) -> None:
    c = column_from_catalog(cat("e", "enum", enum_type("enum", n), collation=UTF8))
    assert (c.ctype.code, c.ctype.length, len(c.ctype.values)) == (v.ENUM, size, n)
    assert c.ctype.values[-1] == f"m{n - 1}"


@pytest.mark.parametrize(
    ("n", "size"),
    [(1, 1), (8, 1), (9, 2), (16, 2), (17, 3), (24, 3), (25, 4), (32, 4), (33, 8), (40, 8), (64, 8)],
)
def test_set_bytes(n: int, size: int) -> None:
    c = column_from_catalog(cat("s", "set", enum_type("set", n), collation=UTF8))
    assert (c.ctype.code, c.ctype.length, len(c.ctype.values)) == (v.SET, size, n)


@pytest.mark.parametrize(("precision", "bits"), [(1, 1), (8, 8), (10, 10), (64, 64), (None, 1)])
def test_bit_length_is_its_bits(precision: int | None, bits: int) -> None:
    c = column_from_catalog(cat("b", "bit", f"bit({bits})", precision=precision))
    assert (c.ctype.code, c.ctype.length, c.describe()["length"]) == (v.BIT, bits, bits)


def test_year_is_flagged_unsigned_like_the_table_map() -> None:
    c = column_from_catalog(cat("y", "year", "year(4)"))
    assert c.ctype.unsigned and c.describe()["unsigned"] is True


@pytest.mark.parametrize(("column_type", "unsigned"), [("int(11)", False), ("int(10) unsigned", True),
                                                       ("INT(10) UNSIGNED", True)])
def test_unsigned_flag(column_type: str, unsigned: bool) -> None:
    assert column_from_catalog(cat("i", "int", column_type, precision=10, scale=0)).ctype.unsigned is unsigned


def test_decimal_precision_and_scale() -> None:
    c = column_from_catalog(cat("d", "decimal", "decimal(12,4)", precision=12, scale=4))
    assert (c.ctype.code, c.ctype.precision, c.ctype.scale) == (v.NEWDECIMAL, 12, 4)
    assert c.describe() == {"name": "d", "type": "decimal", "nullable": False, "precision": 12, "scale": 4}


def test_precision_and_scale_of_other_numbers_are_dropped() -> None:
    c = column_from_catalog(cat("i", "int", "int(11)", precision=10, scale=0))
    assert (c.ctype.precision, c.ctype.scale) == (0, 0)
    c = column_from_catalog(cat("f", "double", "double(8,3)", precision=8, scale=3))
    assert (c.ctype.precision, c.ctype.scale) == (0, 0)


@pytest.mark.parametrize(("data_type", "code"), [("datetime", v.DATETIME2), ("timestamp", v.TIMESTAMP2),
                                                  ("time", v.TIME2)])
@pytest.mark.parametrize("fsp", [0, 3, 6, None])
def test_fsp_of_temporal_types(data_type: str, code: int, fsp: int | None) -> None:
    c = column_from_catalog(cat("t", data_type, fsp=fsp))
    assert (c.ctype.code, c.ctype.fsp, c.describe()["fsp"]) == (code, fsp or 0, fsp or 0)


def test_date_has_no_fsp() -> None:
    c = column_from_catalog(cat("d", "date", fsp=0))
    assert c.ctype.fsp == 0 and "fsp" not in c.describe()


def test_mysql_vector_reads_its_dimensions() -> None:
    col = column_from_catalog(cat("v", "vector", "vector(3)"))
    assert (col.type, col.dimensions, col.ctype.length) == ("vector", 3, 4)


def test_data_type_is_case_insensitive() -> None:
    assert column_from_catalog(cat("v", "VARCHAR", "varchar(2)", octets=8, collation=UTF8)).type == "varchar"


@pytest.mark.parametrize(("data_type", "column_type"), [("uuid", "uuid"), ("inet6", "inet6"), ("inet4", "inet4"),
                                                         ("xml", "xml")])
def test_unsupported_types_raise(data_type: str, column_type: str) -> None:
    with pytest.raises(UnsupportedColumn, match=re.escape(f"column odd has type {column_type}, ")):
        column_from_catalog(cat("odd", data_type, column_type))
    assert issubclass(UnsupportedColumn, ValueError)


@pytest.mark.parametrize("column_type", ["enum('signed','unsigned')", "set('unsigned_user','x')"])
def test_enum_member_named_unsigned_is_not_an_unsigned_flag(column_type: str) -> None:
    row = cat("e", column_type[:column_type.index("(")], column_type, collation=UTF8)
    ours = column_from_catalog(row)
    found = members(column_type)
    code = v.ENUM if column_type.startswith("enum") else v.SET
    extra = {"enum_values": ["", *found]} if code == v.ENUM else {"set_values": list(found)}
    theirs = column_from_library(lib("e", code, size=1, collation_name=UTF8, character_set_name="utf8", **extra),
                                 False, "mariadb")
    assert ours == theirs
    assert "unsigned" not in ours.describe()


# -- members ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column_type", "expected"),
    [
        ("enum('a','b')", ("a", "b")),
        ("enum('a','it''s')", ("a", "it's")),
        ("set('''','x''''y','z''')", ("'", "x''y", "z'")),
        ("enum('','a')", ("", "a")),
        ("enum('a,b','c')", ("a,b", "c")),
        ("enum('(x)','y)')", ("(x)", "y)")),
        ("enum('caf\u00e9','\U0001f389')", ("caf\u00e9", "\U0001f389")),
        ("enum('a\\\\b')", ("a\\b",)),
        ("ENUM('A','b')", ("A", "b")),
    ],
)
def test_members(column_type: str, expected: tuple[str, ...]) -> None:
    assert members(column_type) == expected


def test_members_feed_the_column_values() -> None:
    c = column_from_catalog(cat("e", "enum", "enum('x','it''s','')", collation=UTF8))
    assert c.ctype.values == ("x", "it's", "")
    assert c.describe()["values"] == ["x", "it's", ""]


# -- choose_key ------------------------------------------------------------------------------------


def cols(*specs: tuple[str, str, str, bool]) -> tuple[Column, ...]:
    """(name, data_type, column_type, nullable) -> catalog columns."""
    return tuple(column_from_catalog(cat(n, dt, ct, nullable=nl, precision=10, scale=0, octets=40, collation=UTF8))
                 for n, dt, ct, nl in specs)


def idx(name: str, *columns: str, unique: bool = True) -> list[dict[str, Any]]:
    """information_schema.STATISTICS rows of one index, in SEQ_IN_INDEX order."""
    return [{"INDEX_NAME": name, "NON_UNIQUE": 0 if unique else 1, "COLUMN_NAME": c} for c in columns]


COLS = cols(("id", "int", "int(11)", False), ("a", "varchar", "varchar(10)", False),
            ("b", "bigint", "bigint(20)", False), ("n", "int", "int(11)", True),
            ("e", "enum", "enum('x','y')", False), ("f", "float", "float", False),
            ("d", "double", "double", False), ("j", "json", "json", False), ("t", "text", "text", False),
            ("dt", "datetime", "datetime", False), ("dec", "decimal", "decimal(10,2)", False),
            ("bits", "bit", "bit(8)", False), ("s", "set", "set('p')", False))


def test_primary_key_is_the_chunking_key() -> None:
    assert choose_key(COLS, idx("PRIMARY", "id") + idx("u", "b")) == (("id",), ("id",), "primary")


def test_composite_primary_key_keeps_index_order() -> None:
    assert choose_key(COLS, idx("PRIMARY", "b", "a", "id")) == (("b", "a", "id"), ("b", "a", "id"), "primary")


def test_no_index_means_no_key() -> None:
    assert choose_key(COLS, []) == ((), (), "none")


def test_first_not_null_unique_index_without_a_primary_key() -> None:
    indexes = idx("k_nonunique", "id", unique=False) + idx("z_uniq", "b") + idx("a_uniq", "a", "id")
    assert choose_key(COLS, indexes) == ((), ("a", "id"), "unique")


def test_nullable_unique_index_is_not_usable() -> None:
    assert choose_key(COLS, idx("a_nullable", "n")) == ((), (), "none")
    assert choose_key(COLS, idx("a_partly_nullable", "id", "n") + idx("b_ok", "b")) == ((), ("b",), "unique")


def test_non_unique_index_is_not_a_key() -> None:
    assert choose_key(COLS, idx("by_b", "b", unique=False)) == ((), (), "none")


@pytest.mark.parametrize("column", ["e", "f", "d", "j", "t", "bits", "s"])
def test_keys_of_types_without_a_keyset_order_are_not_usable(column: str) -> None:
    assert choose_key(COLS, idx("PRIMARY", column)) == ((column,), (), "none")
    assert choose_key(COLS, idx("PRIMARY", column) + idx("u", "b")) == ((column,), ("b",), "unique")
    assert choose_key(COLS, idx("PRIMARY", "id", column)) == (("id", column), (), "none")


@pytest.mark.parametrize("column", ["id", "a", "b", "dt", "dec"])
def test_keys_of_ordered_types_are_usable(column: str) -> None:
    assert choose_key(COLS, idx("PRIMARY", column)) == ((column,), (column,), "primary")


def test_index_on_an_unknown_column_is_not_usable() -> None:
    assert choose_key(COLS, idx("u", "ghost")) == ((), (), "none")


def test_non_unique_flag_as_text() -> None:
    """`describe` turns byte values into text, so NON_UNIQUE may arrive as '0'/'1'."""
    rows = [{"INDEX_NAME": "u1", "NON_UNIQUE": "1", "COLUMN_NAME": "id"},
            {"INDEX_NAME": "u2", "NON_UNIQUE": "0", "COLUMN_NAME": "b"}]
    assert choose_key(COLS, rows) == ((), ("b",), "unique")


# -- keyset SQL ------------------------------------------------------------------------------------


def test_chunk_sql_without_key_reads_the_whole_table() -> None:
    sql = chunk_sql("shop", "orders", ("id", "v"), (), after=False, limit=10)
    assert sql == "SELECT `id`, `v` FROM `shop`.`orders`"
    assert chunk_sql("shop", "orders", ("id",), (), after=True, limit=10) == "SELECT `id` FROM `shop`.`orders`"


def test_chunk_sql_first_chunk() -> None:
    assert chunk_sql("shop", "orders", ("id", "v"), ("id",), after=False, limit=4096) == (
        "SELECT `id`, `v` FROM `shop`.`orders` ORDER BY `id` LIMIT 4096"
    )


def test_chunk_sql_after_a_single_column_key() -> None:
    assert chunk_sql("shop", "orders", ("id", "v"), ("id",), after=True, limit=100) == (
        "SELECT `id`, `v` FROM `shop`.`orders` WHERE (`id` > %s) ORDER BY `id` LIMIT 100"
    )


def test_chunk_sql_expands_a_composite_keyset_condition() -> None:
    assert chunk_sql("d", "t", ("a", "b", "c", "x"), ("a", "b", "c"), after=True, limit=5) == (
        "SELECT `a`, `b`, `c`, `x` FROM `d`.`t` WHERE (`a` > %s) OR (`a` = %s AND `b` > %s) "
        "OR (`a` = %s AND `b` = %s AND `c` > %s) ORDER BY `a`, `b`, `c` LIMIT 5"
    )


def test_chunk_sql_quotes_every_name() -> None:
    assert chunk_sql("my`db", "we`ird tbl", ("k`1", "v"), ("k`1",), after=True, limit=1) == (
        "SELECT `k``1`, `v` FROM `my``db`.`we``ird tbl` WHERE (`k``1` > %s) ORDER BY `k``1` LIMIT 1"
    )


def test_chunk_sql_uses_the_placeholders_of_each_key_column() -> None:
    marks = ("CAST(%s AS DECIMAL(10,2))", "%s")
    assert chunk_sql("d", "t", ("p", "q"), ("p", "q"), after=True, limit=2, placeholders=marks) == (
        "SELECT `p`, `q` FROM `d`.`t` WHERE (`p` > CAST(%s AS DECIMAL(10,2))) "
        "OR (`p` = CAST(%s AS DECIMAL(10,2)) AND `q` > %s) ORDER BY `p`, `q` LIMIT 2"
    )


@pytest.mark.parametrize(
    ("last", "params"),
    [((7,), [7]), ((1, "x"), [1, 1, "x"]), ((1, b"\x00", "z"), [1, 1, b"\x00", 1, b"\x00", "z"]), ((), [])],
)
def test_keyset_params(last: tuple[Any, ...], params: list[Any]) -> None:
    assert keyset_params(last) == params


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_keyset_params_fit_the_placeholders(n: int) -> None:
    key = tuple(f"k{i}" for i in range(n))
    sql = chunk_sql("d", "t", key, key, after=True, limit=1)
    assert sql.count("%s") == len(keyset_params(tuple(range(n))))


def test_placeholder() -> None:
    dec = column_from_catalog(cat("d", "decimal", "decimal(20,6)", precision=20, scale=6))
    assert placeholder(dec) == "CAST(%s AS DECIMAL(20,6))"
    for c in COLS:
        if c.ctype.code != v.NEWDECIMAL:
            assert placeholder(c) == "%s"


def key_col(data_type: str, column_type: str, collation: str | None = UTF8, octets: int = 40) -> Column:
    return column_from_catalog(cat("k", data_type, column_type, precision=10, scale=2, octets=octets,
                                   collation=collation))


@pytest.mark.parametrize(
    ("col", "raw", "expected"),
    [
        (key_col("tinyint", "tinyint(4)"), b"-128", -128),
        (key_col("int", "int(10) unsigned"), b"4294967295", 4294967295),
        (key_col("bigint", "bigint(20) unsigned"), b"18446744073709551615", 18446744073709551615),
        (key_col("mediumint", "mediumint(9)"), b"7", 7),
        (key_col("smallint", "smallint(6)"), b"-3", -3),
        (key_col("year", "year(4)"), b"2024", 2024),
        (key_col("year", "year(4)"), b"0000", 0),
        (key_col("varchar", "varchar(10)"), "caf\u00e9 \U0001f389".encode(), "caf\u00e9 \U0001f389"),
        (key_col("char", "char(4)", LATIN1, 4), b"\xe9\x80\x81", "\u00e9\u20ac\x81"),
        (key_col("varbinary", "varbinary(8)", None, 8), b"\x00\xff", b"\x00\xff"),
        (key_col("binary", "binary(3)", None, 3), b"a\x00\x00", b"a\x00\x00"),
        (key_col("decimal", "decimal(10,2)"), b"-12.50", "-12.50"),
        (key_col("date", "date"), b"2024-02-29", "2024-02-29"),
        (key_col("datetime", "datetime(6)"), b"2024-02-29 01:02:03.000004", "2024-02-29 01:02:03.000004"),
        (key_col("timestamp", "timestamp"), b"1970-01-01 00:00:01", "1970-01-01 00:00:01"),
        (key_col("time", "time"), b"-838:59:59", "-838:59:59"),
    ],
    ids=lambda x: x.type if isinstance(x, Column) else None,
)
def test_key_param(col: Column, raw: bytes, expected: Any) -> None:
    got = key_param(col, raw)
    assert got == expected
    assert type(got) is type(expected)


def test_key_param_of_a_var_string_column() -> None:
    col = build_column("k", v.VAR_STRING, False, collation=UTF8, length=40)
    assert key_param(col, b"abc") == "abc"
    raw_col = build_column("k", v.VAR_STRING, False, collation="binary", length=40)
    assert key_param(raw_col, b"abc") == b"abc"

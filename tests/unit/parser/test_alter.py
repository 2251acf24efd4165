"""alter.describe: DDL text -> the structured change a DDL envelope carries in `alter`.

Whole statements and their descriptions are golden files (tests/golden/ddl, test_ddl_golden.py);
here: column types and defaults one clause at a time, and statements no parser expects."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.parser import values as v
from services.parser.alter import describe
from services.parser.snapshot.catalog import column_from_catalog
from services.parser.snapshot.values import text_decoder_for


def col(name: str, type_: str, nullable: bool = True, **kw: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "nullable": nullable, **kw}


def ops(sql: str, *, mariadb: bool = True) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], describe(sql, "s", mariadb=mariadb)["ops"])


def add_op(sql_def: str, *, mariadb: bool = True) -> dict[str, Any]:
    (op,) = ops(f"ALTER TABLE t ADD COLUMN c {sql_def}", mariadb=mariadb)
    return op


U8: dict[str, Any] = {"charset": "utf8mb4"}


# -- names -------------------------------------------------------------------------------------


def test_lower_case_table_names_renames_name_tables_as_stored_and_columns_as_written():
    out = describe("ALTER TABLE Shop.Orders RENAME COLUMN Note TO Memo, RENAME TO Old_Orders", "Sess",
                   lower_names=True)
    assert out["ops"] == [{"op": "rename", "old": "Note", "new": "Memo"},
                          {"op": "rename_table", "from": ["shop", "orders"], "to": ["sess", "old_orders"]}]
    assert out["renames"] == [["shop", "orders", "sess", "old_orders"]]
    out = describe("RENAME TABLE Shop.A TO B", "Sess", lower_names=True)
    assert out["renames"] == [["shop", "a", "sess", "b"]]
    assert describe("CREATE TABLE Shop.T (Id INT PRIMARY KEY)", "s", lower_names=True)["pk"] == ["Id"]


# -- column types ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql_def", "column"),
    [
        ("INTEGER", col("c", "int")),
        ("INT(11) UNSIGNED ZEROFILL", col("c", "int", unsigned=True)),
        ("INT SIGNED", col("c", "int")),
        ("BOOL", col("c", "tinyint")),
        ("BOOLEAN", col("c", "tinyint")),
        ("MEDIUMINT UNSIGNED", col("c", "mediumint", unsigned=True)),
        ("INT8", col("c", "bigint")),
        ("SMALLINT", col("c", "smallint")),
        ("DEC(8,3)", col("c", "decimal", precision=8, scale=3)),
        ("NUMERIC", col("c", "decimal", precision=10, scale=0)),
        ("FIXED(5)", col("c", "decimal", precision=5, scale=0)),
        ("DECIMAL(65,30) UNSIGNED", col("c", "decimal", unsigned=True, precision=65, scale=30)),
        ("REAL", col("c", "double")),
        ("FLOAT", col("c", "float")),
        ("FLOAT(10)", col("c", "float")),
        ("FLOAT(30)", col("c", "double")),
        ("FLOAT(7,2)", col("c", "float")),
        ("DOUBLE PRECISION", col("c", "double")),
        ("CHARACTER VARYING(10)", col("c", "varchar", length=40, **U8)),
        ("CHAR VARYING(10)", col("c", "varchar", length=40, **U8)),
        ("NATIONAL CHAR(3)", col("c", "char", length=9, charset="utf8mb3")),
        ("NATIONAL CHARACTER VARYING(3)", col("c", "varchar", length=9, charset="utf8mb3")),
        ("NCHAR(2)", col("c", "char", length=6, charset="utf8mb3")),
        ("NVARCHAR(5)", col("c", "varchar", length=15, charset="utf8mb3")),
        ("NATIONAL VARCHAR(4)", col("c", "varchar", length=12, charset="utf8mb3")),
        ("LONG VARCHAR", col("c", "mediumtext", **U8)),
        ("LONG", col("c", "mediumtext", **U8)),
        ("LONG VARBINARY", col("c", "mediumblob", charset="binary")),
        ("VARCHAR(5) CHARACTER SET utf8", col("c", "varchar", length=15, charset="utf8mb3")),
        ("VARCHAR(5) CHARSET latin1", col("c", "varchar", length=5, charset="latin1")),
        ("VARCHAR(5) CHARACTER SET 'latin1' COLLATE 'latin1_bin'", col("c", "varchar", length=5, charset="latin1")),
        ("VARCHAR(5) COLLATE latin1_german1_ci", col("c", "varchar", length=5, charset="latin1")),
        ("VARCHAR(5) COLLATE utf8mb4_bin", col("c", "varchar", length=20, **U8)),
        ("CHAR(3) ASCII", col("c", "char", length=3, charset="latin1")),
        ("CHAR(2) UNICODE", col("c", "char", length=4, charset="ucs2")),
        ("CHAR(4) BINARY", col("c", "char", length=16, **U8)),
        ("CHAR", col("c", "char", length=4, **U8)),
        ("CHAR(10) CHARACTER SET binary", col("c", "binary", length=10, charset="binary")),
        ("VARCHAR(10) CHARACTER SET binary", col("c", "varbinary", length=10, charset="binary")),
        ("TEXT CHARSET binary", col("c", "blob", charset="binary")),
        ("BINARY", col("c", "binary", length=1, charset="binary")),
        ("VARBINARY(7)", col("c", "varbinary", length=7, charset="binary")),
        ("TINYTEXT CHARACTER SET latin1", col("c", "tinytext", charset="latin1")),
        ("TEXT(100)", col("c", "text", **U8)),
        ("TEXT(30000)", col("c", "mediumtext", **U8)),
        ("TEXT(63) CHARACTER SET latin1", col("c", "tinytext", charset="latin1")),
        ("BLOB(300)", col("c", "blob", charset="binary")),
        ("LONGBLOB", col("c", "longblob", charset="binary")),
        ("DATE", col("c", "date")),
        ("DATETIME(6)", col("c", "datetime", fsp=6)),
        ("TIMESTAMP(2) NULL", col("c", "timestamp", fsp=2)),
        ("TIME(3)", col("c", "time", fsp=3)),
        ("YEAR(4)", col("c", "year", unsigned=True)),
        ("BIT", col("c", "bit", length=1)),
        ("BIT(64)", col("c", "bit", length=64)),
        ("ENUM('a','b ',\"c\")", col("c", "enum", values=["a", "b", "c"], **U8)),
        ("SET('x','it''s','back\\\\slash')", col("c", "set", values=["x", "it's", "back\\slash"], **U8)),
        ("ENUM('x') CHARACTER SET latin1", col("c", "enum", values=["x"], charset="latin1")),
        ("POINT", col("c", "geometry")),
        ("GEOMETRY NOT NULL", col("c", "geometry", False)),
        ("INT NULL", col("c", "int")),
        ("VARCHAR(3) NOT NULL", col("c", "varchar", False, length=12, **U8)),
    ],
)
def test_column_types(sql_def, column):
    assert add_op(sql_def)["column"] == column


def test_json_follows_the_flavour():
    assert add_op("JSON")["column"] == col("c", "longtext", **U8)  # MariaDB: LONGTEXT utf8mb4_bin
    assert add_op("JSON", mariadb=False)["column"] == col("c", "json")


@pytest.mark.parametrize(
    ("sql_def", "unknown"),
    [("UUID", "UUID"), ("INET6 NOT NULL", "INET6"), ("VECTOR(3)", "VECTOR(3)"),
     ("VARCHAR(10) COMPRESSED", "VARCHAR(10)"), ("BLOB COMPRESSED=zlib", "BLOB"), ("", "")],
)
def test_unmappable_type_is_reported_not_raised(sql_def, unknown):
    assert add_op(sql_def) == {"op": "add", "unknown": unknown, "name": "c"}


def test_mysql_vector_carries_its_dimensions():
    assert add_op("VECTOR(3)", mariadb=False)["column"] == {"name": "c", "type": "vector", "nullable": True,
                                                             "dimensions": 3}
    assert add_op("VECTOR", mariadb=False)["column"]["dimensions"] == 2048


# -- defaults: the value every existing row gets -----------------------------------------------

MYSQL = False


@pytest.mark.parametrize(
    ("sql_def", "default"),
    [
        # integers
        ("INT DEFAULT 5", 5), ("INT DEFAULT -5", -5), ("INT DEFAULT +5", 5), ("INT DEFAULT '7'", 7),
        ("INT DEFAULT 2.5", 3), ("INT DEFAULT -2.5", -3), ("TINYINT DEFAULT '1.5'", 2), ("INT DEFAULT 0x10", 16),
        ("INT DEFAULT X'0101'", 257), ("INT DEFAULT 1e2", 100), ("INT DEFAULT TRUE", 1), ("BOOLEAN DEFAULT FALSE", 0),
        ("BIGINT UNSIGNED DEFAULT 18446744073709551615", 18446744073709551615),
        ("INT DEFAULT NULL", None), ("INT NOT NULL DEFAULT NULL", None), ("INT", None), ("INT NOT NULL", 0),
        ("SMALLINT UNSIGNED NOT NULL", 0),
        # decimals
        ("DECIMAL(6,2) DEFAULT 1.5", "1.50"), ("DECIMAL(6,2) DEFAULT 1.555", "1.56"),
        ("DECIMAL(6,2) DEFAULT -1.5", "-1.50"), ("DECIMAL(6,2) DEFAULT '-0'", "0.00"),
        ("DECIMAL DEFAULT 3", "3"), ("DEC(4) DEFAULT 1e2", "100"), ("NUMERIC(10,3) NOT NULL", "0.000"),
        ("DECIMAL(5,0) NOT NULL", "0"),
        # floats
        ("FLOAT DEFAULT 1.1", 1.1), ("DOUBLE DEFAULT -2.5e-3", -0.0025), ("FLOAT(7,2) DEFAULT 1.237", 1.24),
        ("REAL NOT NULL", 0.0), ("DOUBLE PRECISION DEFAULT '3.5'", 3.5), ("FLOAT NOT NULL", 0.0),
        # BIT
        ("BIT(5) DEFAULT b'101'", 5), ("BIT(4) DEFAULT B'11'", 3), ("BIT(8) DEFAULT 0x0F", 15),
        ("BIT(8) DEFAULT 0b11", 3), ("BIT(8) DEFAULT 'a'", 97), ("BIT DEFAULT 1", 1), ("BIT(3) NOT NULL", 0),
        # YEAR
        ("YEAR DEFAULT 2024", 2024), ("YEAR DEFAULT '2024'", 2024), ("YEAR DEFAULT '0'", 2000),
        ("YEAR DEFAULT '00'", 2000), ("YEAR DEFAULT 0", 0), ("YEAR DEFAULT 69", 2069), ("YEAR DEFAULT '70'", 1970),
        ("YEAR NOT NULL", 0),
        # DATE / DATETIME
        ("DATE DEFAULT '2024-01-02'", "2024-01-02"), ("DATE DEFAULT '24-1-2'", "2024-01-02"),
        ("DATE DEFAULT '2024/1/2'", "2024-01-02"), ("DATE DEFAULT 20240102", "2024-01-02"),
        ("DATE DEFAULT '240102'", "2024-01-02"), ("DATE DEFAULT DATE '2024-03-04'", "2024-03-04"),
        ("DATE DEFAULT '0000-00-00'", None), ("DATE NOT NULL", None), ("DATE DEFAULT 0", None),
        ("DATETIME DEFAULT '2024-01-02 03:04:05'", "2024-01-02T03:04:05"),
        ("DATETIME DEFAULT '2024-01-02T03:04:05'", "2024-01-02T03:04:05"),
        ("DATETIME(3) DEFAULT '2024-01-02 03:04:05.1'", "2024-01-02T03:04:05.100"),
        ("DATETIME(2) DEFAULT '2024-01-02 10:11:12.345'", "2024-01-02T10:11:12.34"),
        ("DATETIME DEFAULT '2024-12-31 23:59:59.5'", "2024-12-31T23:59:59"),
        ("DATETIME DEFAULT 20240102030405", "2024-01-02T03:04:05"),
        ("DATETIME DEFAULT '2024-01-02'", "2024-01-02T00:00:00"),
        ("DATETIME NOT NULL", None), ("DATETIME(6) NOT NULL", None),
        ("DATETIME DEFAULT '0000-00-00 00:00:00'", None),
        # TIMESTAMP: only the zero timestamp is independent of the session time zone
        ("TIMESTAMP NOT NULL", None), ("TIMESTAMP NULL", None), ("TIMESTAMP", None),
        ("TIMESTAMP NOT NULL DEFAULT 0", None), ("TIMESTAMP(3) NOT NULL DEFAULT '0000-00-00 00:00:00.000'", None),
        # TIME
        ("TIME DEFAULT '12:34:56'", "12:34:56"), ("TIME(1) DEFAULT '-01:02:03.45'", "-01:02:03.4"),
        ("TIME DEFAULT 123456", "12:34:56"), ("TIME DEFAULT '1 02:00:00'", "26:00:00"),
        ("TIME DEFAULT '-00:00:00'", "00:00:00"), ("TIME DEFAULT '838:59:59'", "838:59:59"),
        ("TIME DEFAULT '12:34'", "12:34:00"), ("TIME DEFAULT 5", "00:00:05"), ("TIME DEFAULT '-1:2:3'", "-01:02:03"),
        ("TIME(2) NOT NULL", "00:00:00.00"), ("TIME NOT NULL", "00:00:00"),
        # strings
        ("VARCHAR(10) DEFAULT 'it''s'", "it's"), ("VARCHAR(10) DEFAULT \"a\\\"b\"", 'a"b'),
        ("VARCHAR(10) DEFAULT \"a\"\"b\"", 'a"b'), ("VARCHAR(10) DEFAULT 'a\\nb\\tc\\\\'", "a\nb\tc\\"),
        ("VARCHAR(10) DEFAULT '50\\%'", "50\\%"), ("VARCHAR(10) DEFAULT _utf8mb4'x' 'y'", "xy"),
        ("VARCHAR(10) DEFAULT _latin1 'x'", "x"), ("VARCHAR(10) DEFAULT N'abc'", "abc"),
        ("VARCHAR(10) DEFAULT 0x4142", "AB"), ("VARCHAR(10) DEFAULT X'4142'", "AB"),
        ("VARCHAR(10) DEFAULT 1.50", "1.50"), ("VARCHAR(10) DEFAULT 1e3", "1000"), ("VARCHAR(10) DEFAULT -0", "0"),
        ("VARCHAR(10) DEFAULT 7", "7"), ("CHAR(5) DEFAULT 'ab  '", "ab"), ("VARCHAR(5) DEFAULT 'ab  '", "ab  "),
        ("VARCHAR(10) DEFAULT 'ü€'", "ü€"), ("VARCHAR(10) CHARACTER SET latin1 DEFAULT 'é'", "é"),
        ("TEXT NOT NULL", ""), ("VARCHAR(3) NOT NULL", ""), ("CHAR(3) NOT NULL", ""), ("LONGTEXT DEFAULT 'x'", "x"),
        ("VARCHAR(10) DEFAULT ''", ""),
        # binary
        ("BINARY(4) DEFAULT 'a'", b"a\0\0\0"), ("BINARY(2) NOT NULL", b"\0\0"), ("BINARY NOT NULL", b"\0"),
        ("VARBINARY(4) DEFAULT X'00FF'", b"\x00\xff"), ("VARBINARY(4) NOT NULL", b""), ("BLOB NOT NULL", b""),
        ("CHAR(3) CHARACTER SET binary DEFAULT 'ab'", b"ab\0"), ("VARBINARY(9) DEFAULT 'ü'", "ü".encode()),
        ("GEOMETRY NOT NULL", b""),
        # ENUM / SET
        ("ENUM('b','a') NOT NULL", "b"), ("ENUM('A','b') DEFAULT 'a'", "A"), ("ENUM('a ','b') DEFAULT 'a'", "a"),
        ("ENUM('it''s','x') DEFAULT 'it''s'", "it's"), ("ENUM('a','b') DEFAULT NULL", None), ("ENUM('a','b')", None),
        ("ENUM('a','b') DEFAULT 2", "b"),
        ("SET('a','b','c') DEFAULT 'c,a'", ["a", "c"]), ("SET('a','b') NOT NULL", []), ("SET('a','b') DEFAULT ''", []),
        ("SET('a','b','c') DEFAULT 5", ["a", "c"]),
        # MariaDB's JSON is LONGTEXT: text as written
        ("JSON DEFAULT '{\"a\":  1}'", '{"a":  1}'), ("JSON NOT NULL", ""),
    ],
)
def test_default_of_existing_rows(sql_def, default):
    op = add_op(sql_def)
    assert "default_expr" not in op
    assert op["default"] == default
    assert type(op["default"]) is type(default)


@pytest.mark.parametrize(
    ("sql_def", "default"),
    [
        # MySQL rounds extra fractional digits where MariaDB truncates them.
        ("DATETIME(2) DEFAULT '2024-01-02 10:11:12.345'", "2024-01-02T10:11:12.35"),
        ("DATETIME DEFAULT '2024-12-31 23:59:59.5'", "2025-01-01T00:00:00"),
        ("TIME(1) DEFAULT '-01:02:03.45'", "-01:02:03.5"),
        ("TIME DEFAULT '00:00:59.5'", "00:01:00"),
        ("JSON NOT NULL", "null"),
    ],
)
def test_default_on_mysql(sql_def, default):
    assert add_op(sql_def, mariadb=MYSQL)["default"] == default


@pytest.mark.parametrize(
    ("sql_def", "expr"),
    [
        ("DATETIME DEFAULT CURRENT_TIMESTAMP", "CURRENT_TIMESTAMP"),
        ("DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)", "CURRENT_TIMESTAMP(6)"),
        ("TIMESTAMP NOT NULL DEFAULT current_timestamp() ON UPDATE current_timestamp()", "current_timestamp()"),
        ("DATETIME DEFAULT NOW()", "NOW()"),
        ("DATE DEFAULT CURRENT_DATE", "CURRENT_DATE"),
        ("DATE DEFAULT (CURRENT_DATE + INTERVAL 1 DAY)", "(CURRENT_DATE + INTERVAL 1 DAY)"),
        ("CHAR(36) DEFAULT (UUID())", "(UUID())"),
        ("CHAR(36) DEFAULT uuid()", "uuid()"),
        ("INT DEFAULT (1 + 1)", "(1 + 1)"),
        ("JSON DEFAULT (JSON_OBJECT())", "(JSON_OBJECT())"),
        ("BIGINT DEFAULT NEXT VALUE FOR s1", "NEXT VALUE FOR s1"),
        ("INT NOT NULL AUTO_INCREMENT", "AUTO_INCREMENT"),
        ("SERIAL", "AUTO_INCREMENT"),
        ("BIGINT SERIAL DEFAULT VALUE", "AUTO_INCREMENT"),
        ("INT AS (a + 1) VIRTUAL", "AS (a + 1)"),
        ("INT GENERATED ALWAYS AS (a * 2) STORED", "AS (a * 2)"),
        ("VARCHAR(9) AS (concat(a, ',', b)) PERSISTENT", "AS (concat(a, ',', b))"),
        # TIMESTAMP literals are read in the session time zone
        ("TIMESTAMP DEFAULT '2024-01-01 00:00:00'", "'2024-01-01 00:00:00'"),
        ("TIMESTAMP(3) NOT NULL DEFAULT 20240101000000", "20240101000000"),
        # literals the server would refuse travel as written
        ("ENUM('x','y') DEFAULT 'z'", "'z'"),
        ("INT DEFAULT 'abc'", "'abc'"),
        ("DATE DEFAULT 'tomorrow'", "'tomorrow'"),
        ("VARBINARY(3) DEFAULT X'ABC'", "X'ABC'"),
    ],
)
def test_default_known_only_to_the_server(sql_def, expr):
    op = add_op(sql_def)
    assert "default" not in op
    assert op["default_expr"] == expr


def test_modify_carries_the_default_too():
    (op,) = ops("ALTER TABLE t MODIFY c VARCHAR(3) NOT NULL")
    assert op["default"] == ""
    (op,) = ops("ALTER TABLE t CHANGE c d DATETIME DEFAULT CURRENT_TIMESTAMP")
    assert op["default_expr"] == "CURRENT_TIMESTAMP"


# -- robustness: never raises -------------------------------------------------------------------

_WORDS = ["ALTER", "TABLE", "t", "ADD", "COLUMN", "DROP", "MODIFY", "CHANGE", "RENAME", "TO", "AS", "CREATE",
          "PRIMARY", "KEY", "CONSTRAINT", "IF", "NOT", "EXISTS", "NULL", "DEFAULT", "INT", "VARCHAR(3)",
          "ENUM('a')", "SET", "CHARACTER", "COLLATE", "(", ")", ",", "'x'", "X'4'", "b'2'", "0x", "-", "1.5",
          "`q`", "FIRST", "AFTER", "SERIAL", "UNIQUE", "TIME", "DATE", "TIMESTAMP", "BIT", "YEAR", "DECIMAL(1,9)",
          "(a INT", "LIKE", "SELECT", "ON", "UPDATE", "COMMENT", "NEXT", "VALUE", "FOR", "GENERATED", "ALWAYS"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_WORDS), max_size=14))
def test_describe_never_raises_on_odd_statements(words):
    for prefix in ("ALTER TABLE t ", "CREATE TABLE t (c ", "ALTER TABLE t ADD c ", ""):
        describe(prefix + " ".join(words), "s")


@pytest.mark.parametrize("sql", [
    "ALTER TABLE t RENAME COLUMN IF EXISTS", "ALTER TABLE t RENAME COLUMN IF EXISTS a",
    "ALTER TABLE t DROP COLUMN IF EXISTS", "ALTER TABLE t ADD COLUMN IF NOT EXISTS",
    "ALTER TABLE t CHANGE COLUMN IF EXISTS a", "ALTER TABLE t MODIFY COLUMN IF EXISTS",
])
def test_truncated_if_exists_specs_do_not_raise(sql):
    """Found by the property test above: IF [NOT] EXISTS at the very end indexed past the tokens."""
    describe(sql, "s")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_describe_never_raises_on_any_text(text):
    describe(text, "s")
    describe("ALTER TABLE t ADD c " + text, "s")


# -- against a real MariaDB: what existing rows really get ---------------------------------------

IMPLICIT = [
    "TINYINT", "INT UNSIGNED", "BIGINT", "DECIMAL(6,2)", "DECIMAL", "FLOAT", "DOUBLE", "BIT(5)", "BIT", "YEAR",
    "CHAR(3)", "VARCHAR(10)", "TEXT", "ENUM('b','a')", "SET('x','y')", "TIME", "TIME(3)", "BINARY(4)", "BINARY",
    "VARBINARY(4)", "BLOB", "DATE", "DATETIME", "DATETIME(3)", "TIMESTAMP", "TIMESTAMP(2)", "JSON", "BOOL",
    "NATIONAL CHAR(2)", "LONG VARBINARY", "POINT",
]
EXPLICIT = [
    "DATETIME(2) DEFAULT '2024-01-02 10:11:12.345'", "TIME(1) DEFAULT '-01:02:03.45'", "TIME DEFAULT '12:34:56.7'",
    "YEAR DEFAULT '0'", "YEAR DEFAULT 0", "YEAR DEFAULT '69'", "YEAR DEFAULT 70", "ENUM('a ','b') DEFAULT 'a'",
    "ENUM('A','b') DEFAULT 'a'", "CHAR(5) DEFAULT 'ab  '", "VARCHAR(5) DEFAULT 'ab  '", "TINYINT DEFAULT '1.5'",
    "INT DEFAULT -2.5", "DECIMAL(6,2) DEFAULT 1.555", "DECIMAL(6,2) DEFAULT '-0'", "FLOAT(7,2) DEFAULT 1.237",
    "FLOAT DEFAULT 1.1", "BIT(8) DEFAULT 'a'", "BIT(5) DEFAULT b'101'", "VARCHAR(10) DEFAULT 1.50",
    "VARCHAR(10) DEFAULT 1e3", "VARCHAR(10) DEFAULT 0x4142", "INT DEFAULT 0x10", "SET('a','b','c') DEFAULT 'c,a'",
    "TIME DEFAULT 123456", "TIME DEFAULT '1 02:00:00'", "TIME DEFAULT '-00:00:00'", "DATETIME DEFAULT 20240102",
    "DATE DEFAULT '24-1-2'", "DATETIME(6) DEFAULT '2024-01-02 10:11:12.9999999'", "JSON DEFAULT '{\"a\":  1}'",
    "VARCHAR(10) DEFAULT _latin1'x' 'y'", "BINARY(3) DEFAULT 'a'", "VARCHAR(10) DEFAULT 'it''s \\\\ ü'",
    "VARCHAR(10) CHARACTER SET latin1 DEFAULT 'é'", "TEXT(100) DEFAULT 'x'", "TEXT(30000)", "BLOB(300)",
    "VARCHAR(5) CHARACTER SET utf8 DEFAULT 'x'", "CHAR(3) ASCII DEFAULT 'a'", "DOUBLE DEFAULT -2.5e-3",
]

_COLUMNS_SQL = ("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE, "
                "DATETIME_PRECISION, CHARACTER_OCTET_LENGTH, COLLATION_NAME FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 't' AND COLUMN_NAME = %s")


@pytest.fixture
def scratch() -> Iterator[tuple[Any, Any, str]]:
    """(cursor, raw cursor, database) in a scratch database on the MariaDB at 127.0.0.1:3306; skips without one."""
    pymysql = pytest.importorskip("pymysql")
    try:
        conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", password="", connect_timeout=2,
                               autocommit=True, cursorclass=pymysql.cursors.DictCursor)
    except pymysql.err.OperationalError as exc:
        pytest.skip(f"no MariaDB on 127.0.0.1:3306: {exc}")
    # The snapshot's view of a value: raw text-protocol bytes in the column's own charset.
    raw = pymysql.connect(host="127.0.0.1", port=3306, user="root", password="", autocommit=True,
                          use_unicode=False, conv={})
    db = f"alter_test_{uuid.uuid4().hex[:12]}"
    cur, rcur = conn.cursor(), raw.cursor()
    try:
        cur.execute("SELECT VERSION() AS v")
        if "mariadb" not in cur.fetchone()["v"].lower():
            pytest.skip("127.0.0.1:3306 is not MariaDB")
        cur.execute(f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4")
        cur.execute(f"USE `{db}`")
        rcur.execute(f"USE `{db}`")
        rcur.execute("SET character_set_results = NULL")
        cur.execute("SET SESSION explicit_defaults_for_timestamp = ON, time_zone = '+00:00'")
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO t VALUES (1)")
        yield cur, rcur, db
    finally:
        cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
        raw.close()


def test_defaults_equal_what_mariadb_fills_into_existing_rows(scratch):
    cur, rcur, db = scratch
    checked = []
    for n, sql_def in enumerate([f"{t} NOT NULL" for t in IMPLICIT] + EXPLICIT):
        name = f"c{n}"
        sql = f"ALTER TABLE t ADD COLUMN {name} {sql_def}"
        cur.execute(sql)
        cur.execute(_COLUMNS_SQL, (db, name))
        real = column_from_catalog(cur.fetchone())
        rcur.execute(f"SELECT `{name}` FROM t")
        (value,) = rcur.fetchone()
        expected = None if value is None else text_decoder_for(real, v.DecodeStats())(bytes(value))
        (op,) = cast(list[dict[str, Any]], describe(sql, db)["ops"])
        assert op["column"] == real.describe(), sql
        assert "default_expr" not in op, sql
        assert (op["default"], type(op["default"])) == (expected, type(expected)), sql
        checked.append(sql_def)
    assert len(checked) == len(IMPLICIT) + len(EXPLICIT)


def test_create_if_not_exists_is_flagged():
    assert describe("CREATE TABLE IF NOT EXISTS t (id INT PRIMARY KEY)", "d").get("if_not_exists") is True
    assert "if_not_exists" not in describe("CREATE TABLE t (id INT PRIMARY KEY)", "d")
    assert describe("/* x */ create temporary table if not exists t (id int)", "d").get("if_not_exists") is True


@pytest.mark.parametrize(("spec", "what", "removes"), [
    ("DROP PARTITION p0, p1", "DROP PARTITION", True),
    ("TRUNCATE PARTITION ALL", "TRUNCATE PARTITION", True),
    ("EXCHANGE PARTITION p0 WITH TABLE t2 WITHOUT VALIDATION", "EXCHANGE PARTITION", True),
    ("CONVERT PARTITION p0 TO TABLE t3", "CONVERT PARTITION", True),
    ("CONVERT TABLE t4 TO PARTITION p4 VALUES LESS THAN (5)", "CONVERT TABLE", True),
    ("CONVERT TO CHARACTER SET latin1", "CONVERT TO", False),
])
def test_statements_that_change_rows_without_row_events_ask_for_a_reload(spec, what, removes):
    assert describe(f"ALTER TABLE t {spec}", "d")["ops"] == [{"op": "reload", "what": what, "removes": removes}]


@pytest.mark.parametrize("spec", ["ADD PARTITION (PARTITION p9 VALUES LESS THAN (10))",
                                  "REORGANIZE PARTITION p0 INTO (PARTITION p0a VALUES LESS THAN (5))",
                                  "COALESCE PARTITION 2", "REMOVE PARTITIONING", "DROP INDEX i"])
def test_partition_statements_that_keep_the_rows_change_nothing(spec):
    assert describe(f"ALTER TABLE t {spec}", "d")["ops"] == []

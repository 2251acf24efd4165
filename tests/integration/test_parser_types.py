"""The type matrix: every MySQL type with its edge values arrives with the DESIGN §4 value."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.support import ServiceProcess, read_stream_sync, row_changes, wait_until
from tests.servers import MariaDB

# column type, [(SQL literal, expected envelope value), ...]
MATRIX: list[tuple[str, list[tuple[str, Any]]]] = [
    ("TINYINT", [("-128", -128), ("127", 127), ("0", 0)]),
    ("TINYINT UNSIGNED", [("0", 0), ("255", 255)]),
    ("SMALLINT", [("-32768", -32768), ("32767", 32767)]),
    ("SMALLINT UNSIGNED", [("65535", 65535)]),
    ("MEDIUMINT", [("-8388608", -8388608), ("8388607", 8388607)]),
    ("MEDIUMINT UNSIGNED", [("16777215", 16777215)]),
    ("INT", [("-2147483648", -2147483648), ("2147483647", 2147483647)]),
    ("INT UNSIGNED", [("4294967295", 4294967295), ("0", 0)]),
    ("BIGINT", [("-9223372036854775808", -9223372036854775808), ("9223372036854775807", 9223372036854775807)]),
    ("BIGINT UNSIGNED", [("18446744073709551615", 18446744073709551615), ("0", 0)]),
    ("DECIMAL(10,2)", [("-12345678.90", "-12345678.90"), ("0", "0.00"), ("0.01", "0.01"), ("-0.01", "-0.01"),
                       ("99999999.99", "99999999.99")]),
    ("DECIMAL(65,30)", [("12345678901234567890123456789012345.123456789012345678901234567890",
                         "12345678901234567890123456789012345.123456789012345678901234567890"),
                        ("-1.000000000000000000000000000001", "-1.000000000000000000000000000001")]),
    ("DECIMAL(5,0)", [("-99999", "-99999"), ("42", "42")]),
    ("DECIMAL(18,9)", [("123456789.123456789", "123456789.123456789")]),
    ("FLOAT", [("1.1", 1.1), ("-3.4e38", -3.4e38), ("0", 0.0)]),
    ("DOUBLE", [("1.7976931348623157e308", 1.7976931348623157e308), ("-0.5", -0.5)]),
    ("DATE", [("'1000-01-01'", "1000-01-01"), ("'9999-12-31'", "9999-12-31"), ("'0000-00-00'", None)]),
    ("DATETIME", [("'2020-01-02 03:04:05'", "2020-01-02T03:04:05"), ("'0000-00-00 00:00:00'", None)]),
    ("DATETIME(1)", [("'2020-01-02 03:04:05.1'", "2020-01-02T03:04:05.1")]),
    ("DATETIME(3)", [("'2020-01-02 03:04:05.120'", "2020-01-02T03:04:05.120")]),
    ("DATETIME(6)", [("'9999-12-31 23:59:59.999999'", "9999-12-31T23:59:59.999999"),
                     ("'1000-01-01 00:00:00.000001'", "1000-01-01T00:00:00.000001")]),
    ("TIMESTAMP NULL", [("'1970-01-01 00:00:01'", "1970-01-01T00:00:01Z"), ("'0000-00-00 00:00:00'", None)]),
    ("TIMESTAMP(6) NULL", [("'2038-01-19 03:14:07.999999'", "2038-01-19T03:14:07.999999Z")]),
    ("TIMESTAMP(2) NULL", [("'2001-02-03 04:05:06.78'", "2001-02-03T04:05:06.78Z")]),
    ("TIME", [("'-838:59:59'", "-838:59:59"), ("'838:59:59'", "838:59:59"), ("'00:00:00'", "00:00:00")]),
    ("TIME(1)", [("'-00:00:00.5'", "-00:00:00.5"), ("'-01:02:03.9'", "-01:02:03.9")]),
    ("TIME(2)", [("'-01:02:03.25'", "-01:02:03.25")]),
    ("TIME(3)", [("'-12:00:00.001'", "-12:00:00.001")]),
    ("TIME(4)", [("'-00:00:01.0001'", "-00:00:01.0001")]),
    ("TIME(6)", [("'-00:00:00.000001'", "-00:00:00.000001"), ("'12:34:56.123456'", "12:34:56.123456")]),
    ("YEAR", [("0", 0), ("1901", 1901), ("2155", 2155)]),
    ("CHAR(5)", [("'ab'", "ab"), ("''", ""), ("'ü😀'", "ü😀")]),
    ("VARCHAR(10) CHARACTER SET latin1", [("'äöü€'", "äöü€"), ("''", "")]),
    ("VARCHAR(300)", [("REPEAT('é', 300)", "é" * 300), ("'日本語'", "日本語")]),
    ("TEXT", [("'some text'", "some text")]),
    ("MEDIUMTEXT", [("REPEAT('x', 70000)", "x" * 70000)]),
    ("BINARY(4)", [("x'01'", b"\x01\x00\x00\x00"), ("x''", b"\x00\x00\x00\x00"), ("x'01020304'", b"\x01\x02\x03\x04")]),
    ("VARBINARY(10)", [("x'0000'", b"\x00\x00"), ("x''", b"")]),
    ("BLOB", [("x'00ff00'", b"\x00\xff\x00")]),
    ("LONGBLOB", [("REPEAT(x'ab', 1000)", b"\xab" * 1000)]),
    ("BIT(1)", [("b'1'", 1), ("b'0'", 0)]),
    ("BIT(64)", [("b'" + "1" * 64 + "'", 2**64 - 1)]),
    ("ENUM('a','b','c')", [("'c'", "c"), ("'a'", "a")]),
    ("SET('x','y','z')", [("''", []), ("'x,z'", ["x", "z"])]),
    ("JSON", [("'{\"a\": [1, 2.5, null]}'", '{"a": [1, 2.5, null]}')]),
]


def _rows() -> int:
    return max(len(values) for _, values in MATRIX)


def _insert_sql(db: str) -> list[str]:
    stmts = []
    for r in range(_rows()):
        cols = ", ".join(f"c{i}" for i, (_, vals) in enumerate(MATRIX) if r < len(vals))
        vals = ", ".join(vals[r][0] for _, vals in MATRIX if r < len(vals))
        stmts.append(f"INSERT INTO `{db}`.types (id, {cols}) VALUES ({r}, {vals})")
    return stmts


def _expected(r: int) -> dict[str, Any]:
    row: dict[str, Any] = {"id": r, "touched": 0}
    for i, (_, vals) in enumerate(MATRIX):
        row[f"c{i}"] = vals[r][1] if r < len(vals) else None
    return row


@pytest.fixture
def typed_table(mariadb: MariaDB, database: str) -> str:
    cols = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(MATRIX))
    mariadb.execute(f"CREATE TABLE `{database}`.types (id INT PRIMARY KEY, touched INT NOT NULL DEFAULT 0, {cols})")
    return database


def test_every_type_arrives_exactly(mariadb: MariaDB, typed_table: str, parser: ServiceProcess, nats_url: str):
    db = typed_table
    conn = mariadb.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates are legal input here
        cur.execute("SET SESSION time_zone = '+00:00'")
        for stmt in _insert_sql(db):
            cur.execute(stmt)
        cur.execute(f"UPDATE `{db}`.types SET touched = 1")
        cur.execute(f"DELETE FROM `{db}`.types")
    conn.close()
    n = _rows()
    msgs = wait_until(lambda: (m := row_changes(read_stream_sync(nats_url), db)) and
                      sum(len(x.env["rows"]) for x in m) >= 3 * n and m, 30, "all type-matrix changes")
    inserts = [r["after"] for m in msgs if m.env["op"] == "i" for r in m.env["rows"]]
    updates = [r for m in msgs if m.env["op"] == "u" for r in m.env["rows"]]
    deletes = [r["before"] for m in msgs if m.env["op"] == "d" for r in m.env["rows"]]
    assert len(inserts) == len(updates) == len(deletes) == n
    for r in range(n):
        expected = _expected(r)
        for i, (t, _) in enumerate(MATRIX):
            assert inserts[r][f"c{i}"] == expected[f"c{i}"], f"row {r} {t}"
        assert inserts[r] == expected
        assert updates[r]["before"] == expected
        assert updates[r]["after"] == {**expected, "touched": 1}
        assert deletes[r] == {**expected, "touched": 1}


def test_schema_travels_with_types(mariadb: MariaDB, typed_table: str, parser: ServiceProcess, nats_url: str):
    db = typed_table
    mariadb.execute(f"INSERT INTO `{db}`.types (id) VALUES (1)")
    msg = wait_until(lambda: row_changes(read_stream_sync(nats_url), db), 30, "the insert")[0]
    schema = msg.env["schema"]
    assert msg.env["pk"] == ["id"]
    cols = {c["name"]: c for c in schema["columns"]}
    assert cols["id"] == {"name": "id", "type": "int", "nullable": False}
    by_type = {t: cols[f"c{i}"] for i, (t, _) in enumerate(MATRIX)}
    assert by_type["BIGINT UNSIGNED"]["unsigned"] is True
    assert (by_type["DECIMAL(65,30)"]["precision"], by_type["DECIMAL(65,30)"]["scale"]) == (65, 30)
    assert by_type["DATETIME(3)"]["fsp"] == 3 and by_type["TIME(6)"]["type"] == "time"
    assert by_type["TIMESTAMP(6) NULL"]["type"] == "timestamp"
    assert by_type["VARCHAR(10) CHARACTER SET latin1"]["charset"] == "latin1"
    assert by_type["CHAR(5)"]["charset"] == "utf8mb4" and by_type["CHAR(5)"]["type"] == "char"
    assert by_type["BINARY(4)"]["type"] == "binary" and by_type["BLOB"]["type"] == "blob"
    assert by_type["ENUM('a','b','c')"]["values"] == ["a", "b", "c"]
    assert by_type["SET('x','y','z')"]["values"] == ["x", "y", "z"]
    assert by_type["BIT(64)"]["length"] == 64
    assert by_type["MEDIUMTEXT"]["type"] == "mediumtext"
    assert schema["id"] and len(schema["id"]) == 16


def test_timestamp_is_utc_whatever_the_session_zone(mariadb: MariaDB, database: str, parser: ServiceProcess,
                                                    nats_url: str):
    mariadb.execute(f"CREATE TABLE `{database}`.ts (id INT PRIMARY KEY, t TIMESTAMP(3) NULL)")
    conn = mariadb.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+02:00'")
        cur.execute(f"INSERT INTO `{database}`.ts VALUES (1, '2020-06-01 12:00:00.500')")
    conn.close()
    msg = wait_until(lambda: row_changes(read_stream_sync(nats_url), database), 30, "the insert")[0]
    assert msg.env["rows"][0]["after"]["t"] == "2020-06-01T10:00:00.500Z"


def test_geometry_is_stored_bytes(mariadb: MariaDB, database: str, parser: ServiceProcess, nats_url: str):
    mariadb.execute(f"CREATE TABLE `{database}`.g (id INT PRIMARY KEY, g GEOMETRY)",
                    f"INSERT INTO `{database}`.g VALUES (1, ST_GeomFromText('POINT(1 2)'))")
    stored = mariadb.query(f"SELECT g FROM `{database}`.g")[0][0]
    msg = wait_until(lambda: row_changes(read_stream_sync(nats_url), database), 30, "the insert")[0]
    assert msg.env["rows"][0]["after"]["g"] == stored
    assert stored[:4] == b"\x00\x00\x00\x00" and len(stored) == 25  # SRID + WKB point

"""The type matrix: every MySQL type with its edge values arrives with the DESIGN §4 value."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.launcher.processes import ServiceProcess
from tests.integration.conftest import ParserFactory
from tests.integration.support import read_stream_sync, row_changes, wait_until
from tests.integration.type_matrix import MATRIX, expected_row, insert_sql, rows
from tests.servers import BOTH_SOURCES, MariaDB


def create_typed_table(server: MariaDB, db: str) -> str:
    cols = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(MATRIX))
    server.execute(f"CREATE TABLE `{db}`.types (id INT PRIMARY KEY, touched INT NOT NULL DEFAULT 0, {cols})")
    return db


@pytest.fixture
def typed_table(source: MariaDB, database: str) -> str:
    return create_typed_table(source, database)


def assert_matrix_arrives_exactly(server: MariaDB, db: str, nats_url: str) -> None:
    """Every matrix row inserted, updated and deleted; each image equal to its DESIGN §4 values."""
    conn = server.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates are legal input here
        cur.execute("SET SESSION time_zone = '+00:00'")
        for stmt in insert_sql(db):
            cur.execute(stmt)
        cur.execute(f"UPDATE `{db}`.types SET touched = 1")
        cur.execute(f"DELETE FROM `{db}`.types")
    conn.close()
    n = rows()
    msgs = wait_until(lambda: (m := row_changes(read_stream_sync(nats_url), db)) and
                      sum(len(x.env["rows"]) for x in m) >= 3 * n and m, 30, "all type-matrix changes")
    inserts = [r["after"] for m in msgs if m.env["op"] == "i" for r in m.env["rows"]]
    updates = [r for m in msgs if m.env["op"] == "u" for r in m.env["rows"]]
    deletes = [r["before"] for m in msgs if m.env["op"] == "d" for r in m.env["rows"]]
    assert len(inserts) == len(updates) == len(deletes) == n
    for r in range(n):
        expected = expected_row(r)
        for i, (t, _) in enumerate(MATRIX):
            assert inserts[r][f"c{i}"] == expected[f"c{i}"], f"row {r} {t}"
        assert inserts[r] == expected
        assert updates[r]["before"] == expected
        assert updates[r]["after"] == {**expected, "touched": 1}
        assert deletes[r] == {**expected, "touched": 1}


@BOTH_SOURCES
def test_every_type_arrives_exactly(source: MariaDB, typed_table: str, parser: ServiceProcess, nats_url: str) -> None:
    assert_matrix_arrives_exactly(source, typed_table, nats_url)


def test_mariadb_compressed_binlog_is_read_exactly(mariadb_factory: Callable[..., MariaDB],
                                                   parser_factory: ParserFactory, nats_url: str) -> None:
    """log_bin_compress: every QUERY and rows event compressed (zlib); the matrix and a DDL arrive as
    from a plain binlog."""
    server = mariadb_factory(extra_args=["--log-bin-compress=ON", "--log-bin-compress-min-len=10"])
    server.execute("CREATE DATABASE packed")
    parser_factory(BINLAKE_SOURCE_URL=server.dsn())
    create_typed_table(server, "packed")
    assert_matrix_arrives_exactly(server, "packed", nats_url)
    server.execute("ALTER TABLE packed.types ADD COLUMN extra VARCHAR(30) NOT NULL DEFAULT 'compressed statement'")
    # The table's CREATE is a DDL of it too: wait for the ALTER itself.
    wait_until(lambda: [m for m in read_stream_sync(nats_url) if m.env["op"] == "ddl" and m.env.get("table") == "types"
                        and m.env["ddl"].startswith("ALTER TABLE packed.types ADD COLUMN extra")], 30, "the ALTER")
    assert server.query("SHOW GLOBAL STATUS LIKE 'Binlog_bytes_written'")  # the server did write


@BOTH_SOURCES
def test_schema_travels_with_types(source: MariaDB, typed_table: str, parser: ServiceProcess, nats_url: str) -> None:
    db = typed_table
    source.execute(f"INSERT INTO `{db}`.types (id) VALUES (1)")
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


@BOTH_SOURCES
def test_timestamp_is_utc_whatever_the_session_zone(source: MariaDB, database: str, parser: ServiceProcess,
                                                    nats_url: str) -> None:
    source.execute(f"CREATE TABLE `{database}`.ts (id INT PRIMARY KEY, t TIMESTAMP(3) NULL)")
    conn = source.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+02:00'")
        cur.execute(f"INSERT INTO `{database}`.ts VALUES (1, '2020-06-01 12:00:00.500')")
    conn.close()
    msg = wait_until(lambda: row_changes(read_stream_sync(nats_url), database), 30, "the insert")[0]
    assert msg.env["rows"][0]["after"]["t"] == "2020-06-01T10:00:00.500Z"


@BOTH_SOURCES
def test_geometry_is_stored_bytes(source: MariaDB, database: str, parser: ServiceProcess, nats_url: str) -> None:
    source.execute(f"CREATE TABLE `{database}`.g (id INT PRIMARY KEY, g GEOMETRY)",
                    f"INSERT INTO `{database}`.g VALUES (1, ST_GeomFromText('POINT(1 2)'))")
    stored = source.query(f"SELECT g FROM `{database}`.g")[0][0]
    msg = wait_until(lambda: row_changes(read_stream_sync(nats_url), database), 30, "the insert")[0]
    assert msg.env["rows"][0]["after"]["g"] == stored
    assert stored[:4] == b"\x00\x00\x00\x00" and len(stored) == 25  # SRID + WKB point

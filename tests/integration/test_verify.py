"""`binlake verify` against a real MariaDB and a lake built in-process from envelopes that mirror it.

The lake is written by `services.loader.lake.Lake` on the session Spark (no NATS): each test
creates source tables, feeds the lake the envelopes the parser would send for them (the
type matrix of test_parser_types, DESIGN §4), and then plants differences on either side.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import re
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark.sql import SparkSession

from services.launcher import source
from services.launcher.processes import clean_env
from services.loader import verify
from services.loader.lake import Lake, MergePolicy
from services.loader.spark import CatalogConfig, register
from shared.errors import ConfigError
from shared.mysql import display, mysql_quote
from tests.integration.lake_feed import Feed
from tests.integration.type_matrix import MATRIX
from tests.servers import MariaDB

ROOT = Path(__file__).resolve().parents[2]
POINT = b"\x00\x00\x00\x00\x01\x01\x00\x00\x00" + struct.pack("<dd", 1.0, 2.0)  # SRID 0 + WKB POINT(1 2)
TYPES: list[tuple[str, list[tuple[str, Any]]]] = [*MATRIX, ("GEOMETRY", [("ST_GeomFromText('POINT(1 2)')", POINT)])]
ROWS = len(TYPES) + 2  # one row per column to plant a difference in, a control row, a row of zero dates
ID = {"name": "id", "type": "int", "nullable": False}
_catalogs = itertools.count()


def envelope_column(name: str, sql: str) -> dict[str, Any]:
    """The envelope's schema column of a MATRIX type, as the parser describes it."""
    base = re.match(r"[A-Za-z]+", sql).group(0).lower()  # type: ignore[union-attr]
    m = re.match(r"[A-Za-z]+\(([^)]*)\)", sql)
    args = m.group(1) if m else ""
    col: dict[str, Any] = {"name": name, "type": "longtext" if base == "json" else base, "nullable": True}
    if "UNSIGNED" in sql:
        col["unsigned"] = True
    if base == "decimal":
        col["precision"], col["scale"] = (int(x) for x in args.split(","))
    if base in ("datetime", "timestamp", "time"):
        col["fsp"] = int(args or 0)
    if base == "bit":
        col["length"] = int(args or 1)
    if base in ("enum", "set"):
        col["values"] = re.findall(r"'([^']*)'", args)
    if base in ("char", "varchar", "text", "mediumtext", "json"):
        col["charset"] = "latin1" if "latin1" in sql else "utf8mb4"
    return col


COLUMNS = [ID] + [envelope_column(f"c{i}", t) for i, (t, _) in enumerate(TYPES)]


def value(i: int, row: int) -> tuple[str, Any]:
    """(SQL literal, envelope value) of column c<i> in row `row`."""
    values = TYPES[i][1]
    return values[row % len(values)]


def planted(sql: str, v: Any) -> Any:
    """A value as close to `v` as the column allows, but not equal to it under DESIGN §4."""
    base = sql.split("(")[0].split()[0].upper()
    if v is None:
        return {"DATE": "2000-01-01", "DATETIME": "2000-01-01T00:00:00", "TIMESTAMP": "2000-01-01T00:00:00Z"}[base]
    if base == "FLOAT":
        return float(np.nextafter(np.float32(v), np.float32(np.inf)))  # the next float32
    if base == "DOUBLE":
        return math.nextafter(v, 0.0)
    if base == "DECIMAL":
        return v[:-1] + str((int(v[-1]) + 1) % 10)  # the last digit
    if base == "DATE":
        return (dt.date.fromisoformat(v) - dt.timedelta(days=1)).isoformat()
    if base in ("DATETIME", "TIMESTAMP"):
        zone = "Z" if v.endswith("Z") else ""
        return (dt.datetime.fromisoformat(v.rstrip("Z")) - dt.timedelta(microseconds=1)).isoformat() + zone
    if base.startswith("TIME"):
        return v[1:] if v.startswith("-") else ("00:00:01" if v == "00:00:00" else "-" + v)
    if base == "JSON":
        return '{"a": [1, 2.5]}'
    if base == "ENUM":
        return "b"
    if base == "SET":
        return v[:1] if v else ["y"]
    if isinstance(v, bool | int):
        return v ^ 1
    if isinstance(v, bytes):
        return v[:-1] if v else b"\x00"  # BINARY(4) loses a trailing 0x00
    if base == "CHAR":
        return v + " "  # CHAR drops trailing spaces in the source
    return v[:-1] + ("y" if v[-1:] != "y" else "z")


def row_image(row: int, json_text: str | None = None) -> dict[str, Any]:
    image: dict[str, Any] = {"id": row}
    for i in range(len(TYPES)):
        image[f"c{i}"] = value(i, row)[1]
    if json_text is not None:
        image[f"c{_json_column()}"] = json_text
    return image


def _json_column() -> int:
    return next(i for i, (t, _) in enumerate(TYPES) if t == "JSON")


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path) -> Lake:
    catalog = f"verify{next(_catalogs)}"
    register(spark, CatalogConfig(name=catalog, warehouse=str(tmp_path / "wh")))
    lake = Lake(spark, catalog, MergePolicy(rows=10**9, age_s=10**9))
    lake.open()
    return lake


@pytest.fixture
def conn(mariadb: MariaDB) -> Iterator[Any]:
    """A verify connection to the session MariaDB."""
    connection = verify.connect(mariadb.dsn())
    with connection.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates are legal input here
    try:
        yield connection
    finally:
        connection.close()


def execute(conn: Any, *sql: str) -> None:
    with conn.cursor() as cur:
        for s in sql:
            cur.execute(s)


def feed(lake: Lake, *envs: tuple[int, dict[str, Any]]) -> None:
    lake.apply(envs[-1][0], list(envs))


def typed_table(conn: Any, lake: Lake, db: str) -> Feed:
    """`db`.types: a column of every MATRIX type (and GEOMETRY), ROWS rows, in the source and in the lake."""
    cols = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(TYPES))
    execute(conn, f"CREATE TABLE `{db}`.types (id INT PRIMARY KEY, {cols})")
    names = ", ".join(f"c{i}" for i in range(len(TYPES)))
    execute(conn, *(f"INSERT INTO `{db}`.types (id, {names}) VALUES "
                    f"({r}, {', '.join(value(i, r)[0] for i in range(len(TYPES)))})" for r in range(ROWS)))
    f = Feed(db, "types")
    # JSON is compared by meaning: the lake's text may be spelled differently
    feed(lake, f.env("i", [{"after": row_image(r, '{"a":[1,2.50,null]}')} for r in range(ROWS)], COLUMNS, ["id"]))
    lake.merge_all()
    return f


def test_every_type_equal_then_a_difference_in_each_is_named(spark, lake, conn, database):
    db = database
    f = typed_table(conn, lake, db)
    result = verify.verify_table(spark, conn, lake.catalog, db, "types")
    assert result.lines() == [f"OK    {db}.types: {ROWS} rows"], result.lines()

    # one planted difference per column (row i <- column c<i>), the zero dates given values in the last row
    plants: dict[int, set[int]] = {i: {i} for i in range(len(TYPES))}
    zero_row = ROWS - 1
    plants[zero_row] = {i for i in range(len(TYPES)) if value(i, zero_row)[1] is None}
    assert len(plants[zero_row]) == 3  # DATE, DATETIME, TIMESTAMP zero values
    updates = []
    for row, cols in plants.items():
        before = row_image(row, '{"a":[1,2.50,null]}')
        after = dict(before)
        for i in cols:
            after[f"c{i}"] = planted(TYPES[i][0], before[f"c{i}"])
        updates.append({"before": before, "after": after})
    only_lake = {**row_image(3), "id": 1001}
    feed(lake, f.env("u", updates, COLUMNS, ["id"]), f.env("i", [{"after": only_lake}], COLUMNS, ["id"]))
    execute(conn, f"INSERT INTO `{db}`.types (id, c0) VALUES (1000, 5)")  # only in the source

    result = verify.verify_table(spark, conn, lake.catalog, db, "types", limit=100)  # the un-merged tail
    by_key = {d.key: d for d in result.differences}
    for row, cols in plants.items():
        assert set(by_key[f"({row},)"].columns) == {f"c{i}" for i in cols}, (TYPES[row][0], by_key[f"({row},)"])
    assert by_key["(1000,)"].text == "only in source"
    assert by_key["(1001,)"].text == "only in lake"
    assert "(46,)" not in by_key  # the control row
    assert result.differing == len(result.differences) == len(plants) + 2
    assert (result.source_rows, result.lake_rows) == (ROWS + 1, ROWS + 1)

    lines = result.lines()
    assert lines[0] == f"DIFF  {db}.types: source {ROWS + 1} rows, lake {ROWS + 1} rows"
    assert len(lines) == 1 + verify.DETAIL_LINES + 1
    assert lines[-1] == f"  ... and {len(plants) + 2 - verify.DETAIL_LINES} more differing keys"
    assert lines[1] == "  key (0,): c0 source=-128 lake=-127"
    assert lines[11] == "  key (10,): c10 source=-12345678.90 lake=-12345678.91"
    assert lines[15] == "  key (14,): c14 source=0.0 lake=1e-45"  # FLOAT: the next float32 is a difference
    text = {d.key: d.line() for d in result.differences}
    binary = next(i for i, (t, _) in enumerate(TYPES) if t == "BINARY(4)")
    stored = value(binary, binary)[1]
    assert text[f"({binary},)"] == f"  key ({binary},): c{binary} source=0x{stored.hex()} lake=0x{stored[:-1].hex()}"
    assert "source=NULL lake=2000-01-01" in text[f"({zero_row},)"]


def test_keyless_table_compares_as_a_multiset(spark, lake, conn, database):
    db = database
    execute(conn, f"CREATE TABLE `{db}`.bag (n INT, v VARCHAR(5))",
            f"INSERT INTO `{db}`.bag VALUES (1, 'a'), (1, 'a'), (2, NULL)")
    cols = [{"name": "n", "type": "int", "nullable": True},
            {"name": "v", "type": "varchar", "nullable": True, "charset": "utf8mb4"}]
    f = Feed(db, "bag")
    feed(lake, f.env("i", [{"after": {"n": 1, "v": "a"}}, {"after": {"n": 1, "v": "a"}},
                              {"after": {"n": 2, "v": None}}], cols, []))
    result = verify.verify_table(spark, conn, lake.catalog, db, "bag")
    assert result.lines() == [f"OK    {db}.bag: 3 rows"]

    feed(lake, f.env("d", [{"before": {"n": 1, "v": "a"}}], cols, []),
         f.env("i", [{"after": {"n": 3, "v": "c"}}], cols, []))
    execute(conn, f"INSERT INTO `{db}`.bag VALUES (2, NULL)")
    result = verify.verify_table(spark, conn, lake.catalog, db, "bag")
    assert result.lines() == [
        f"DIFF  {db}.bag: source 4 rows, lake 3 rows",
        "  row (1, 'a'): 2 in source, 1 in lake",
        "  row (2, NULL): 2 in source, 1 in lake",
        "  row (3, 'c'): 0 in source, 1 in lake",
    ]


def test_names_with_backticks_spaces_dots_and_non_ascii(spark, lake, conn, mariadb):
    db, table, key, col = f"t_{uuid.uuid4().hex[:8]} `x.ü", "we`ird t.ä", "c`ol .é", "v .ß"
    q = mysql_quote
    execute(conn, f"CREATE DATABASE {q(db)} CHARACTER SET utf8mb4")
    try:
        execute(conn, f"CREATE TABLE {q(db)}.{q(table)} ({q(key)} VARCHAR(10) PRIMARY KEY, {q(col)} INT)",
                f"INSERT INTO {q(db)}.{q(table)} VALUES ('ä`.', 1), ('b', 2)")
        cols = [{"name": key, "type": "varchar", "nullable": False, "charset": "utf8mb4"},
                {"name": col, "type": "int", "nullable": True}]
        f = Feed(db, table)
        feed(lake, f.env("i", [{"after": {key: "ä`.", col: 1}}, {"after": {key: "b", col: 2}}], cols, [key]))
        name = display(db, table)
        assert name == f"{q(db)}.{q(table)}"
        (result,) = verify.verify(spark, conn, lake.catalog, [name])
        assert result.lines() == [f"OK    {name}: 2 rows"]
        assert [r.table for r in verify.verify(spark, conn, lake.catalog)] == [name]  # default: the lake's tables

        feed(lake, f.env("u", [{"before": {key: "ä`.", col: 1}, "after": {key: "ä`.", col: 7}}], cols, [key]))
        (result,) = verify.verify(spark, conn, lake.catalog, [name])
        assert result.lines() == [f"DIFF  {name}: source 2 rows, lake 2 rows",
                                  f"  key ('ä`.',): {q(col)} source=1 lake=7"]
    finally:
        execute(conn, f"DROP DATABASE IF EXISTS {q(db)}")


def test_source_url_comes_from_the_environment_or_what_binlake_up_recorded(tmp_path):
    assert verify.source_url("mysql://u@h:1", str(tmp_path)) == "mysql://u@h:1"
    with pytest.raises(ConfigError, match="BINLAKE_SOURCE_URL"):
        verify.source_url("", str(tmp_path))
    (tmp_path / "ports.json").write_text(json.dumps({"nats": 4222, "mariadb": 3307}))  # ports only: no source
    with pytest.raises(ConfigError, match="source-url"):
        verify.source_url("", str(tmp_path))
    source.record_url(tmp_path, "mysql://binlake:pw@127.0.0.1:3307")
    assert verify.source_url("", str(tmp_path)) == "mysql://binlake:pw@127.0.0.1:3307"


def _cli(*tables: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = clean_env()
    full.update(env)
    return subprocess.run([sys.executable, "-m", "services.loader.verify", *tables], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)
def test_cli_exit_codes_and_output(spark, lake, conn, database, mariadb, tmp_path):
    db = database
    cols = [ID, {"name": "price", "type": "decimal", "nullable": True, "precision": 6, "scale": 2}]
    execute(conn, f"CREATE TABLE `{db}`.ok (id INT PRIMARY KEY, price DECIMAL(6,2))",
            f"CREATE TABLE `{db}`.bad (id INT PRIMARY KEY, price DECIMAL(6,2))",
            f"INSERT INTO `{db}`.ok VALUES (1, 1.50), (2, NULL)",
            f"INSERT INTO `{db}`.bad VALUES (7, 1.50), (9, 2.00)")
    f = Feed(db, "ok")
    feed(lake, f.env("i", [{"after": {"id": 1, "price": "1.50"}}, {"after": {"id": 2, "price": None}}], cols,
                        ["id"]),
         f.env("i", [{"after": {"id": 7, "price": "1.49"}}], cols, ["id"], table="bad"))
    data = tmp_path / "data"
    data.mkdir()
    lake_env = {"BINLAKE_WAREHOUSE": str(tmp_path / "wh"), "BINLAKE_CATALOG": "lake", "BINLAKE_DATA_DIR": str(data)}

    # no source URL anywhere: a configuration error, before Spark starts
    out = _cli(f"{db}.ok", **lake_env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "BINLAKE_SOURCE_URL" in out.stderr
    out = _cli(**lake_env, BINLAKE_SOURCE_URL=mariadb.dsn(), BINLAKE_CATALOG_TYPE="jdbc")
    assert out.returncode == 2 and "BINLAKE_CATALOG_URI" in out.stderr, out.stdout + out.stderr
    out = _cli(**{**lake_env, "BINLAKE_WAREHOUSE": str(tmp_path / "nowhere")}, BINLAKE_SOURCE_URL=mariadb.dsn())
    assert out.returncode == 2 and "no lake at" in out.stderr, out.stdout + out.stderr

    # equal: the source found through the URL file `binlake up` wrote
    source.record_url(data, mariadb.dsn())
    out = _cli(f"{db}.ok", **lake_env)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.splitlines() == [f"OK    {db}.ok: 2 rows"]

    # every table the lake holds (default), one differs
    out = _cli(**lake_env, BINLAKE_SOURCE_URL=mariadb.dsn())
    assert out.returncode == 1, out.stdout + out.stderr[-3000:]
    assert out.stdout.splitlines() == [
        f"DIFF  {db}.bad: source 2 rows, lake 1 rows",
        "  key (7,): price source=1.50 lake=1.49",
        "  key (9,): only in source",
        f"OK    {db}.ok: 2 rows",
    ]


def test_mysql_vector_columns_compare_as_float32_lists(spark, lake, mysql):
    """MySQL 9's VECTOR: float32 bytes in the source, array<float> in the lake."""
    db = f"v_{uuid.uuid4().hex[:8]}"
    connection = verify.connect(mysql.dsn())
    try:
        execute(connection, f"CREATE DATABASE {db}", f"CREATE TABLE {db}.vec (id INT PRIMARY KEY, v VECTOR(3))",
                f"INSERT INTO {db}.vec VALUES (1, STRING_TO_VECTOR('[1.5, -2, 3.1]')), (2, NULL)")
        f = Feed(db, "vec")
        columns = [ID, {"name": "v", "type": "vector", "nullable": True, "dimensions": 3}]
        third = struct.unpack("<f", struct.pack("<f", 3.1))[0]  # what the float32 holds
        feed(lake, f.env("i", [{"after": {"id": 1, "v": [1.5, -2.0, third]}}, {"after": {"id": 2, "v": None}}],
                         columns, ["id"]))
        lake.merge_all()
        assert spark.table(f"{lake.catalog}.{db}.vec").schema["v"].dataType.simpleString() == "array<float>"
        (result,) = verify.verify(spark, connection, lake.catalog, [f"{db}.vec"])
        assert result.equal, result.lines()
        feed(lake, f.env("u", [{"before": {"id": 1, "v": [1.5, -2.0, third]},
                                "after": {"id": 1, "v": [1.5, -2.0, 3.0]}}], columns, ["id"]))
        (result,) = verify.verify(spark, connection, lake.catalog, [f"{db}.vec"])
        assert not result.equal and "key (1,): v" in "\n".join(result.lines())
    finally:
        execute(connection, f"DROP DATABASE IF EXISTS {db}")
        connection.close()

"""Hostile identifiers through the whole pipeline (issue 14).

A database, tables and columns whose names hold a backtick, both quotes, a dot, a space,
`%`, `$`, `*`, `>` and non-ASCII go MariaDB -> parser -> BINLAKE_RAW -> sink (a mask and a
column rule keyed by those names) -> BINLAKE_CDC -> store/meta -> loader -> Iceberg, with
inserts, updates (of the key too), deletes, ADD COLUMN and RENAME COLUMN. Every service is a
real process; `binlake verify` (its own process, the names given as the CLI takes them) must
say OK, and the CDC subjects must carry the names escaped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher.processes import ROOT, ServiceProcess, clean_env
from shared.mysql import display
from shared.mysql import mysql_quote as q
from shared.subjects import Names, unescape_token
from tests.integration.lake_stack import (
    ServiceFactory,
    Stack,
    assert_cells_equal,
    assert_verify_equal,
    events,
    services_answer,
)
from tests.integration.support import wait_until
from tests.servers import MariaDB

SOURCE = "main"  # BINLAKE_SOURCE's default: the parser's and the sink's
SALT = "salt-ü"
HOSTILE = "we`ird \"t'.ä*>%$"
PLAIN = "plain"
MASKED = "mäsk`ed. t*"
KEY = "k`e.y \"ü'"
VALUE = "v .ß*>%$"
NOTE = "n'ote\"` é"
ADDED = "nëu `col.\"*"
RENAMED = "w`.ñ$%> x"
EMAIL = "e`mail .ü"
SECRET = "sec ret\".*"
CLEAR = "clear-text-secret"


@pytest.fixture
def hostile_db(mariadb: MariaDB) -> Iterator[str]:
    """A fresh database with a hostile name (created by the test, after the parser runs)."""
    mariadb.start()
    name = f"t_{uuid.uuid4().hex[:8]} `x.\"ü'*>%$"
    try:
        yield name
    finally:
        mariadb.start()
        mariadb.execute(f"DROP DATABASE IF EXISTS {q(name)}")


@pytest.fixture
def stack(mariadb: MariaDB, hostile_db: str, nats_url: str, parser: ServiceProcess, sink_factory: ServiceFactory,
          service_factory: ServiceFactory, tmp_path: Path) -> Stack:
    """parser + one sink (rules keyed by the hostile names) + meta + store (no loader yet)."""
    # `*` is a glob character in rule keys: `[*]` matches the table's literal `*` only.
    masked_key = f"{hostile_db}.{MASKED}".replace("*", "[*]")
    sink_factory("sink", BINLAKE_MASKS=json.dumps({masked_key: {EMAIL: "replace:***"}}),
                 BINLAKE_COLUMNS_EXCLUDE=json.dumps({masked_key: [SECRET]}), BINLAKE_MASK_SALT=SALT)
    meta = service_factory("services.meta", "meta")
    store = service_factory("services.store", "store")
    wait_until(lambda: services_answer(nats_url), 60, "meta and store to answer", interval=0.5)
    assert meta.running and store.running
    stack = Stack(mariadb, hostile_db, nats_url, tmp_path / "data", service_factory)
    stack.env_extra["BINLAKE_MAINTENANCE_S"] = "15"  # compaction and expiry run on the hostile tables too
    return stack


def _phase1(db: str) -> tuple[list[str], int]:
    """Create the tables and change rows: (statements, row changes)."""
    h, p, m = f"{q(db)}.{q(HOSTILE)}", f"{q(db)}.{q(PLAIN)}", f"{q(db)}.{q(MASKED)}"
    return [
        f"CREATE DATABASE {q(db)} CHARACTER SET utf8mb4",
        f"CREATE TABLE {h} ({q(KEY)} VARCHAR(20) PRIMARY KEY, {q(VALUE)} INT, {q(NOTE)} TEXT)",
        f"CREATE TABLE {p} (id INT PRIMARY KEY, v VARCHAR(20))",
        f"CREATE TABLE {m} (id INT PRIMARY KEY, {q(EMAIL)} VARCHAR(50), {q(SECRET)} VARCHAR(50), n INT)",
        f"INSERT INTO {h} VALUES ('a`.', 1, 'x\"y'), ('b c', 2, NULL), ('ü''%', 3, '*>$'), ('d', 4, 'd'), "
        "('e', 5, 'e')",
        f"INSERT INTO {p} VALUES (1, 'one'), (2, 'two'), (3, 'three'), (4, 'four'), (5, 'five')",
        f"INSERT INTO {m} VALUES (1, '{CLEAR}-1', '{CLEAR}-s1', 1), (2, '{CLEAR}-2', '{CLEAR}-s2', 2), "
        f"(3, NULL, NULL, 3)",
        f"UPDATE {h} SET {q(VALUE)} = {q(VALUE)} * 10 WHERE {q(KEY)} IN ('a`.', 'b c')",
        f"UPDATE {h} SET {q(KEY)} = 'd.moved`' WHERE {q(KEY)} = 'd'",
        f"DELETE FROM {h} WHERE {q(KEY)} = 'e'",
        f"UPDATE {p} SET v = concat(v, '!') WHERE id <= 2",
        f"DELETE FROM {p} WHERE id = 5",
    ], 5 + 5 + 3 + 2 + 1 + 1 + 2 + 1


def _phase2(db: str) -> tuple[list[str], int]:
    """Schema changes of the hostile table between row changes: (statements, row changes)."""
    h, m = f"{q(db)}.{q(HOSTILE)}", f"{q(db)}.{q(MASKED)}"
    return [
        f"ALTER TABLE {h} ADD COLUMN {q(ADDED)} INT NOT NULL DEFAULT 5",
        f"INSERT INTO {h} VALUES ('f', 6, 'f', 60), ('g`\"', 7, NULL, 70)",
        f"UPDATE {h} SET {q(ADDED)} = 55 WHERE {q(KEY)} = 'a`.'",
        f"ALTER TABLE {h} RENAME COLUMN {q(VALUE)} TO {q(RENAMED)}",
        f"UPDATE {h} SET {q(RENAMED)} = -1 WHERE {q(KEY)} IN ('f', 'b c')",
        f"INSERT INTO {h} ({q(KEY)}, {q(RENAMED)}) VALUES ('h', 8)",
        f"UPDATE {m} SET {q(EMAIL)} = '{CLEAR}-3', n = 30 WHERE id = 3",
    ], 2 + 1 + 2 + 1 + 1


def _settle(stack: Stack, rows: int, tables: list[str]) -> None:
    cdc = stack.wait_cdc(rows, timeout=120)
    stack.wait_loaded(max(m.seq for m in cdc), timeout=180)
    stack.wait_merged(tables, timeout=120)


def _cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`binlake <args>` against this stack's NATS and lake."""
    env = clean_env()
    env.update(BINLAKE_NATS_URL=stack.nats_url, BINLAKE_DATA_DIR=str(stack.data_dir))
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.timeout(400)
def test_hostile_names_through_the_whole_pipeline(stack, spark):
    db = stack.db
    stack.start_loader()  # Spark starts while the source changes
    sql, rows = _phase1(db)
    stack.mariadb.execute(*sql)
    _settle(stack, rows, [HOSTILE, PLAIN, MASKED])
    sql, more = _phase2(db)
    stack.mariadb.execute(*sql)
    _settle(stack, rows + more, [HOSTILE, PLAIN, MASKED])
    wait_until(lambda: any(e["table"] == f"{db}.{HOSTILE}" for e in events(stack.loader, "lake.maintained")), 90,
               "maintenance of the hostile table", interval=1)

    # The subjects: each name one escaped token, and back.
    cdc = stack.cdc()
    subjects = {m.env["table"]: m.subject for m in cdc}
    assert set(subjects) == {HOSTILE, PLAIN, MASKED}
    for table, subject in subjects.items():
        assert subject == Names().cdc(SOURCE, db, table)
        tokens = subject.split(".")
        assert len(tokens) == 5 and [unescape_token(t) for t in tokens[2:]] == [SOURCE, db, table], subject

    # The lake equals the source, by `binlake verify` and cell by cell.
    assert_verify_equal(spark, stack, [HOSTILE, PLAIN])
    for table in (HOSTILE, PLAIN):
        assert_cells_equal(stack, table)
    lake = stack.current(HOSTILE)
    assert lake is not None and lake.column_names == [KEY, RENAMED, NOTE, ADDED]

    # The sink's rules found the masked table and its columns by their hostile names.
    masked_cdc = [m.env for m in cdc if m.env["table"] == MASKED]
    assert CLEAR not in json.dumps(masked_cdc, ensure_ascii=False)
    for env in masked_cdc:
        assert [c["name"] for c in env["schema"]["columns"]] == ["id", EMAIL, "n"]
        assert all(SECRET not in image for row in env["rows"] for image in row.values())
    masked = stack.current(MASKED)
    assert masked is not None
    # The sink's rules reach the CREATE TABLE the lake table is built from: the excluded column is no lake column.
    assert masked.column_names == ["id", EMAIL, "n"]
    got = sorted(masked.to_pylist(), key=lambda r: r["id"])
    assert got == [{"id": 1, EMAIL: "***", "n": 1}, {"id": 2, EMAIL: "***", "n": 2}, {"id": 3, EMAIL: "***", "n": 30}]
    masked_log = stack.changelog(MASKED)
    assert masked_log is not None and not [c for c in masked_log.column_names if SECRET in c]

    # The commands take the names the way they print them.
    name = display(db, HOSTILE)
    out = _cli(stack, "tail", name, "--no-follow")
    assert out.returncode == 0, out.stderr
    tailed = [json.loads(line) for line in out.stdout.splitlines()]
    assert {(e["db"], e["table"]) for e in tailed} == {(db, HOSTILE)}
    assert [e["_seq"] for e in tailed if e["op"] != "ddl"] == [m.seq for m in cdc if m.env["table"] == HOSTILE]
    out = _cli(stack, "lake", "show", name, "-n", "20")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    head, columns = out.stdout.splitlines()[:2]
    assert head.startswith(f"{name} at batch ") and ": 7 rows;" in head, head
    assert all(c in columns for c in (KEY, RENAMED, NOTE, ADDED)), columns


LONG = "ORDER_ITEMS_" + "X" * 34  # 46 upper-case characters: 276 bytes escaped, past a file name's 255
BOOKISH = "bookish"  # a column named like the lake's bookkeeping
CASED = "cased"  # a case-only RENAME COLUMN


@pytest.mark.timeout(400)
def test_names_the_lake_could_not_take_load_equal(stack, spark):
    db = stack.db
    stack.start_loader()
    lg, bk, cs = (f"{q(db)}.{q(t)}" for t in (LONG, BOOKISH, CASED))
    stack.mariadb.execute(
        f"CREATE DATABASE {q(db)} CHARACTER SET utf8mb4",
        f"CREATE TABLE {lg} (id INT PRIMARY KEY, v VARCHAR(20))",
        f"CREATE TABLE {bk} (id INT PRIMARY KEY, _binlake_x INT, _BINLAKE_op VARCHAR(5))",
        f"CREATE TABLE {cs} (id INT PRIMARY KEY, Email VARCHAR(40))",
        f"INSERT INTO {lg} VALUES (1, 'a'), (2, 'b'), (3, 'c')",
        f"INSERT INTO {bk} VALUES (1, 10, 'i'), (2, 20, 'u'), (3, 30, NULL)",
        f"INSERT INTO {cs} VALUES (1, 'A@x'), (2, 'B@x')",
        f"UPDATE {lg} SET v = 'bb' WHERE id = 2",
        f"DELETE FROM {bk} WHERE id = 3",
        f"UPDATE {bk} SET _binlake_x = 21 WHERE id = 2",
        f"ALTER TABLE {cs} RENAME COLUMN Email TO email",
        f"INSERT INTO {cs} VALUES (3, 'C@x')",
        f"UPDATE {cs} SET email = 'b@x' WHERE id = 2",
    )
    _settle(stack, 3 + 3 + 2 + 1 + 1 + 1 + 1 + 1, [LONG, BOOKISH, CASED])
    assert not events(stack.loader, "lake.table_held")
    assert_verify_equal(spark, stack, [LONG, BOOKISH, CASED])
    for table in (LONG, CASED):
        assert_cells_equal(stack, table)
    cased = stack.current(CASED)
    assert cased is not None and cased.column_names == ["id", "email"]
    bookish = stack.current(BOOKISH)
    assert bookish is not None and bookish.column_names == ["id", "__binlake_x", "__BINLAKE_op"]

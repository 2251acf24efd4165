"""Every bad input stops the parser with one clear line and a non-zero exit; nothing is published."""

from __future__ import annotations

import uuid

import pytest

from shared import objects
from tests.integration.conftest import ParserFactory
from tests.integration.support import read_stream_sync, row_changes, wait_until
from tests.servers import MariaDB


def _fails_with(parser_factory: ParserFactory, nats_url: str, expected: str, timeout: float = 60,
                **env: str) -> str:
    proc = parser_factory(wait_ready=False, **env)
    code = proc.wait(timeout)
    assert code != 0, proc.output
    assert expected in proc.output, proc.output
    assert read_stream_sync(nats_url) == [], "nothing may be published"
    return proc.output


@pytest.mark.parametrize(("args", "message"), [
    (["--binlog-format=STATEMENT"], "binlog_format is STATEMENT; set binlog_format=ROW"),
    (["--binlog-format=MIXED"], "binlog_format is MIXED; set binlog_format=ROW"),
    (["--binlog-row-image=MINIMAL"], "binlog_row_image is MINIMAL; set binlog_row_image=FULL"),
    (["--binlog-row-metadata=MINIMAL"], "binlog_row_metadata is MINIMAL; set binlog_row_metadata=FULL"),
])
def test_wrong_server_settings_are_refused(mariadb_factory, parser_factory, nats_url, args, message):
    server: MariaDB = mariadb_factory(extra_args=args)
    _fails_with(parser_factory, nats_url, message, BINLAKE_SOURCE_URL=server.dsn())


def test_binlog_off_is_refused(mariadb_factory, parser_factory, nats_url):
    server: MariaDB = mariadb_factory(log_bin=False)
    _fails_with(parser_factory, nats_url, "the binary log is off", BINLAKE_SOURCE_URL=server.dsn())


@pytest.mark.parametrize(("grants", "missing"), [
    ("REPLICATION CLIENT", "lacks REPLICATION SLAVE"),
    ("REPLICATION SLAVE", "lacks REPLICATION CLIENT"),
    ("SELECT", "lacks REPLICATION SLAVE and REPLICATION CLIENT"),
])
def test_missing_privileges_are_named(mariadb, parser_factory, nats_url, grants, missing):
    user = f"u{uuid.uuid4().hex[:8]}"
    mariadb.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'", f"GRANT {grants} ON *.* TO '{user}'@'%'")
    try:
        out = _fails_with(parser_factory, nats_url, missing, BINLAKE_SOURCE_URL=mariadb.dsn(user, "pw"))
        assert "GRANT" in out
    finally:
        mariadb.execute(f"DROP USER '{user}'@'%'")


def test_wrong_password_is_access_denied(mariadb, parser_factory, nats_url):
    out = _fails_with(parser_factory, nats_url, "AccessDenied", BINLAKE_SOURCE_URL=mariadb.dsn("root", "wrong"))
    assert "check user and password" in out
    assert ":wrong@" not in out, "the password must not be logged"


def test_unreachable_source_retries_then_fails(parser_factory, nats_url):
    from tests.servers import free_port

    out = _fails_with(parser_factory, nats_url, "source unreachable",
                      BINLAKE_SOURCE_URL=f"mysql://root:secret@127.0.0.1:{free_port()}",
                      BINLAKE_MAX_RESTARTS="2", BINLAKE_RESTART_BASE_DELAY_S="0.1")
    assert out.count('"actor.restart"') == 2
    assert "secret" not in out


def test_bad_configuration_exits_2(parser_factory, nats_url):
    proc = parser_factory(wait_ready=False, BINLAKE_START="yesterday")
    assert proc.wait(20) == 2
    assert "BINLAKE_START must be 'current' or 'earliest'" in proc.output
    proc = parser_factory(wait_ready=False, log_name="p2.log", BINLAKE_SOURCE_URL="postgres://x@y")
    assert proc.wait(20) == 2, proc.output
    assert "mysql://user:password@host:3306" in proc.output


def test_unreachable_nats_fails(mariadb, parser_factory):
    from tests.servers import free_port

    proc = parser_factory(wait_ready=False, BINLAKE_NATS_URL=f"nats://127.0.0.1:{free_port()}")
    assert proc.wait(30) == 1
    assert "cannot reach NATS" in proc.output


def test_purged_position_is_refused(mariadb_factory, parser_factory, nats_url):
    server: MariaDB = mariadb_factory()
    server.execute("CREATE DATABASE p", "CREATE TABLE p.t (id INT PRIMARY KEY)", "INSERT INTO p.t VALUES (1)")
    first = parser_factory(BINLAKE_SOURCE_URL=server.dsn())
    wait_until(lambda: read_stream_sync(nats_url), 30, "the first message")
    first.stop()
    before = len(read_stream_sync(nats_url))
    server.execute("INSERT INTO p.t VALUES (2)", "FLUSH BINARY LOGS")
    newest = server.query("SHOW MASTER STATUS")[0][0]

    def purged() -> bool:
        # MariaDB keeps a binlog until its crash-recovery checkpoint is written; retry the purge.
        server.execute(f"PURGE BINARY LOGS TO '{newest}'")
        return [r[0] for r in server.query("SHOW BINARY LOGS")] == [newest]

    wait_until(purged, 30, "the old binlogs to be purged")
    proc = parser_factory(wait_ready=False, log_name="p2.log", BINLAKE_SOURCE_URL=server.dsn())
    assert proc.wait(60) == 1, proc.output
    assert "BinlogPurged" in proc.output and "binlogs holding that position are gone" in proc.output
    assert len(read_stream_sync(nats_url)) == before


def test_a_row_larger_than_max_payload_goes_to_an_object_and_capture_goes_on(mariadb, database, parser_factory,
                                                                             nats_url):
    mariadb.execute(f"CREATE TABLE `{database}`.big (id INT PRIMARY KEY, b LONGBLOB)")
    proc = parser_factory()
    mariadb.execute(f"INSERT INTO `{database}`.big VALUES (1, 'small')",
                    f"INSERT INTO `{database}`.big VALUES (2, REPEAT('x', 2000000))",
                    f"INSERT INTO `{database}`.big VALUES (3, 'after')")

    def ids() -> list[int]:
        return [r["after"]["id"] for m in row_changes(read_stream_sync(nats_url), database) for r in m.env["rows"]]

    wait_until(lambda: ids() == [1, 2, 3], 60, "all three rows in BINLAKE_RAW")
    assert proc.running, proc.output
    refs = [m for m in read_stream_sync(nats_url, resolve=False) if objects.HEADER in m.headers]
    assert len(refs) == 1 and refs[0].env["rows"] == [] and refs[0].headers["Binlake-Rows"] == "1"
    assert refs[0].env["ref"]["bucket"] == "binlake_raw_objects"
    whole = next(m for m in row_changes(read_stream_sync(nats_url), database) if m.seq == refs[0].seq)
    assert whole.env["rows"] == [{"after": {"id": 2, "b": b"x" * 2000000}}]


def test_statement_based_dml_is_refused(mariadb, database, parser_factory, nats_url):
    mariadb.execute(f"CREATE TABLE `{database}`.s (id INT PRIMARY KEY)")
    proc = parser_factory()
    conn = mariadb.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = 'STATEMENT'")
        cur.execute(f"INSERT INTO `{database}`.s VALUES (1)")
    conn.close()
    assert proc.wait(60) == 1, proc.output
    assert "statement-based DML" in proc.output and "set binlog_format=ROW" in proc.output


@pytest.mark.parametrize("resume", [None, {"file": "mysql-bin.000001"}, {"file": 5, "offset": 4},
                                    {"file": "nonumber", "offset": 4}, {"file": "mysql-bin.000001", "offset": -1}])
def test_a_foreign_last_raw_message_stops_the_parser_with_the_fix(mariadb, parser_factory, nats_url, resume):
    """A raw message the parser did not write, at the end of BINLAKE_RAW: one clear line, no traceback."""
    import asyncio

    import msgpack
    import nats

    from shared.jetstream import ensure_streams
    from shared.subjects import Names

    env = {"v": 1, "source": "main", "db": "x", "table": "y", "op": "i", "ts": 0,
           "pos": {"file": "mysql-bin.000001", "offset": 4, "gtid": None}, "scn": 1,
           "txn": {"id": "t", "i": 0, "last": True}, "rows": []}
    if resume is not None:
        env["resume"] = resume

    async def publish() -> None:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await ensure_streams(js, Names(), 16, 1)
            await js.publish(Names().raw("main", "x", "y"), msgpack.packb(env))
        finally:
            await nc.close()

    asyncio.run(publish())
    proc = parser_factory(wait_ready=False)
    assert proc.wait(60) == 1, proc.output
    assert "StreamMismatch" in proc.output and "does not say where to resume" in proc.output, proc.output
    assert "nats stream rmm BINLAKE_RAW" in proc.output and "Traceback" not in proc.output

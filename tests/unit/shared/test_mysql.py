"""shared.mysql: every mysql:// URL binlake takes, and what a server error code tells the operator."""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest

from shared.errors import AccessDenied, BinlogPurged, ConfigError, DecodeError, MissingPrivilege, SourceUnavailable
from shared.mysql import MysqlUrl, binlog_status_sql, display, map_mysql_error, mysql_quote, parse_name, server_version


def test_a_full_url_with_quoted_user_and_password() -> None:
    url = MysqlUrl.parse("mysql://repl%40x:p%2Fw%3Ad@db.example:3307/meta")
    assert url == MysqlUrl("db.example", 3307, "repl@x", "p/w:d", "meta")
    assert str(url) == "mysql://repl@x@db.example:3307/meta"  # no password in messages
    assert url.pymysql_settings() == {"host": "db.example", "port": 3307, "user": "repl@x", "password": "p/w:d",
                                      "connect_timeout": 10, "database": "meta"}
    assert url.address == "db.example:3307"
    assert url.asyncmy_settings()["password"] == "p/w:d"


def test_defaults_and_the_mariadb_scheme() -> None:
    assert MysqlUrl.parse("mariadb://h") == MysqlUrl("h", 3306, "root", "", "")
    assert "database" not in MysqlUrl.parse("mysql://h").pymysql_settings()


@pytest.mark.parametrize(("url", "message"), [
    ("postgres://u@h:5432", "source URL must look like mysql://user:password@host:3306, got scheme 'postgres'"),
    ("mysql://", "must look like"),
    ("mysql://u@h:notaport", "must look like mysql://user:password@host:3306"),
    ("h:3306", "got scheme"),
])
def test_bad_urls_say_the_form(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MysqlUrl.parse(url)


def test_a_database_can_be_required() -> None:
    with pytest.raises(ConfigError, match=r"META_MYSQL_URL must look like .*/database: the database is missing"):
        MysqlUrl.parse("mysql://u@h:3306", "BINLAKE_META_MYSQL_URL", need_database=True)


@pytest.mark.parametrize(("exc", "kind", "hint"), [
    (pymysql.err.OperationalError(1236, "Could not find first log file"), BinlogPurged, "take a new snapshot"),
    (pymysql.err.OperationalError(1045, "Access denied"), AccessDenied, "check user and password"),
    (pymysql.err.OperationalError(1227, "need REPLICATION SLAVE"), MissingPrivilege, "GRANT REPLICATION SLAVE"),
    (pymysql.err.OperationalError(2003, "Can't connect"), SourceUnavailable, "unreachable"),
    (ConnectionResetError("reset"), SourceUnavailable, "unreachable"),
    (pymysql.err.OperationalError(1064, "syntax"), DecodeError, "failed at mysql-bin.000001:4"),
])
def test_error_codes_become_errors_that_say_what_to_do(exc: Exception, kind: type[Exception], hint: str) -> None:
    err = map_mysql_error(exc, "mysql-bin.000001:4")
    assert isinstance(err, kind) and hint in str(err)


@pytest.mark.parametrize(("version", "sql"), [
    ("5.7.44-log", "SHOW MASTER STATUS"),
    ("8.0.40", "SHOW MASTER STATUS"),
    ("8.1.0", "SHOW MASTER STATUS"),
    ("8.2.0", "SHOW BINARY LOG STATUS"),
    ("8.4.6", "SHOW BINARY LOG STATUS"),
    ("9.4.0-commercial", "SHOW BINARY LOG STATUS"),
    ("10.4.34-MariaDB", "SHOW MASTER STATUS"),
    ("10.5.1-MariaDB", "SHOW MASTER STATUS"),
    ("10.5.2-MariaDB", "SHOW BINLOG STATUS"),
    ("10.11.19-MariaDB-0+deb12u1-log", "SHOW BINLOG STATUS"),
    ("5.5.5-10.11.6-MariaDB-0+deb12u1", "SHOW BINLOG STATUS"),  # a handshake's version of MariaDB 10
    ("5.5.5-10.4.2-MariaDB", "SHOW MASTER STATUS"),
    ("11.8.3-MariaDB", "SHOW BINLOG STATUS"),
])
def test_the_binlog_status_statement_follows_the_server_version(version: str, sql: str) -> None:
    assert binlog_status_sql(version) == sql


def test_versions_are_read_as_numbers_not_text() -> None:
    assert server_version("10.0.1-MariaDB") == (True, (10, 0, 1))
    assert server_version("8.10.2") == (False, (8, 10, 2))
    with pytest.raises(ConfigError, match="cannot read the server version"):
        binlog_status_sql("unknown")


def test_tls_options_in_the_url(tmp_path: Path) -> None:
    import ssl

    plain = MysqlUrl.parse("mysql://u:p@h:3306/db")
    assert plain.ssl_mode == "DISABLED" and plain.ssl_context() is None and "ssl" not in plain.asyncmy_settings()
    required = MysqlUrl.parse("mysql://u:p@h/?ssl-mode=required")
    ctx = required.ssl_context()
    assert required.ssl_mode == "REQUIRED" and ctx is not None and ctx.verify_mode == ssl.CERT_NONE
    assert isinstance(required.pymysql_settings()["ssl"], ssl.SSLContext)
    with pytest.raises(ConfigError, match="does not offer TLS"):
        required.check_tls("")
    required.check_tls("TLS_AES_256_GCM_SHA384")
    assert MysqlUrl.parse("mysql://u@h/?ssl_ca=/ca.pem").ssl_mode == "VERIFY_CA"  # a CA alone means verify
    for url, message in (("mysql://u@h/?ssl-mode=VERIFY_IDENTITY", "needs ssl-ca="),
                         ("mysql://u@h/?ssl-mode=PREFERRED", "may fall back to plain text"),
                         ("mysql://u@h/?ssl-mode=sometimes", "ssl-mode must be one of"),
                         ("mysql://u@h/?sslmode=REQUIRED", "unknown option 'sslmode'"),
                         ("mysql://u@h/?ssl-mode=REQUIRED&ssl-cert=/c.pem", "ssl-cert and ssl-key go together")):
        with pytest.raises(ConfigError, match=message):
            MysqlUrl.parse(url)
    with pytest.raises(ConfigError, match="cannot be used"):
        MysqlUrl.parse(f"mysql://u@h/?ssl-ca={tmp_path}/missing.pem").ssl_context()
    assert "p@" not in str(MysqlUrl.parse("mysql://u:p@h/?ssl-mode=REQUIRED"))


# -- identifiers -----------------------------------------------------------------------------------


def test_quote_doubles_backticks() -> None:
    assert mysql_quote("a`b") == "`a``b`"
    assert mysql_quote("plain") == "`plain`"
    assert mysql_quote("we`ird \"t'.ä*>%$") == "`we``ird \"t'.ä*>%$`"


def test_table_names_given_on_the_command_line() -> None:
    known = {("a.b", "c"), ("a", "x")}
    assert parse_name("a.b.c", known) == ("a.b", "c")
    assert parse_name("a.x", known) == ("a", "x")
    assert parse_name("new.t", known) == ("new", "t")
    assert parse_name("`a.b`.`c`", set()) == ("a.b", "c")
    assert parse_name("`x``y`.z", set()) == ("x`y", "z")
    for bad in ("nodot", "p.q.r", "`a.b"):
        with pytest.raises(ConfigError):
            parse_name(bad, known)


def test_a_printed_name_reads_back() -> None:
    for db, table in (("shop", "orders"), ("t_1 `x.\"ü'*>%$", "we`ird \"t'.ä*>%$"), ("a.b", "c"), ("shop", "x y")):
        assert parse_name(display(db, table), set()) == (db, table)
    assert display("shop", "orders") == "shop.orders"
    assert display("a.b", "c") == "`a.b`.c"

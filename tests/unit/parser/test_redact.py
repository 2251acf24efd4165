"""Credentials in QUERY events are masked; everything else is left as written."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from pymysqlreplication import event as ev

from services.parser.binlog import BinlogReader
from services.parser.redact import ANSI_QUOTES, NO_BACKSLASH_ESCAPES, redact
from services.parser.transactions import Assembler, Resume
from shared import envelope
from shared.mysql import MysqlUrl
from shared.subjects import Names

REDACTED = [
    # CREATE / ALTER USER, both quote styles, mixed case
    ("CREATE USER 'u1'@'%' IDENTIFIED BY 'S3cret'", "CREATE USER 'u1'@'%' IDENTIFIED BY '***'"),
    ('create user "u1"@"%" identified by "S3cret"', 'create user "u1"@"%" identified by \'***\''),
    ("CREATE OR REPLACE USER u1@localhost IdEnTiFiEd By 'S3cret'",
     "CREATE OR REPLACE USER u1@localhost IdEnTiFiEd By '***'"),
    ("ALTER USER 'u1'@'%' IDENTIFIED BY 'S3cret2'", "ALTER USER 'u1'@'%' IDENTIFIED BY '***'"),
    ("CREATE USER u IDENTIFIED BY PASSWORD '*94BDCEBE19083CE2A1F959FD02F964C7AF4CFC29'",
     "CREATE USER u IDENTIFIED BY PASSWORD '***'"),
    ("CREATE USER 'u'@'%' IDENTIFIED WITH 'caching_sha2_password' AS '$A$005$x\\'y' REQUIRE NONE",
     "CREATE USER 'u'@'%' IDENTIFIED WITH 'caching_sha2_password' AS '***' REQUIRE NONE"),
    ("CREATE USER u IDENTIFIED WITH mysql_native_password BY 'S3cret'",
     "CREATE USER u IDENTIFIED WITH mysql_native_password BY '***'"),
    ("CREATE USER u IDENTIFIED WITH caching_sha2_password AS 0x244124303035",
     "CREATE USER u IDENTIFIED WITH caching_sha2_password AS '***'"),
    ("ALTER USER u IDENTIFIED BY 'new' REPLACE 'old' RETAIN CURRENT PASSWORD",
     "ALTER USER u IDENTIFIED BY '***' REPLACE '***' RETAIN CURRENT PASSWORD"),
    # MariaDB IDENTIFIED VIA
    ("CREATE USER u IDENTIFIED VIA ed25519 USING PASSWORD('S3cret') OR unix_socket",
     "CREATE USER u IDENTIFIED VIA ed25519 USING PASSWORD('***') OR unix_socket"),
    ("ALTER USER u IDENTIFIED VIA ed25519 USING 'ZIgUREUg5PVgQ6LskhXmO+eZLS0nC8be6HPjYWR4YJY'",
     "ALTER USER u IDENTIFIED VIA ed25519 USING '***'"),
    ("CREATE USER u IDENTIFIED VIA mysql_native_password USING PASSWORD('a') OR ed25519 USING PASSWORD('b')",
     "CREATE USER u IDENTIFIED VIA mysql_native_password USING PASSWORD('***') OR ed25519 USING PASSWORD('***')"),
    # several users in one statement
    ("CREATE USER 'a'@'%' IDENTIFIED BY 'x1', 'b'@'%', c IDENTIFIED BY \"x2\"",
     "CREATE USER 'a'@'%' IDENTIFIED BY '***', 'b'@'%', c IDENTIFIED BY '***'"),
    # GRANT (MariaDB still accepts IDENTIFIED here)
    ("GRANT SELECT ON *.* TO 'u'@'%' IDENTIFIED BY 'S3cret' WITH GRANT OPTION",
     "GRANT SELECT ON *.* TO 'u'@'%' IDENTIFIED BY '***' WITH GRANT OPTION"),
    # SET PASSWORD in every form
    ("SET PASSWORD FOR 'u1'@'%' = PASSWORD('S3cret3')", "SET PASSWORD FOR 'u1'@'%' = PASSWORD('***')"),
    ("SET PASSWORD = 'S3cret'", "SET PASSWORD = '***'"),
    ("set password for u@localhost = old_password('S3cret')", "set password for u@localhost = old_password('***')"),
    ("SET PASSWORD FOR u = '*94BDCEBE19083CE2A1F959FD02F964C7AF4CFC29'", "SET PASSWORD FOR u = '***'"),
    ("SET PASSWORD TO RANDOM REPLACE 'old'", "SET PASSWORD TO RANDOM REPLACE '***'"),
    # servers and replication
    ("CREATE SERVER s FOREIGN DATA WRAPPER mysql OPTIONS (USER 'r', PASSWORD 'S3cret', HOST 'h', PORT 3306)",
     "CREATE SERVER s FOREIGN DATA WRAPPER mysql OPTIONS (USER 'r', PASSWORD '***', HOST 'h', PORT 3306)"),
    ("ALTER SERVER s OPTIONS (PASSWORD \"S3cret\")", "ALTER SERVER s OPTIONS (PASSWORD '***')"),
    ("CHANGE MASTER TO MASTER_HOST='h', MASTER_USER='r', MASTER_PASSWORD='S3cret', MASTER_PORT=3306",
     "CHANGE MASTER TO MASTER_HOST='h', MASTER_USER='r', MASTER_PASSWORD='***', MASTER_PORT=3306"),
    ("CHANGE REPLICATION SOURCE TO SOURCE_USER = 'r', SOURCE_PASSWORD = 'S3cret' FOR CHANNEL 'c'",
     "CHANGE REPLICATION SOURCE TO SOURCE_USER = 'r', SOURCE_PASSWORD = '***' FOR CHANNEL 'c'"),
    ("START REPLICA USER='r' PASSWORD='S3cret'", "START REPLICA USER='r' PASSWORD='***'"),
    # escapes, prefixes, concatenation
    ("CREATE USER u IDENTIFIED BY 'it''s \\' , x IDENTIFIED BY \\'' REQUIRE NONE",
     "CREATE USER u IDENTIFIED BY '***' REQUIRE NONE"),
    ('CREATE USER u IDENTIFIED BY "say ""hi"" \\" now"', "CREATE USER u IDENTIFIED BY '***'"),
    ("CREATE USER u IDENTIFIED BY _utf8mb4'S3cret' COLLATE utf8mb4_bin",
     "CREATE USER u IDENTIFIED BY '***' COLLATE utf8mb4_bin"),
    ("CREATE USER u IDENTIFIED BY 'S3' 'cret'", "CREATE USER u IDENTIFIED BY '***' '***'"),
    # comments between the words, and the code inside executable comments
    ("CREATE USER u /* who */ IDENTIFIED /* how */ BY -- why\n 'S3cret'",
     "CREATE USER u /* who */ IDENTIFIED /* how */ BY -- why\n '***'"),
    ("CREATE USER u /*!80000 IDENTIFIED BY 'S3cret' */", "CREATE USER u /*!80000 IDENTIFIED BY '***' */"),
    ("CREATE USER u /*M!100100 IDENTIFIED VIA ed25519 USING PASSWORD('S3cret') */",
     "CREATE USER u /*M!100100 IDENTIFIED VIA ed25519 USING PASSWORD('***') */"),
    ("CREATE USER u IDENTIFIED BY /* 'decoy' */ 'S3cret'", "CREATE USER u IDENTIFIED BY /* 'decoy' */ '***'"),
    # a remote server's credentials in FEDERATED / CONNECT / Spider table options
    ("CREATE TABLE t (id INT) ENGINE=FEDERATED CONNECTION='mysql://fed:S3cret@10.0.0.1:3306/db/t'",
     "CREATE TABLE t (id INT) ENGINE=FEDERATED CONNECTION='mysql://fed:***@10.0.0.1:3306/db/t'"),
    ("ALTER TABLE t CONNECTION 'mysql://u:S3cret@h/db/t'", "ALTER TABLE t CONNECTION 'mysql://u:***@h/db/t'"),
    ("CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=MYSQL OPTION_LIST='user=u,password=S3cret'",
     "CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=MYSQL OPTION_LIST='***'"),
    ("CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=ODBC CONNECTION='DSN=erp;UID=u;PWD=S3cret'",
     "CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=ODBC CONNECTION='***'"),
    ("CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=ODBC CONNECTION='Driver={PG};Server=h;Pwd=S3cret;'",
     "CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=ODBC CONNECTION='***'"),
    ("CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=JDBC "
     "CONNECTION='jdbc:postgresql://h/db?user=u&password=S3cret'",
     "CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=JDBC CONNECTION='***'"),
    ("CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=JDBC CONNECTION='jdbc:mysql://u:S3cret@h/db'",
     "CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=JDBC CONNECTION='jdbc:mysql://u:***@h/db'"),
    ("CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=JDBC CONNECTION='jdbc:oracle:thin:scott/S3cret@h:1521:orcl'",
     "CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=JDBC CONNECTION='***'"),
    ("CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=ODBC CONNECTION='DSN=d;Uid=u;Pass=S3cret'",
     "CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=ODBC CONNECTION='***'"),
    ("CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=ODBC CONNECTION='DSN=d;Db_Pwd=S3cret'",
     "CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=ODBC CONNECTION='***'"),
    ("CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=MYSQL OPTION_LIST='user=u,passwd=S3cret'",
     "CREATE TABLE t (id INT) ENGINE=CONNECT TABLE_TYPE=MYSQL OPTION_LIST='***'"),
    ("CREATE TABLE t (id INT) ENGINE=SPIDER COMMENT='wrapper \"mysql\", user \"u\", password \"S3cret\"'",
     "CREATE TABLE t (id INT) ENGINE=SPIDER COMMENT='***'"),
    ("CREATE TABLE t (id INT) ENGINE=SPIDER PARTITION BY HASH (id) (PARTITION p0 COMMENT = "
     "'srv \"s1\", password \"S3cret\"')",
     "CREATE TABLE t (id INT) ENGINE=SPIDER PARTITION BY HASH (id) (PARTITION p0 COMMENT = '***')"),
    # statements in a routine body
    ("CREATE PROCEDURE p() BEGIN CREATE USER u IDENTIFIED BY 'S3cret'; SELECT 'kept'; END",
     "CREATE PROCEDURE p() BEGIN CREATE USER u IDENTIFIED BY '***'; SELECT 'kept'; END"),
]

UNCHANGED = [
    "CREATE TABLE t (id INT PRIMARY KEY, note VARCHAR(40) DEFAULT 'IDENTIFIED BY x', "
    "password VARCHAR(20) DEFAULT 'p', identified INT, c TEXT COMMENT 'SET PASSWORD = ''y''')",
    "ALTER TABLE t ALTER COLUMN password SET DEFAULT 'p', ADD COLUMN master_password CHAR(8) DEFAULT 'm'",
    "INSERT INTO users (name, password) VALUES ('a', 'IDENTIFIED BY x'), ('b', 'PASSWORD(''y'')')",
    "UPDATE users SET password = 'x' WHERE name = 'a'",
    "CREATE VIEW v AS SELECT 'IDENTIFIED BY' AS label, identified FROM t",
    "CREATE USER 'u'@'%'",
    "CREATE USER u IDENTIFIED BY RANDOM PASSWORD",
    "GRANT SELECT ON *.* TO 'u1'@'%'",
    "DROP USER 'u1'@'%'",
    "CREATE TABLE t (a INT) /* IDENTIFIED BY 'comment' */",
    "CREATE TABLE t (id INT) ENGINE=FEDERATED CONNECTION='remote_server/t'",
    "CREATE TABLE connection (id INT COMMENT 'the password column''s twin') COMMENT='plain'",
    "BEGIN",
    "",
]


@pytest.mark.parametrize(("sql", "expected"), REDACTED)
def test_secret_literals_are_masked(sql: str, expected: str) -> None:
    assert redact(sql) == expected


@pytest.mark.parametrize("sql", UNCHANGED)
def test_other_statements_are_unchanged(sql: str) -> None:
    assert redact(sql) == sql


def test_no_backslash_escapes_ends_the_string_at_the_backslash() -> None:
    # Under NO_BACKSLASH_ESCAPES 'a\' is a whole string, so the second password is a literal of its own.
    sql = "CREATE USER a IDENTIFIED BY 'a\\', b IDENTIFIED BY 'S3cret'"
    assert redact(sql, NO_BACKSLASH_ESCAPES) == "CREATE USER a IDENTIFIED BY '***', b IDENTIFIED BY '***'"


def test_ansi_quotes_read_double_quotes_as_names() -> None:
    sql = 'CREATE USER "u\\" IDENTIFIED BY \'S3cret\''
    assert redact(sql, ANSI_QUOTES) == 'CREATE USER "u\\" IDENTIFIED BY \'***\''


def test_unterminated_secret_is_masked_to_the_end() -> None:
    assert redact("CREATE USER u IDENTIFIED BY 'S3cret") == "CREATE USER u IDENTIFIED BY '***'"


def test_binlog_reader_hands_on_query_events_redacted() -> None:
    asm = Assembler("src", Names(), Resume("mysql-bin.000001", 4, "0-1-1"))
    reader = BinlogReader(MysqlUrl.parse("mysql://r:pw@127.0.0.1:3306"), 99, asm, cast(Any, None), mariadb=True)
    event = cast(Any, object.__new__(ev.QueryEvent))
    event.query, event.schema, event.sql_mode = "CREATE USER 'u'@'%' IDENTIFIED BY 'S3cret'", b"shop", 0
    event.packet, event.timestamp = SimpleNamespace(log_pos=300, event_size=100), 1_700_000_000
    (msg,) = reader._handle(event, "mysql-bin.000001")
    assert b"S3cret" not in msg.data and "S3cret" not in repr(msg.headers)
    assert envelope.as_dict(envelope.decode(msg.data))["ddl"] == "CREATE USER 'u'@'%' IDENTIFIED BY '***'"

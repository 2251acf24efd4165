"""The watermark table in the source, and the snapshot's own connection to the source.

Each chunk writes a low and a high watermark into `binlake.watermarks` (configurable); between
two chunks of a table one write is both (mark `B`). The writes are ordinary autocommit
transactions, so they land in the binlog between the changes around them; the parser
recognises them and never publishes them.
One row per (source, slot) is overwritten again and again, so the table stays tiny.
"""

from __future__ import annotations

from typing import Any

import asyncmy
import asyncmy.converters
import asyncmy.errors

from services.parser.snapshot.values import RESULT_CONVERSIONS
from shared.errors import MissingPrivilege, SourceMisconfigured
from shared.mysql import MysqlUrl, binlog_status_sql, map_mysql_error
from shared.mysql import mysql_quote as quote

# Python -> SQL encoders, and as decoders only the numbers asyncmy parses in C: every other
# value arrives as the server's bytes (or str, see `read_unicode`).
CONVERSIONS = {**{k: f for k, f in asyncmy.converters.conversions.items() if not isinstance(k, int)},
               **RESULT_CONVERSIONS}


# Session settings a SELECT's result depends on, pinned whatever the server's defaults are:
# no CHAR padding, backslash escapes (asyncmy's escaping needs them), committed reads only.
_SESSION = (
    "SET character_set_results = NULL, time_zone = '+00:00', sql_mode = 'NO_ENGINE_SUBSTITUTION'",
    "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
)
_NO_STATEMENT_LIMIT = ("SET SESSION max_statement_time = 0", "SET SESSION max_execution_time = 0")  # MariaDB, MySQL


async def connect(dsn: MysqlUrl) -> Any:
    """A connection whose SELECTs return the server's text values: numbers parsed, the rest bytes
    (or UTF-8 text decoded, while `read_unicode` is on; see snapshot.values)."""
    try:
        conn = await asyncmy.connect(**dsn.asyncmy_settings(), autocommit=True, charset="utf8mb4",
                                     use_unicode=False, conv=CONVERSIONS)
    except (asyncmy.errors.MySQLError, OSError) as exc:
        raise map_mysql_error(exc, dsn.address) from exc
    try:
        async with conn.cursor() as cur:
            for sql in _SESSION:
                await cur.execute(sql)
            for sql in _NO_STATEMENT_LIMIT:
                try:
                    await cur.execute(sql)
                except asyncmy.errors.MySQLError:
                    pass  # the other server's variable
    except (asyncmy.errors.MySQLError, OSError) as exc:
        conn.close()
        raise map_mysql_error(exc, dsn.address) from exc
    return conn


def read_unicode(conn: Any, on: bool) -> None:
    """Whether the next SELECT's text values arrive decoded as UTF-8 by asyncmy (in C) instead
    of as bytes: only for tables `snapshot.values.reads_unicode` allows. asyncmy (0.2) reads this
    private flag for each text-protocol result's column descriptions; its prepared statements,
    which this connection does not use, would keep what they saw first."""
    conn._use_unicode = on


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value or "")


class Watermarks:
    """Writes low/high watermarks for one source through a snapshot connection."""

    def __init__(self, table: tuple[str, str], source: str) -> None:
        self.table = table
        self.source = source
        self._name = f"{quote(table[0])}.{quote(table[1])}"

    async def ensure(self, conn: Any) -> None:
        """Create the watermark table if it is missing (only then: DDL lands in the binlog)."""
        db, table = self.table
        try:
            async with conn.cursor() as cur:
                await cur.execute(binlog_status_sql(conn.get_server_info()))
                status = await cur.fetchone()
                self._check_filters(status)
                await cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND "
                                  "TABLE_NAME = %s", (db, table))
                if await cur.fetchone():
                    return
                await cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(db)}")
                await cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._name} (src VARCHAR(190) NOT NULL, slot INT NOT NULL, "
                    "win VARCHAR(100) NOT NULL, mark CHAR(1) NOT NULL, PRIMARY KEY (src, slot)) "
                    "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                )
        except asyncmy.errors.MySQLError as exc:
            raise self._error(exc) from exc

    def _check_filters(self, status: Any) -> None:
        """Refuse a source whose binlog filters would hide the watermarks (the window never closes)."""
        if not status or len(status) < 4:
            return
        names = [_text(x) for x in status[2:4]]
        do_db, ignore_db = ({n.strip().casefold() for n in x.split(",") if n.strip()} for x in names)
        db = self.table[0].casefold()
        if (do_db and db not in do_db) or db in ignore_db:
            raise SourceMisconfigured(
                f"the source's binlog filters (binlog_do_db={names[0]!r}, binlog_ignore_db={names[1]!r}) leave "
                f"the watermark database {self.table[0]!r} out of the binlog; snapshots cannot see their "
                "watermarks: log that database, or set BINLAKE_WATERMARK_TABLE to a logged one"
            )

    async def write(self, conn: Any, slot: int, window_id: str, mark: str) -> None:
        try:
            async with conn.cursor() as cur:
                await cur.execute(
                    f"INSERT INTO {self._name} (src, slot, win, mark) VALUES (%s, %s, %s, %s) "
                    # not VALUES(col): MySQL 8.0.20+ warns on it, MariaDB lacks the row alias
                    "ON DUPLICATE KEY UPDATE win = %s, mark = %s",
                    (self.source, slot, window_id, mark, window_id, mark),
                )
        except asyncmy.errors.MySQLError as exc:
            raise self._error(exc) from exc

    def _error(self, exc: Exception) -> Exception:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
        if code in (1044, 1142, 1227):
            return MissingPrivilege(
                f"snapshots write watermarks into {self.table[0]}.{self.table[1]} and the source user may not "
                f"({exc.args[1] if len(exc.args) > 1 else exc}); "
                f"GRANT CREATE, INSERT, UPDATE ON `{self.table[0]}`.* TO <user>"
            )
        if code in (1290, 1836):  # --read-only / super_read_only, or a replica
            return MissingPrivilege(
                f"the source is read-only ({exc.args[1] if len(exc.args) > 1 else exc}); snapshots write "
                f"watermarks into {self.table[0]}.{self.table[1]}: point BINLAKE_SOURCE_URL at the primary"
            )
        return map_mysql_error(exc, "snapshot watermark")

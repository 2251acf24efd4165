"""MySQL/MariaDB connections: the `mysql://` URL, connection settings, and what an error means.

One parser for every URL binlake takes (the source, meta's MySQL backend, `binlake verify`,
the demo), and one translation of server error codes into typed errors that say what to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql

from shared.errors import (
    AccessDenied,
    BinlakeError,
    BinlogPurged,
    ConfigError,
    DecodeError,
    MissingPrivilege,
    SourceUnavailable,
)

CONNECT_TIMEOUT_S = 10


@dataclass(frozen=True)
class MysqlUrl:
    """`mysql://user:password@host:3306[/database]` (`mariadb://` too; user and password URL-quoted)."""

    host: str
    port: int
    user: str
    password: str
    database: str = ""

    @classmethod
    def parse(cls, url: str, what: str = "source URL", *, need_database: bool = False) -> MysqlUrl:
        form = "mysql://user:password@host:3306" + ("/database" if need_database else "")
        try:
            parts = urlsplit(url)
            port = parts.port or 3306
        except ValueError as exc:  # a port that is not a number
            raise ConfigError(f"{what} must look like {form}: {exc}") from None
        if parts.scheme not in ("mysql", "mariadb") or not parts.hostname:
            raise ConfigError(f"{what} must look like {form}, got scheme {parts.scheme!r}")
        database = parts.path.strip("/")
        if need_database and not database:
            raise ConfigError(f"{what} must look like {form}: the database is missing")
        return cls(host=parts.hostname, port=port, user=unquote(parts.username or "root"),
                   password=unquote(parts.password or ""), database=database)

    def __str__(self) -> str:
        """The URL without its password (for logs and messages)."""
        db = f"/{self.database}" if self.database else ""
        return f"mysql://{self.user}@{self.host}:{self.port}{db}"

    def pymysql_settings(self) -> dict[str, Any]:
        """Keyword arguments of `pymysql.connect` (and mysql-replication's connection settings)."""
        out: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user, "password": self.password,
                               "connect_timeout": CONNECT_TIMEOUT_S}
        if self.database:
            out["database"] = self.database
        return out

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def asyncmy_settings(self) -> dict[str, Any]:
        """Keyword arguments of `asyncmy.connect` / `asyncmy.create_pool`."""
        out: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user, "password": self.password,
                               "connect_timeout": CONNECT_TIMEOUT_S}
        if self.database:
            out["database"] = self.database
        return out


def map_mysql_error(exc: Exception, where: str) -> BinlakeError:
    """Translate a pymysql/asyncmy error into the binlake error that tells the operator what to do."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    if code == 1236:
        return BinlogPurged(
            f"the source cannot stream from {where}: {text}. The binlogs holding that position are gone; "
            "take a new snapshot and reset the parser (delete its raw stream data) to continue"
        )
    if code == 1045:
        return AccessDenied(f"access denied for the source user ({text}); check user and password in the source URL")
    if code in (1227, 1044, 1142, 1143):
        return MissingPrivilege(
            f"the source user lacks a privilege ({text}); GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO it"
        )
    if code in (2003, 2005, 2006, 2013, 2055) or isinstance(exc, (OSError, pymysql.err.InterfaceError)):
        return SourceUnavailable(f"source unreachable or gone away ({text})")
    return DecodeError(f"binlog stream failed at {where}: {exc!r}")


# -- statements that differ between server versions -----------------------------------------

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def server_version(version: str) -> tuple[bool, tuple[int, int, int]]:
    """(MariaDB?, (major, minor, patch)) of a `version` string or a handshake's server version.

    MariaDB before 11 announces itself as `5.5.5-10.11.6-MariaDB...` in the handshake: the
    real version is the one after that prefix.
    """
    mariadb = "mariadb" in version.lower()
    text = version[len("5.5.5-"):] if mariadb and version.startswith("5.5.5-") else version
    found = _VERSION.search(text)
    if found is None:
        raise ConfigError(f"cannot read the server version from {version!r}")
    return mariadb, (int(found[1]), int(found[2]), int(found[3]))


def binlog_status_sql(version: str) -> str:
    """The statement that shows the binlog file and position being written on this server.

    MySQL 8.4 removed SHOW MASTER STATUS (SHOW BINARY LOG STATUS exists since 8.2);
    MariaDB calls it SHOW BINLOG STATUS since 10.5.2 and keeps the old name too.
    """
    mariadb, v = server_version(version)
    if mariadb:
        return "SHOW BINLOG STATUS" if v >= (10, 5, 2) else "SHOW MASTER STATUS"
    return "SHOW BINARY LOG STATUS" if v >= (8, 2, 0) else "SHOW MASTER STATUS"

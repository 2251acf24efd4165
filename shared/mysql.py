"""MySQL/MariaDB connections: the `mysql://` URL, connection settings, and what an error means.

One parser for every URL binlake takes (the source, meta's MySQL backend, `binlake verify`,
the demo), one translation of server error codes into typed errors that say what to do, and
the one quoting of identifiers (`mysql_quote`) with the `db.table` form the commands print
(`display`) and take (`parse_name`).

TLS is set in the URL's query, with the MySQL clients' option names:
`mysql://u:pw@db:3306/?ssl-mode=VERIFY_CA&ssl-ca=/ca.pem[&ssl-cert=...&ssl-key=...]`.
`ssl-mode` is DISABLED (the default without `ssl-ca`), REQUIRED (TLS or no connection;
encrypted but not verified unless `ssl-ca` is given), VERIFY_CA (the default with `ssl-ca`) or
VERIFY_IDENTITY (the certificate must also name the host). PREFERRED is refused: the async
driver cannot fall back to a plain connection, and a setting that silently may not encrypt
is not one to rely on.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

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

MAX_IDENTIFIER = 64  # characters of a database, table or column name (MySQL and MariaDB)

CONNECT_TIMEOUT_S = 10


SSL_MODES = ("DISABLED", "REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY")
_SSL_KEYS = {"ssl-mode": "ssl_mode", "ssl-ca": "ssl_ca", "ssl-cert": "ssl_cert", "ssl-key": "ssl_key"}


@dataclass(frozen=True)
class MysqlUrl:
    """`mysql://user:password@host:3306[/database][?ssl-mode=...]` (`mariadb://` too; user and
    password URL-quoted)."""

    host: str
    port: int
    user: str
    password: str
    database: str = ""
    ssl_mode: str = "DISABLED"
    ssl_ca: str = ""
    ssl_cert: str = ""
    ssl_key: str = ""

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
        tls: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            name = _SSL_KEYS.get(key.lower().replace("_", "-"))
            if name is None:
                raise ConfigError(f"{what}: unknown option {key!r}; it takes {', '.join(_SSL_KEYS)}")
            tls[name] = value
        mode = tls.pop("ssl_mode", "").upper() or ("VERIFY_CA" if tls.get("ssl_ca") else "DISABLED")
        if mode == "PREFERRED":
            raise ConfigError(f"{what}: ssl-mode=PREFERRED may fall back to plain text; say REQUIRED (or VERIFY_CA "
                              "with ssl-ca=...) for TLS, DISABLED for none")
        if mode not in SSL_MODES:
            raise ConfigError(f"{what}: ssl-mode must be one of {', '.join(SSL_MODES)}, got {mode!r}")
        if mode.startswith("VERIFY") and not tls.get("ssl_ca"):
            raise ConfigError(f"{what}: ssl-mode={mode} needs ssl-ca=<the CA file that signed the server certificate>")
        if bool(tls.get("ssl_cert")) != bool(tls.get("ssl_key")):
            raise ConfigError(f"{what}: ssl-cert and ssl-key go together")
        return cls(host=parts.hostname, port=port, user=unquote(parts.username or "root"),
                   password=unquote(parts.password or ""), database=database, ssl_mode=mode, **tls)

    def __str__(self) -> str:
        """The URL without its password (for logs and messages)."""
        db = f"/{self.database}" if self.database else ""
        return f"mysql://{self.user}@{self.host}:{self.port}{db}"

    @property
    def tls_required(self) -> bool:
        return self.ssl_mode != "DISABLED"

    def ssl_context(self) -> ssl.SSLContext | None:
        """What both drivers take as `ssl`."""
        if self.ssl_mode == "DISABLED":
            return None
        try:
            ctx = ssl.create_default_context(cafile=self.ssl_ca or None)
            if self.ssl_mode == "REQUIRED" and not self.ssl_ca:
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # encrypted, not verified
            else:
                ctx.check_hostname = self.ssl_mode == "VERIFY_IDENTITY"
            if self.ssl_cert:
                ctx.load_cert_chain(self.ssl_cert, self.ssl_key)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"TLS settings of {self} cannot be used (ssl-ca / ssl-cert / ssl-key): {exc}") from None
        return ctx

    def check_tls(self, cipher: str | bytes | None) -> None:
        """After connecting: refuse a plain connection when the URL demands TLS."""
        if self.tls_required and not cipher:
            raise ConfigError(f"{self} does not offer TLS, but the URL says ssl-mode={self.ssl_mode}: configure "
                              "TLS on the server (ssl_cert, ssl_key) or lower ssl-mode")

    def pymysql_settings(self) -> dict[str, Any]:
        """Keyword arguments of `pymysql.connect` (and mysql-replication's connection settings)."""
        out: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user, "password": self.password,
                               "connect_timeout": CONNECT_TIMEOUT_S}
        if self.database:
            out["database"] = self.database
        if (ctx := self.ssl_context()) is not None:
            out["ssl"] = ctx
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
        if (ctx := self.ssl_context()) is not None:
            out["ssl"] = ctx
        return out


TLS_CIPHER_SQL = "SHOW SESSION STATUS LIKE 'Ssl_cipher'"


def map_mysql_error(exc: Exception, where: str) -> BinlakeError:
    """Translate a pymysql/asyncmy error into the binlake error that tells the operator what to do."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    if code == 1236:
        return BinlogPurged(
            f"the source cannot stream from {where}: {text}. The binlogs holding that position are gone; "
            "take a new snapshot and reset the parser (delete its raw stream data) to continue"
        )
    if "[SSL" in text or "CERTIFICATE_VERIFY_FAILED" in text:
        return ConfigError(f"TLS with the source failed ({text}): is TLS on in the server (SHOW VARIABLES LIKE "
                           "'have_ssl') and did ssl-ca sign its certificate? Fix the server or the ssl-* options of "
                           "the source URL")
    if code == 3159 or "insecure transport" in text.lower():
        return ConfigError(f"the source only accepts TLS connections ({text}); add ?ssl-mode=REQUIRED, or "
                           "ssl-mode=VERIFY_CA&ssl-ca=<CA file>, to the source URL")
    if code == 1045:
        return AccessDenied(f"access denied for the source user ({text}); check user and password in the source URL "
                            "(MariaDB answers the same when require_secure_transport=ON and the connection has no "
                            "TLS: then add ?ssl-mode=REQUIRED, or ssl-ca=<CA file>, to the URL)")
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


# -- identifiers -----------------------------------------------------------------------------------

_QUOTED = r"`((?:[^`]|``)*)`"


def mysql_quote(ident: str) -> str:
    """A MySQL identifier in backticks (backticks doubled)."""
    return "`" + ident.replace("`", "``") + "`"


def display(db: str, table: str) -> str:
    """`db.table` as the commands print it (a part that is not a plain word in backticks)."""
    return ".".join(p if re.fullmatch(r"\w+", p) else mysql_quote(p) for p in (db, table))


def parse_name(text: str, known: set[tuple[str, str]]) -> tuple[str, str]:
    """`db.table` -> (db, table); backticks quote a part, a dot inside an unquoted name must be known.

    :param known: the (db, table) pairs that exist, to split `a.b.c` where only one split names one
    """
    if "`" in text:
        part = rf"(?:{_QUOTED}|([^.`]+))"
        m = re.fullmatch(rf"{part}\.{part}", text)
        if m is None:
            raise ConfigError(f"{text!r}: give a table as db.table, a part with a backtick or dot in `backticks`")
        db_quoted, db, table_quoted, table = m.groups()
        return (db if db_quoted is None else db_quoted.replace("``", "`"),
                table if table_quoted is None else table_quoted.replace("``", "`"))
    splits = [(text[:i], text[i + 1:]) for i, ch in enumerate(text) if ch == "."]
    matches = [s for s in splits if s in known]
    if len(matches) == 1 or (len(splits) == 1 and not matches):
        return (matches or splits)[0]
    if not splits:
        raise ConfigError(f"{text!r}: give a table as db.table")
    raise ConfigError(f"{text!r} is ambiguous: put the database and table names in `backticks`")

"""The logins of `binlake up`'s source: root's generated password, the `binlake` user the services
and `binlake verify` connect as, and the owner-only files that hand them out.

Under the data directory, each 0600 (directories 0700):

- `source-users/root`, `source-users/binlake`: the private server's passwords, made on first use
  and kept across runs (root's is set on the server's first start, `servers.start_mariadb`);
- `source-url`: the source URL of this data directory, the one place it is kept: the children
  read it (BINLAKE_SOURCE_URL_FILE), `binlake verify` finds it there. The user's own URL
  (`--source-url`), else the `binlake` user's on the private server;
- `my.cnf`: a client option file logging in to the private server as root
  (`mariadb --defaults-file=<data>/my.cnf`), so no password goes on a command line.

The `binlake` user has what capture, snapshots and verify use and nothing more: the binlog
(REPLICATION SLAVE), positions and the binlog list (REPLICATION CLIENT, MariaDB's BINLOG
MONITOR), reading tables (SELECT), and writing the snapshot watermarks in their own database
(CREATE, INSERT, UPDATE). Snapshots and verify read in a consistent-snapshot transaction:
no RELOAD, no LOCK TABLES.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.launcher import login
from services.launcher.servers import MariaDB
from services.parser.config import ParserConfig
from shared import config
from shared.mysql import mysql_quote

ROOT = "root"
USER = "binlake"
HOST = "127.0.0.1"  # the private server listens there only; MariaDB runs with skip-name-resolve


def password_file(data: Path, user: str) -> Path:
    return data / "source-users" / user


def password(data: Path, user: str) -> str:
    """A private-server user's password, made on first use."""
    return login.secret(password_file(data, user))


def url_file(data: Path) -> Path:
    return data / "source-url"


def option_file(data: Path) -> Path:
    return data / "my.cnf"


def recorded_url(data: Path) -> str:
    """The source URL `binlake up` recorded for this data directory ("" if none)."""
    try:
        return url_file(data).read_text().strip()
    except OSError:
        return ""


def record_url(data: Path, url: str) -> Path:
    login.write_private(url_file(data), url + "\n")
    return url_file(data)


@dataclass(frozen=True)
class _Snapshots:
    """The one parser setting the user's privileges depend on (read as the parser reads it)."""

    watermark_table: str = ParserConfig.watermark_table


def grants(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The `binlake` user's privileges (`ON ...` clauses), the watermarks' database as the parser will have it."""
    db = config.load(_Snapshots, "parser", env).watermark_table.partition(".")[0]
    return ("REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.*", f"CREATE, INSERT, UPDATE ON {mysql_quote(db)}.*")


def create_user(server: MariaDB, data: Path, env: Mapping[str, str] | None = None) -> str:
    """Create the `binlake` user, or bring its password and privileges up to date; its URL.

    Neither statement reaches the binlog (the parser would read a password in it)."""
    secret = password(data, USER)
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute("CREATE USER IF NOT EXISTS %s@%s IDENTIFIED BY %s", (USER, HOST, secret))
            cur.execute("ALTER USER %s@%s IDENTIFIED BY %s", (USER, HOST, secret))
            for grant in grants(env):
                cur.execute(f"GRANT {grant} TO %s@%s", (USER, HOST))
    finally:
        conn.close()
    return server.dsn(USER, secret)


def write_option_file(data: Path, server: MariaDB) -> Path:
    """`[client]` settings logging in to the private server as root, for `mariadb`/`mysql --defaults-file`."""
    path = option_file(data)
    login.write_private(path, f"[client]\nhost={server.host}\nport={server.port}\nuser={ROOT}\n"
                              f"password={server.root_password}\n")
    return path


def client_command(data: Path, server: MariaDB) -> str:
    """How the operator logs in to the private server as root."""
    return f"{'mysql' if server.kind == 'mysql' else 'mariadb'} --defaults-file={option_file(data)}"

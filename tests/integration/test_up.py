"""`binlake up` end to end: one command runs the stack; Ctrl-C stops it; a restart continues;
its secrets stay in owner-only files, and binlake reads the source with the least privileges."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pymysql
import pytest

from services.launcher import login, source
from services.launcher.processes import ROOT, clean_env
from shared import permissions
from shared.mysql import MysqlUrl
from tests.integration.support import assert_nats_refuses_anonymous, wait_until
from tests.servers import require_mysql


def _env(data: Path) -> dict[str, str]:
    env = clean_env()
    env["BINLAKE_DATA_DIR"] = str(data)
    env["BINLAKE_NATS_MAX_STORE"] = "3G"
    return env


def _source_port(data: Path) -> int:
    """The port of the private MariaDB or MySQL that `binlake up` recorded."""
    ports = json.loads((data / "ports.json").read_text())
    return int(ports.get("mariadb") or ports["mysql"])


def _children(pid: int) -> set[int]:
    """Every live descendant of `pid`."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    parents: dict[int, list[int]] = {}
    for line in out.splitlines():
        child, parent = (int(x) for x in line.split())
        parents.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for c in parents.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _start(data: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "services.launcher", *args], cwd=ROOT, env=_env(data),
                                stdout=out, stderr=subprocess.STDOUT)


def _secret(path: Path) -> str:
    return path.read_text().strip()


def _mysql(data: Path) -> pymysql.Connection:
    """root on the private server, with the password `binlake up` generated."""
    return pymysql.connect(host="127.0.0.1", port=_source_port(data), user="root", autocommit=True,
                           password=_secret(source.password_file(data, source.ROOT)))


def _cli(data: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """A `binlake` command on the data directory; `verify` reads the source as `up` recorded it (binlake's user)."""
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=ROOT, env=_env(data),
                          capture_output=True, text=True, timeout=timeout)


def _assert_nats_wants_the_login(data: Path, output: str) -> None:
    """NATS refuses connections without a generated login; each role's password is only in a 0600 file."""
    users = data / "nats-users"
    assert users.stat().st_mode & 0o777 == 0o700 and (data / "nats-login.conf").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in users.iterdir()) == sorted(permissions.ROLES)
    for secret in users.iterdir():
        assert secret.stat().st_mode & 0o777 == 0o600
        assert secret.read_text().strip() not in output, f"the banner or a log printed the {secret.name} password"
    assert_nats_refuses_anonymous(json.loads((data / "ports.json").read_text())["nats"])


def _secrets(data: Path) -> dict[str, str]:
    """Every password `binlake up` generated, by file name."""
    files = [*(data / "nats-users").iterdir(), *(data / "source-users").iterdir()]
    return {f"{f.parent.name}/{f.name}": _secret(f) for f in files}


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return {}  # gone meanwhile
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if item)


def _assert_children_get_files_not_secrets(data: Path, up_pid: int) -> None:
    """No child of `up` (services, servers, JVMs) has a password, or the source URL, in its environment."""
    secrets = _secrets(data)
    services = 0
    for pid in _children(up_pid):
        env = _environ(pid)
        assert "BINLAKE_SOURCE_URL" not in env, f"pid {pid} has the source URL in its environment"
        leaked = [name for name, secret in secrets.items() if any(secret in v for v in env.values())]
        assert not leaked, f"pid {pid} has the {leaked} password in its environment"
        if "BINLAKE_SOURCE_URL_FILE" in env:
            assert env["BINLAKE_SOURCE_URL_FILE"] == str(source.url_file(data))
            assert env["BINLAKE_NATS_PASSWORD_FILE"].startswith(str(data / "nats-users"))
            services += 1
    assert services >= 6  # meta, store, parser, 2 sinks, loader


def _assert_source_logins(data: Path, flavour: str) -> None:
    """root wants the generated password (the option file has it); binlake's user may capture and read, not write."""
    with pytest.raises(pymysql.err.OperationalError) as refused:
        pymysql.connect(host="127.0.0.1", port=_source_port(data), user="root")
    assert refused.value.args[0] == 1045
    if flavour == "mariadb" and shutil.which("mariadb"):
        who = subprocess.run(["mariadb", f"--defaults-file={source.option_file(data)}", "-N", "-e",
                              "SELECT CURRENT_USER()"], capture_output=True, text=True, timeout=30)
        assert who.stdout.strip().startswith("root@"), who.stderr
    url = source.recorded_url(data)
    assert MysqlUrl.parse(url).user == source.USER
    conn = pymysql.connect(**MysqlUrl.parse(url).pymysql_settings(), autocommit=True)
    with conn.cursor() as cur:
        cur.execute("SHOW GRANTS")
        grants = " ".join(str(r[0]) for r in cur.fetchall()).upper()
        assert "ALL PRIVILEGES" not in grants and "SUPER" not in grants and "DELETE" not in grants, grants
        for sql, code in [("INSERT INTO demo.items VALUES (9999, 'x', 1)", 1142), ("DROP TABLE demo.items", 1142),
                          ("CREATE USER intruder", 1227), ("SET GLOBAL binlog_format = 'STATEMENT'", 1227)]:
            with pytest.raises(pymysql.err.MySQLError) as denied:
                cur.execute(sql)
            assert denied.value.args[0] == code, (sql, denied.value.args)
    conn.close()


async def _context_works(ctx: dict[str, str]) -> bool:
    """The `nats --context` file's login reaches JetStream as the admin."""
    nc = await nats.connect(ctx["url"], user=ctx["user"], password=ctx["password"], allow_reconnect=False)
    try:
        return (await nc.jetstream().stream_info("BINLAKE_CDC")).config.name == "BINLAKE_CDC"
    finally:
        await nc.close()


# What MySQL makes readable to all on purpose, whatever the umask: its certificates and public key.
_PUBLIC = {"ca.pem", "server-cert.pem", "client-cert.pem", "public_key.pem"}


def _assert_owner_only(data: Path) -> None:
    """The data directory, the secrets in it and everything the servers, services and Spark wrote there (the
    lake too) are the owner's alone: no one else may read or write them (MySQL's InnoDB directories are 0710)."""
    assert data.stat().st_mode & 0o777 == 0o700
    for path in (source.url_file(data), source.option_file(data), login.context_file(data), data / "ports.json",
                 *(data / "source-users").iterdir()):
        assert path.stat().st_mode & 0o777 == 0o600, path
    wider, lake = [], 0
    for path in data.rglob("*"):
        mode = path.lstat().st_mode
        if stat.S_ISSOCK(mode) or stat.S_ISLNK(mode) or path.name in _PUBLIC:
            continue  # the server's socket file: in a 0700 directory, like everything else here
        lake += path.suffix == ".parquet"
        if mode & 0o066:
            wider.append(f"{oct(mode & 0o777)} {path.relative_to(data)}")
    assert lake and not wider, f"{lake} lake files; not owner-only: {wider[:20]}"


def _loaded(data: Path) -> bool:
    """Has the loader acked everything BINLAKE_CDC holds? (`status`, cheap: `verify` starts a JVM)"""
    status = _cli(data, "status", "--json", timeout=60)
    if status.returncode != 0:
        return False
    s = json.loads(status.stdout)
    acked, cdc = (s["clients"].get("loader") or {}).get("acked"), s["streams"].get("BINLAKE_CDC")
    return isinstance(acked, int) and cdc is not None and acked >= cdc["last_seq"]


def _verified(data: Path, table: str, polls: Iterator[int]) -> bool:
    if next(polls) % 10 and not _loaded(data):  # every 10th poll verifies anyway (heartbeats may keep the edge moving)
        return False
    result = _cli(data, "verify", table)
    if result.returncode == 0 and f"OK    {table}" in result.stdout:
        return True
    # Left for the failure message: what verify said and what the stack logged last.
    (data.parent / "last-verify.txt").write_text(f"{result.stdout}\n{result.stderr[-4000:]}")
    return False


def _wait_verified(data: Path, log: Path, table: str, what: str) -> None:
    try:
        polls = itertools.count(1)
        wait_until(lambda: _verified(data, table, polls), 600, what, interval=2)
    except AssertionError as exc:
        said = (data.parent / "last-verify.txt").read_text() if (data.parent / "last-verify.txt").exists() else ""
        lines = [ln for ln in log.read_text().splitlines() if "[loader]" in ln or "error" in ln.lower()]
        raise AssertionError(f"{exc}\nverify said:\n{said}\nloader log:\n" + "\n".join(lines[-60:])) from None


@pytest.mark.timeout(900)
@pytest.mark.parametrize("flavour", ["mariadb", "mysql"])
def test_up_runs_the_stack_stops_on_sigint_and_continues(tmp_path, flavour):
    """`binlake up` on its private MariaDB, and with `--source mysql` on a private MySQL 9.7."""
    if flavour == "mysql":
        require_mysql()
    data = tmp_path / "binlake"
    log = tmp_path / "up.log"
    up = _start(data, log, "--source", flavour)
    try:
        wait_until(lambda: "binlake is up" in log.read_text() or up.poll() is not None, 120, "the banner")
        assert up.poll() is None, log.read_text()
        wait_until(lambda: '"lease.acquired"' in log.read_text(), 60, "the parser to start")
        _assert_nats_wants_the_login(data, log.read_text())
        assert "JetStream keeps up to 3.0 GiB" in log.read_text()
        assert "Max Storage:     3.00 GB" in (data / "nats" / "nats-server.log").read_text()
        conn = _mysql(data)
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE demo")
            cur.execute("CREATE TABLE demo.items (id INT PRIMARY KEY, name VARCHAR(20), price DECIMAL(8,2))")
            cur.executemany("INSERT INTO demo.items VALUES (%s, %s, %s)",
                            [(i, f"item {i}", i * 1.5) for i in range(100)])
        _wait_verified(data, log, "demo.items", "demo.items in the lake")
        _assert_children_get_files_not_secrets(data, up.pid)
        _assert_source_logins(data, flavour)
        output = log.read_text()
        assert f"nats --context {login.context_file(data)} stream info BINLAKE_CDC" in output
        assert f"{'mariadb' if flavour == 'mariadb' else 'mysql'} --defaults-file={source.option_file(data)}" in output
        assert not [name for name, secret in _secrets(data).items() if secret in output]
        context = json.loads(login.context_file(data).read_text())
        assert context["user"] == login.ADMIN and asyncio.run(_context_works(context))

        status = _cli(data, "status", timeout=60)
        assert status.returncode == 0, status.stderr
        binlog = "mysql-bin." if flavour == "mariadb" else "binlog."
        assert f"parser    {binlog}" in status.stdout and "BINLAKE_CDC:" in status.stdout
        assert "    up-sink-" in status.stdout and "loader: acked=" in status.stdout and "CDC → loader" in status.stdout
        tail = _cli(data, "tail", "demo.items", "--no-follow", "-n", "3", timeout=60)
        assert tail.returncode == 0, tail.stderr
        events = [json.loads(line) for line in tail.stdout.splitlines()]
        assert [e["op"] for e in events] == ["ddl", "i"]  # executemany sends one multi-row INSERT
        assert events[1]["rows"][0]["after"] == {"id": 0, "name": "item 0", "price": "0.00"}
        snapshot = _cli(data, "snapshot", "demo.items", timeout=120)  # as binlake's user: reads, writes watermarks
        assert snapshot.returncode == 0, snapshot.stdout + snapshot.stderr

        children = _children(up.pid)
        assert len(children) >= 7  # nats, mariadb, meta, store, parser, 2 sinks, loader (+ their JVM)
        up.send_signal(signal.SIGINT)
        assert up.wait(120) == 0, log.read_text()[-3000:]
        time.sleep(1)
        assert [p for p in children if _alive(p)] == [], "every child must be gone"

        up = _start(data, log, "--source", flavour)  # the second run continues where the first stopped
        wait_until(lambda: log.read_text().count("binlake is up") == 2, 120, "the second banner")
        conn = _mysql(data)
        with conn.cursor() as cur:
            cur.execute("UPDATE demo.items SET price = price * 2 WHERE id < 50")
            cur.execute("DELETE FROM demo.items WHERE id >= 90")
            cur.execute("INSERT INTO demo.items VALUES (1000, 'new', 1.00)")
        _wait_verified(data, log, "demo.items", "the changes of the second run")
        _assert_owner_only(data)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(120)
            except subprocess.TimeoutExpired:
                up.kill()


def test_a_private_source_whose_root_has_another_password_is_refused(tmp_path: Path) -> None:
    """A data directory whose server root has not the stored password (an earlier binlake's: none): one clear line."""
    from services.launcher.app import start_private_source
    from services.launcher.config import LauncherConfig
    from shared.errors import ConfigError

    cfg, data = LauncherConfig(mariadb_port=0), tmp_path / "binlake"  # (`prepare` would set this process's umask)
    data.mkdir()
    server, _ = start_private_source(cfg, data, {})
    server.stop()
    source.password_file(data, source.ROOT).write_text("not-the-one\n")
    with pytest.raises(ConfigError, match="refuses root's password") as refused:
        start_private_source(cfg, data, {})
    assert str(source.password_file(data, source.ROOT)) in str(refused.value) and "move" in str(refused.value)
    assert "not-the-one" not in str(refused.value)


@pytest.mark.parametrize("flavour", ["mariadb", "mysql"])
def test_no_one_logs_in_as_root_without_the_password_while_a_fresh_server_starts(tmp_path: Path,
                                                                                 flavour: str) -> None:
    """Root's password comes from an init file the first start runs before it accepts a connection:
    a local user polling the port the whole time never gets in as root without it."""
    import threading

    from services.launcher.servers import free_port, start_mariadb, start_mysql

    if flavour == "mysql":
        require_mysql()
    port, secret, stop, got_in = free_port(), "S3cret-root_pw", threading.Event(), []

    def attacker() -> None:
        while not stop.is_set():
            try:
                pymysql.connect(host="127.0.0.1", port=port, user="root", password="", connect_timeout=1).close()
                got_in.append(True)
            except pymysql.err.MySQLError:
                time.sleep(0.005)

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    start = start_mysql if flavour == "mysql" else start_mariadb
    server = start(tmp_path / flavour, port=port, root_password=secret)
    try:
        time.sleep(0.5)
        stop.set()
        thread.join()
        assert got_in == [], "root logged in without a password during the first start"
        assert server.query("SELECT 1") == [(1,)]  # as root, with the password
        assert not list(tmp_path.rglob("root-password.sql")) and not [a for a in server.args if "init-file" in a]
        assert secret not in "".join(p.read_text(errors="replace") for p in (tmp_path / flavour).glob("data/*bin*.0*"))
        server.stop()
        server.start()  # a later start logs in with it and runs nothing again
        assert server.query("SELECT 1") == [(1,)]
    finally:
        stop.set()
        server.stop()

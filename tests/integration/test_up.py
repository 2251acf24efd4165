"""`binlake up` end to end: one command runs the stack; Ctrl-C stops it; a restart continues."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from services.launcher.processes import ROOT, clean_env
from shared import permissions
from tests.integration.support import assert_nats_refuses_anonymous, wait_until
from tests.servers import require_mysql


def _env(data: Path) -> dict[str, str]:
    env = clean_env()
    env["BINLAKE_DATA_DIR"] = str(data)
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


def _mysql(data: Path) -> pymysql.Connection:
    return pymysql.connect(host="127.0.0.1", port=_source_port(data), user="root", autocommit=True)


def _cli(data: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = _env(data)
    env["BINLAKE_SOURCE_URL"] = f"mysql://root@127.0.0.1:{_source_port(data)}"
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _assert_nats_wants_the_login(data: Path, output: str) -> None:
    """NATS refuses connections without a generated login; each role's password is only in a 0600 file."""
    users = data / "nats-users"
    assert users.stat().st_mode & 0o777 == 0o700 and (data / "nats-login.conf").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in users.iterdir()) == sorted(permissions.ROLES)
    for secret in users.iterdir():
        assert secret.stat().st_mode & 0o777 == 0o600
        assert secret.read_text().strip() not in output, f"the banner or a log printed the {secret.name} password"
    assert_nats_refuses_anonymous(json.loads((data / "ports.json").read_text())["nats"])


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
        conn = _mysql(data)
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE demo")
            cur.execute("CREATE TABLE demo.items (id INT PRIMARY KEY, name VARCHAR(20), price DECIMAL(8,2))")
            cur.executemany("INSERT INTO demo.items VALUES (%s, %s, %s)",
                            [(i, f"item {i}", i * 1.5) for i in range(100)])
        _wait_verified(data, log, "demo.items", "demo.items in the lake")

        status = _cli(data, "status", timeout=60)
        assert status.returncode == 0, status.stderr
        binlog = "mysql-bin." if flavour == "mariadb" else "binlog."
        assert f"parser    {binlog}" in status.stdout and "BINLAKE_CDC:" in status.stdout
        assert "owner=up-sink-" in status.stdout and "loader: acked=" in status.stdout
        tail = _cli(data, "tail", "demo.items", "--no-follow", "-n", "3", timeout=60)
        assert tail.returncode == 0, tail.stderr
        events = [json.loads(line) for line in tail.stdout.splitlines()]
        assert [e["op"] for e in events] == ["ddl", "i"]  # executemany sends one multi-row INSERT
        assert events[1]["rows"][0]["after"] == {"id": 0, "name": "item 0", "price": "0.00"}

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
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(120)
            except subprocess.TimeoutExpired:
                up.kill()

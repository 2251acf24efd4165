"""`docker compose up` for real: the project's own compose file on a private Docker engine.

The engine, its base image, the MySQL 9.7 image (from the prepared MySQL root) and the
stand-ins for the NATS images are built first (see engine.py); then, with
deploy/docker-compose.yml unchanged (only its host ports moved off the machine's own MySQL and
NATS through the documented variables, and the tests' JVM options added: Engine.jvm_options):
`up --build --wait`, a workload, `binlake verify` OK from inside the stack, `--scale sink=3`
spreads the partitions over three workers, a kill -9 of the parser's process is restarted by
Docker and nothing is lost or doubled, `down` then `up` continues where it stopped.

Runs where the machine allows it (root, dockerd, mmdebstrap: `.ci/run` installs them on
Debian, and prepares the MySQL root with `binlake setup mysql`); about 7 minutes, most of it
building images.
"""

from __future__ import annotations

import itertools
import json
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pymysql
import pytest

from shared import permissions
from shared.config import NatsSettings
from tests.compose.engine import Engine, missing_tools
from tests.integration.support import (
    assert_nats_refuses_anonymous,
    assert_spark_intruder_refused,
    assert_table_order,
    read_stream_sync,
    spark_intruder_script,
    wait_until,
)
from tests.servers import free_port, mysql_root, nats_server_binary

pytestmark = [
    pytest.mark.timeout(2700),
    pytest.mark.skipif(bool(missing_tools()), reason=f"needs {', '.join(missing_tools())} (see docs/docker.md)"),
]

PARTITIONS = 16  # the services' default BINLAKE_PARTITIONS
PASSWORD_VARIABLES = ("MYSQL_ROOT_PASSWORD", "BINLAKE_SOURCE_PASSWORD", "BINLAKE_ROUTE_PASSWORD",
                      "BINLAKE_SPARK_SECRET", "BINLAKE_GRAFANA_PASSWORD",
                      *(f"BINLAKE_{role.upper()}_PASSWORD" for role in permissions.ROLES))  # deploy/make-env.sh's
SPARK_SERVICES = ("spark-master", "spark-worker-1", "spark-worker-2")


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    try:
        root = mysql_root()
    except FileNotFoundError as exc:
        pytest.skip(f"MySQL not available: {exc}")
    home = Path(tempfile.mkdtemp(prefix="blk-docker-", dir="/tmp"))  # short: unix socket paths
    eng = Engine(home)
    try:
        eng.start()
        eng.prepare(Path(nats_server_binary()), root)
        yield eng
    except BaseException:
        print("\n".join(eng.log), "\n", eng.dockerd_log())
        raise
    finally:
        if eng.sock.exists():
            for file in ("docker-compose.yml", "docker-compose.cluster.yml"):
                eng.compose("down", "--volumes", "--remove-orphans", check=False, timeout=300, file=file)
        eng.stop()
        shutil.rmtree(home, ignore_errors=True)


class Stack:
    """The compose project, with its host ports on free loopback ports."""

    def __init__(self, engine: Engine, file: str = "docker-compose.yml") -> None:
        self.engine = engine
        self.file = file
        self.mysql_port, self.nats_port = free_port(), free_port()
        # What deploy/make-env.sh would write into deploy/.env (variables given win over that file).
        self.passwords = {var: secrets.token_hex(16) for var in PASSWORD_VARIABLES}
        self.env = {"BINLAKE_MYSQL_PORT": str(self.mysql_port), "BINLAKE_NATS_PORT": str(self.nats_port),
                    **self.passwords}
        self.admin = NatsSettings(nats_user="admin", nats_password=self.passwords["BINLAKE_ADMIN_PASSWORD"])

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.engine.compose(*args, env=self.env, timeout=timeout, check=check, file=self.file)

    def sql(self, *statements: str) -> None:
        conn = pymysql.connect(host="127.0.0.1", port=self.mysql_port, user="root",
                               password=self.passwords["MYSQL_ROOT_PASSWORD"], autocommit=True)
        try:
            with conn.cursor() as cur:
                for s in statements:
                    cur.execute(s)
        finally:
            conn.close()

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        conn = pymysql.connect(host="127.0.0.1", port=self.mysql_port, user="root",
                               password=self.passwords["MYSQL_ROOT_PASSWORD"])
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            conn.close()

    def container(self, service: str) -> dict[str, Any]:
        ids = self.compose("ps", "-q", service).stdout.split()
        assert ids, f"no {service} container"
        return dict(json.loads(self.engine.docker("inspect", ids[0]).stdout)[0])

    def verify(self) -> subprocess.CompletedProcess[str]:
        return self.compose("exec", "-T", "loader", "binlake", "verify", check=False, timeout=600)

    def wait_verified(self, timeout: float = 600) -> str:
        last: list[subprocess.CompletedProcess[str]] = []
        polls = itertools.count(1)

        def ok() -> bool:
            # `status` first, a container of a second: `verify` starts a JVM. Every 5th poll
            # verifies anyway (heartbeats may keep the stream's edge moving).
            if next(polls) % 5 and not self.loaded():
                return False
            last[:] = [self.verify()]
            return last[0].returncode == 0

        try:
            wait_until(ok, timeout, "binlake verify to pass inside the stack", interval=5)
        except AssertionError as exc:
            logs = self.compose("logs", "--tail", "60", "loader", "parser", "sink", "store", check=False).stdout
            said = f"{last[0].stdout}\n{last[0].stderr[-3000:]}" if last else "(the loader never caught up)"
            raise AssertionError(f"{exc}\n{said}\n{logs[-8000:]}") from None
        return last[0].stdout

    def loaded(self) -> bool:
        """Has the loader acked everything BINLAKE_CDC holds?"""
        out = self.compose("run", "--rm", "-T", "ops", "status", "--json", timeout=180, check=False)
        if out.returncode != 0:
            return False
        s = json.loads(out.stdout)
        acked, cdc = (s["clients"].get("loader") or {}).get("acked"), s["streams"].get("BINLAKE_CDC")
        return isinstance(acked, int) and cdc is not None and acked >= cdc["last_seq"]

    def status(self) -> dict[str, Any]:
        out = self.compose("run", "--rm", "-T", "ops", "status", "--json", timeout=180).stdout
        return dict(json.loads(out))

    def spark_master_json(self) -> str:
        """The cluster file's Spark master as its web UI's `/json/` describes it (workers, applications)."""
        return self.compose("exec", "-T", "spark-master", "python", "-c",
                            "import urllib.request; print(urllib.request.urlopen("
                            "'http://127.0.0.1:8080/json/', timeout=10).read().decode())").stdout

    def spark_intruder(self) -> str:
        """What a driver without the secret prints against the cluster file's master, from a container on
        its network (`ops`, which has no Spark secret); its SparkContext waits for the master until killed."""
        script = spark_intruder_script("spark://spark-master:7077")
        # --no-deps: the stack is up; the test kills a NATS node meanwhile, and compose would refuse to
        # start a container whose dependency is unhealthy (the intruder needs only the network).
        out = self.compose("run", "--rm", "--no-deps", "-T", "--entrypoint", "timeout", "ops", "--kill-after=10", "60",
                           "python", "-c", script, timeout=300, check=False)
        return out.stdout + out.stderr

    def command_lines(self, service: str) -> str:
        return self.compose("exec", "-T", service, "ps", "-eo", "args", "--no-headers").stdout


def workload(stack: Stack, start: int, n: int) -> None:
    """Inserts, updates and deletes in shop.orders and shop.items, in transactions of 50 rows."""
    stack.sql("CREATE TABLE IF NOT EXISTS shop.orders (id INT PRIMARY KEY, customer VARCHAR(40), "
              "total DECIMAL(10,2), at DATETIME(6))",
              "CREATE TABLE IF NOT EXISTS shop.items (id BIGINT PRIMARY KEY, sku VARCHAR(20), qty INT)")
    for lo in range(start, start + n, 50):
        ids = range(lo, min(lo + 50, start + n))
        stack.sql(
            "BEGIN",
            "INSERT INTO shop.orders VALUES " + ", ".join(
                f"({i}, 'c{i % 97}', {i * 1.25:.2f}, '2026-11-25 10:00:00.{i % 1000000:06d}')" for i in ids),
            "INSERT INTO shop.items VALUES " + ", ".join(f"({i}, 'sku-{i}', {i % 7})" for i in ids),
            f"UPDATE shop.orders SET total = total + 1 WHERE id BETWEEN {lo} AND {lo + 9}",
            f"DELETE FROM shop.items WHERE id BETWEEN {lo} AND {lo + 4}",
            "COMMIT",
        )


def assert_cdc_exact(stack: Stack) -> None:
    """BINLAKE_CDC: no message id twice, per-table order, and the row changes the workload made."""
    msgs = [m for m in read_stream_sync(stack.nats_url, "BINLAKE_CDC", auth=stack.admin) if m.env.get("db") == "shop"]
    ids = [m.headers["Nats-Msg-Id"] for m in msgs]
    assert len(ids) == len(set(ids)), "a change was published twice"
    assert_table_order(msgs)
    inserted = sum(len(m.env["rows"]) for m in msgs if m.env["op"] == "i" and m.env["table"] == "orders")
    assert inserted == stack.rows("SELECT count(*) FROM shop.orders")[0][0], "a change was lost"


def test_compose_up_workload_scale_kill_and_restart(engine: Engine) -> None:
    stack = Stack(engine)
    stack.compose("up", "--build", "--detach", "--wait", "--wait-timeout", "600", timeout=1800)
    # One image for every binlake service, built once.
    images = {stack.container(s)["Config"]["Image"] for s in ("meta", "store", "parser", "sink", "loader")}
    assert images == {"binlake:local"}, images
    assert stack.container("loader")["Config"]["User"] == "binlake"
    # The image carries the JVM class archive for its own java and jars: the loader's Spark maps it.
    options = stack.compose("exec", "-T", "loader", "python", "-c",
                            "from services.loader.class_archive import java_options; print(java_options())").stdout
    assert "-XX:SharedArchiveFile=/home/binlake/.cache/binlake/spark-cds/" in options, options
    # Auth by default: NATS refuses a client without a login; each service has its own user.
    assert_nats_refuses_anonymous(stack.nats_port)
    for service in ("meta", "store", "parser", "sink", "loader"):
        env = dict(v.split("=", 1) for v in stack.container(service)["Config"]["Env"])
        assert env["BINLAKE_NATS_USER"] == service and "BINLAKE_ADMIN_PASSWORD" not in env, service

    workload(stack, 1, 1000)
    assert "OK" in stack.wait_verified()

    stack.compose("up", "--detach", "--wait", "--scale", "sink=3", "--no-recreate")
    def spread() -> bool:
        owners = {p["owner"] for p in stack.status()["partitions"]}
        return None not in owners and len(owners) == 3
    wait_until(spread, 120, "the partitions spread over three sink workers", interval=3)

    # A crash of the parser (kill -9 of its process): Docker restarts it, capture resumes.
    parser = stack.container("parser")
    subprocess.run(["kill", "-9", str(parser["State"]["Pid"])], check=True)
    workload(stack, 1001, 1000)
    def restarted() -> bool:
        now = stack.container("parser")
        return bool(now["RestartCount"] > parser["RestartCount"] and now["State"]["Running"])
    wait_until(restarted, 120, "Docker to restart the killed parser", interval=2)
    assert "OK" in stack.wait_verified()
    assert_cdc_exact(stack)

    # down, then up: the named volumes keep source, bus and lake; capture goes on from there.
    acked = stack.status()["clients"]["loader"]["acked"]
    stack.compose("down", timeout=300)
    stack.compose("up", "--detach", "--wait", "--wait-timeout", "600", timeout=900)
    assert stack.status()["clients"]["loader"]["acked"] >= acked > 0, "the loader started over"
    workload(stack, 2001, 500)
    assert "OK" in stack.wait_verified()
    assert_cdc_exact(stack)
    stack.compose("down", "--volumes", timeout=300)


def test_cluster_file_three_nats_nodes_and_a_spark_cluster(engine: Engine) -> None:
    """deploy/docker-compose.cluster.yml: R3 streams on three NATS nodes, the loader on a Spark master
    with two workers; a NATS node killed (-9) under load changes nothing the user sees."""
    stack = Stack(engine, "docker-compose.cluster.yml")
    stack.env["BINLAKE_SPARK_UI_PORT"] = str(free_port())
    try:
        stack.compose("up", "--build", "--detach", "--wait", "--wait-timeout", "600", timeout=1800)
        workload(stack, 1, 1000)
        assert "OK" in stack.wait_verified()
        master = json.loads(stack.spark_master_json())
        assert [a["name"] for a in master["activeapps"]] == ["binlake-loader"], "the loader is not on the cluster"
        assert_spark_secret_kept_off_command_lines(stack)

        with ThreadPoolExecutor(1) as pool:  # a minute of the intruder waiting, beside the failover
            intruder = pool.submit(stack.spark_intruder)
            node = stack.container("nats-2")
            subprocess.run(["kill", "-9", str(node["State"]["Pid"])], check=True)
            workload(stack, 1001, 1000)
            assert "OK" in stack.wait_verified()
            assert_cdc_exact(stack)
            said = intruder.result()
        # Without the secret: refused by the master, which still runs the loader (and lands its rows: verify).
        master_json = stack.spark_master_json()
        assert_spark_intruder_refused(said, master_json)
        assert [a["name"] for a in json.loads(master_json)["activeapps"]] == ["binlake-loader"]
    finally:
        stack.compose("down", "--volumes", timeout=300, check=False)


def assert_spark_secret_kept_off_command_lines(stack: Stack) -> None:
    """The cluster's secret is in no process's arguments (`ps`) on the Spark containers and the loader:
    each JVM (the loader's through spark-submit) reads it from an owner-only properties file;
    executors get spark.authenticate from the driver."""
    secret = stack.passwords["BINLAKE_SPARK_SECRET"]
    for service in (*SPARK_SERVICES, "loader"):
        lines = stack.command_lines(service)
        assert secret not in lines, f"{service}: the Spark secret is on a command line"
        path = lines.split("--properties-file ", 1)[1].split()[0]
        modes = stack.compose("exec", "-T", service, "stat", "-c", "%a %U", path, str(Path(path).parent)).stdout
        assert modes.split() == ["600", "binlake", "700", "binlake"], f"{service}: {path} {modes}"
    executors = [line for s in ("spark-worker-1", "spark-worker-2") for line in stack.command_lines(s).splitlines()
                 if "CoarseGrainedExecutorBackend" in line]
    assert executors and all("-Dspark.authenticate=true" in e and "-Dspark.network.crypto.enabled=true" in e
                             for e in executors), executors

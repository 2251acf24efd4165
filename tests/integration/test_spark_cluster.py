"""The loader, unchanged, against a Spark standalone cluster that loses workers mid-batch.

The master and two workers are the children `binlake up --spark-workers 2` runs
(services.launcher.spark_cluster), supervised on an event loop in a thread here; the rest
of the stack and the checks are test_loader's. Each worker is killed once with its
executor (SIGKILL to its process group, as if its machine died): one while the loader
merges, one while it writes a batch. The supervisor restarts it, as `binlake up` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher.processes import clean_env
from services.launcher.spark_cluster import SparkCluster, spark_cluster
from shared.actor import run_all
from tests.integration import test_loader
from tests.integration.lake_stack import Stack, assert_cells_equal, commits, events
from tests.integration.support import assert_spark_intruder_refused, http_get, spark_intruder_script, wait_until
from tests.integration.test_loader import FINAL, assert_changelog_exactly_once, run_load

stack = test_loader.stack  # parser, sink, meta and store running; the loader on demand


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SparkCluster]:
    """A master and two workers on loopback, supervised until the test ends."""
    env = clean_env()
    c = spark_cluster(tmp_path / "spark", 2, env)
    loop = asyncio.new_event_loop()

    async def supervise() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await run_all([child.run for child in c.children])  # as `binlake up` runs them

    task = loop.create_task(supervise())
    thread = threading.Thread(target=loop.run_until_complete, args=(task,), daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(c.wait_ready(), loop).result(90)
        wait_until(lambda: alive_workers(c) == 2, 60, "two workers registered with the master", interval=0.5)
        yield c
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(60)
        loop.close()


def alive_workers(c: SparkCluster) -> int:
    """Workers the master counts as alive (0 while its web UI is not up yet)."""
    try:
        status, body = http_get(f"{c.webui_url}/json/")
    except OSError:
        return 0
    return int(json.loads(body).get("aliveworkers", 0)) if status == 200 else 0


def kill_machine(c: SparkCluster, i: int) -> None:
    """SIGKILL worker `i` and its executor (one process group: the child runs in its own session)."""
    proc = c.workers[i].proc
    assert proc is not None and proc.returncode is None, f"worker {i} is not running"
    os.killpg(proc.pid, signal.SIGKILL)


def kill_workers_mid_batch(stack: Stack, c: SparkCluster, killed: list[str]) -> None:
    """Worker 0 when the loader starts a merge, worker 1 while it writes the batch after the next commit."""
    rnd = random.Random(3)
    wait_until(lambda: stack.loaders, 60, "the loader to start")
    proc = stack.loader
    wait_until(lambda: events(proc, "lake.merge_started") or not proc.running, 400, "a merge", interval=0.2)
    time.sleep(rnd.uniform(0.2, 1.0))
    kill_machine(c, 0)
    killed.append("merge")
    done = len(commits(proc))
    wait_until(lambda: len(commits(proc)) > done or not proc.running, 400, "the next commit", interval=0.2)
    time.sleep(rnd.uniform(0.1, 1.5))  # somewhere in the next batch
    kill_machine(c, 1)
    killed.append("batch")


@pytest.mark.timeout(900)
def test_loader_on_a_standalone_cluster_survives_lost_workers(stack: Stack, cluster: SparkCluster,
                                                              tmp_path: Path) -> None:
    stack.env_extra.update(cluster.client_env(), BINLAKE_MERGE_ROWS="1500")  # what `binlake up` gives its loader
    killed: list[str] = []
    killer = threading.Thread(target=kill_workers_mid_batch, args=(stack, cluster, killed), daemon=True)
    killer.start()
    workload = run_load(stack, kills=0, merge_kill=False, rate=300, target=5000)
    killer.join(420)
    assert killed == ["merge", "batch"], stack.loader.output[-5000:]
    cdc = stack.wait_cdc(workload.changes)
    stack.wait_loaded(max(m.seq for m in cdc))
    stack.wait_resnapshots()
    stack.wait_merged(FINAL)
    assert sum(p.output.count("Lost executor") for p in stack.loaders) >= 2, "the driver never saw an executor go"
    for table in FINAL:
        assert_cells_equal(stack, table)
    assert_changelog_exactly_once(stack)
    for i, worker in enumerate(cluster.workers, 1):  # the work ran on the cluster, and on restarted workers
        assert worker.starts >= 2, f"worker {i} was not restarted"
        assert list((tmp_path / "spark" / f"work-{i}").glob("app-*")), f"no executor ran on worker {i}"
    wait_until(lambda: alive_workers(cluster) == 2, 60, "both workers back")


@pytest.mark.timeout(300)
def test_a_driver_without_the_clusters_secret_runs_nothing(cluster: SparkCluster, tmp_path: Path) -> None:
    """Whoever reaches the master without `auth.properties` gets no executor to run code on."""
    env = {**clean_env(), "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.Popen([sys.executable, "-c", spark_intruder_script(cluster.master_url)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    status, body = http_get(f"{cluster.webui_url}/json/")
    assert status == 200
    assert_spark_intruder_refused(out, body)
    assert stat.S_IMODE(os.stat(cluster.auth).st_mode) == 0o600

"""A three-node JetStream cluster with R3 streams and buckets: nodes SIGKILLed under load.

Every service gets all three URLs (BINLAKE_NATS_URL, comma-separated) and BINLAKE_REPLICAS=3.
While the lake workload of test_loader (DDL of every kind, keyless and case-colliding tables)
runs, one node is killed and restarted, then the node leading BINLAKE_CDC. Afterwards the CDC
stream holds every change once and in per-table order, and the lake equals the source.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest

from services.launcher.processes import ServiceProcess
from services.launcher.servers import NatsCluster, start_nats_cluster
from shared import jetstream
from shared.subjects import Names, kv_stream
from tests.integration.lake_stack import Stack, assert_cells_equal, services_answer
from tests.integration.support import assert_table_order, wait_until
from tests.integration.test_loader import FINAL, LakeWorkload, assert_changelog_exactly_once
from tests.servers import MariaDB

pytestmark = pytest.mark.timeout(1200)
R3 = {"BINLAKE_REPLICAS": "3"}


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    cluster = start_nats_cluster(tmp_path / "cluster", 3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def nats_url(nats_cluster: NatsCluster) -> str:
    """Every service and helper of this module talks to the cluster (all three URLs)."""
    return nats_cluster.url


@pytest.fixture
def procs() -> dict[str, ServiceProcess]:
    """The stack's service processes by name (their output explains a failure)."""
    return {}


def _has_stream(url: str, stream: str) -> bool:
    async def ask() -> bool:
        nc = await nats.connect(servers=url.split(","), connect_timeout=2, allow_reconnect=False)
        try:
            await nc.jetstream().stream_info(stream)
            return True
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
            return False
        finally:
            await nc.close()

    try:
        return asyncio.run(ask())
    except (nats.errors.Error, OSError, TimeoutError):
        return False


@pytest.fixture
def stack(mariadb: MariaDB, database: str, nats_url: str, parser_factory: Callable[..., ServiceProcess],
          sink_factory: Callable[..., ServiceProcess], service_factory: Callable[..., ServiceProcess],
          tmp_path: Path, procs: dict[str, ServiceProcess]) -> Stack:
    # The defaults ride out a leader election (the fixtures' 2 s TTLs are for quick failovers).
    procs["parser"] = parser_factory(BINLAKE_LEASE_TTL_S="15", **R3)
    procs["sink"] = sink_factory("sink", BINLAKE_MEMBER_TTL_S="15", **R3)
    # Meta and store exit when the cluster does not answer for their stream: on a busy machine a
    # young cluster still placing the R3 streams the sink creates took longer than their timeout.
    wait_until(lambda: _has_stream(nats_url, Names().cdc_stream), 120, "BINLAKE_CDC on the cluster", interval=0.5)
    procs["meta"] = service_factory("services.meta", "meta", **R3)
    procs["store"] = service_factory("services.store", "store", **R3)
    wait_until(lambda: services_answer(nats_url), 60, "meta and store to answer", interval=0.5)
    st = Stack(mariadb, database, nats_url, tmp_path / "data", service_factory)
    st.env_extra.update(R3)
    return st


async def _replicas(url: str) -> dict[str, int]:
    nc = await jetstream.connect(url, "test")
    try:
        js = nc.jetstream()
        return {s.config.name or "": s.config.num_replicas or 1 for s in await js.streams_info()}
    finally:
        await nc.close()


async def _leader(url: str, stream: str) -> str:
    nc = await jetstream.connect(url, "test")
    try:
        info = await nc.jetstream().stream_info(stream)
        assert info.cluster is not None and info.cluster.leader
        return info.cluster.leader
    finally:
        await nc.close()


def test_node_kills_under_load_lose_and_double_nothing(stack: Stack, nats_cluster: NatsCluster,
                                                      procs: dict[str, ServiceProcess]) -> None:
    names = Names()
    workload = LakeWorkload(stack.mariadb, stack.db, target=8000, rate=700)
    workload.release.clear()  # changes flow until both nodes are back
    stack.start_loader()
    workload.create_tables()
    thread = workload.start()
    wait_until(lambda: workload.changes > 2000 or workload.error is not None, 120, "the workload to get going")

    wanted = (names.raw_stream, names.cdc_stream, names.dlq_stream, kv_stream(names.cursors_bucket),
              kv_stream(names.leases_bucket), kv_stream(names.members_bucket), kv_stream(names.schema_bucket))
    # The sink creates BINLAKE_DLQ when it starts, which on a loaded machine may come after the
    # first changes; every stream binlake defines must be there with three replicas.
    def missing() -> set[str]:
        return set(wanted) - set(asyncio.run(_replicas(nats_cluster.url)))

    try:
        wait_until(lambda: not missing(), 60, "every stream to exist")
    except AssertionError:
        logs = "\n".join(f"--- {name} (running: {p.running}):\n{p.output[-3000:]}" for name, p in procs.items())
        raise AssertionError(f"{sorted(missing())} missing after 60 s; the services' output:\n{logs}") from None
    replicas = asyncio.run(_replicas(nats_cluster.url))
    for stream in wanted:
        assert replicas.get(stream) == 3, (stream, replicas)

    # One node (not the one the test reads through) dies and comes back.
    victim = nats_cluster.nodes[2]
    victim.kill()
    time.sleep(4)
    victim.start()
    nats_cluster.wait_healthy()
    wait_until(lambda: workload.changes > 5000 or workload.error is not None, 120, "more of the workload")

    # Then the node that leads BINLAKE_CDC.
    leader = nats_cluster.node_named(asyncio.run(_leader(nats_cluster.url, names.cdc_stream)))
    leader.kill()
    time.sleep(4)
    leader.start()
    nats_cluster.wait_healthy()
    workload.release.set()

    thread.join(900)
    assert workload.done.is_set() and workload.error is None, workload.error
    cdc = stack.wait_cdc(workload.changes)
    ids = Counter(m.headers["Nats-Msg-Id"] for m in cdc)
    assert not [i for i, n in ids.items() if n > 1], "a change is in BINLAKE_CDC twice"
    assert_table_order(cdc)
    stack.wait_loaded(max(m.seq for m in cdc))
    stack.wait_resnapshots()
    stack.wait_merged(FINAL)
    for table in FINAL:
        assert_cells_equal(stack, table)
    assert_changelog_exactly_once(stack)

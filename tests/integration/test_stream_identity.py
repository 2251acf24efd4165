"""BINLAKE_CDC deleted and defined again under a running loader (DESIGN §8 invariant 8).

Its sequences restart at 1, below what the lake committed: the loader halts with the reason and
the command to resume, and after `binlake rewind loader --to-start` the lake ends equal to the
source, the new stream's changes applied on top of what it held.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest

from services.launcher.processes import ServiceProcess
from shared import jetstream
from shared.subjects import Names
from tests.integration.lake_stack import ServiceFactory, assert_cells_equal, events
from tests.integration.support import binlake_cli, wait_until
from tests.integration.test_loader import start_stack
from tests.servers import MariaDB


async def _define_cdc_again(nats_url: str) -> None:
    """BINLAKE_CDC deleted and created again, as `binlake init` does after a lost NATS volume."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.delete_stream("BINLAKE_CDC")
        await jetstream.ensure_stream(js, jetstream.cdc_stream_config(Names()))
    finally:
        await nc.close()


@pytest.mark.timeout(900)
def test_a_loader_ahead_of_a_cdc_stream_defined_again_halts_then_resumes_to_an_equal_lake(
        mariadb: MariaDB, database: str, nats_url: str, parser: ServiceProcess, sink_factory: ServiceFactory,
        service_factory: ServiceFactory, tmp_path: Path) -> None:
    stack = start_stack(mariadb, database, nats_url, sink_factory, service_factory, tmp_path)
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(20))",
                    *(f"INSERT INTO `{db}`.t VALUES ({i}, 'v{i}')" for i in range(1, 31)))
    first = stack.start_loader()
    cdc = stack.wait_cdc(30)
    stack.wait_loaded(max(m.seq for m in cdc))
    before = stack.committed()

    asyncio.run(_define_cdc_again(nats_url))
    mariadb.execute(f"INSERT INTO `{db}`.t VALUES (31, 'new'), (32, 'new')",
                    f"UPDATE `{db}`.t SET v = 'changed' WHERE id <= 3", f"DELETE FROM `{db}`.t WHERE id = 4")
    new = stack.wait_cdc(2 + 3 + 1)
    assert max(m.seq for m in new) < before  # all of the new stream is at or below what the lake committed

    wait_until(lambda: not first.running, 120, "the loader to halt")
    assert "BINLAKE_CDC was deleted and defined again" in first.output, first.output[-3000:]
    assert "binlake rewind loader --to-start" in first.output
    assert stack.committed() == before  # nothing of the new stream was taken for what the lake holds
    with pytest.raises(AssertionError):
        assert_cells_equal(stack, "t")  # the lake still lacks the new changes

    done = binlake_cli(nats_url, "rewind", "loader", "--to-start")
    assert done.returncode == 0, done.stderr
    second = stack.start_loader()
    stack.wait_loaded(before + max(m.seq for m in new))  # lake sequences go on from the new stream's base
    assert [e["base"] for e in events(second, "lake.cdc_stream_changed")] == [before]
    stack.wait_merged(["t"])
    assert_cells_equal(stack, "t")

"""`binlake rewind loader` re-applies: every service a process, the lake damaged on disk.

One table's Iceberg tables are lost, another's are restored from a copy taken earlier, a third
(keyless, every change applied) is left alone. After `binlake rewind loader --to-start` the
loader delivers the whole stream again: each table takes what it lacks by its own marker, and
every table ends equal to the source, the keyless one without a second copy of any row.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.launcher.processes import ServiceProcess
from shared import keys
from tests.integration.lake_stack import ServiceFactory, Stack, assert_cells_equal, cursor_values, events
from tests.integration.support import binlake_cli, read_stream_sync, wait_until
from tests.integration.test_loader import start_stack
from tests.servers import MariaDB


def _folders(stack: Stack, table: str) -> list[Path]:
    n = stack.names(table)
    return [Path(n.path(stack.warehouse, name)) for name in (n.current_name, n.changelog_name)]


def _settled(stack: Stack, tables: list[str]) -> None:
    """Until the loader acked everything BINLAKE_CDC holds and merged every table."""
    last = max(m.seq for m in read_stream_sync(stack.nats_url, "BINLAKE_CDC"))

    def acked() -> bool:
        assert stack.loader.running, stack.loader.output[-5000:]
        (state,) = cursor_values(stack.nats_url, keys.client_cursor("main", "loader"))
        return state is not None and int(state["acked"]) >= last

    wait_until(acked, 600, f"the loader to ack CDC sequence {last}", interval=2)
    stack.wait_merged(tables)


@pytest.mark.timeout(900)
def test_rewind_to_start_rebuilds_a_lost_table_and_a_restored_one_without_doubling_the_others(
        mariadb: MariaDB, database: str, nats_url: str, parser: ServiceProcess, sink_factory: ServiceFactory,
        service_factory: ServiceFactory, tmp_path: Path) -> None:
    stack = start_stack(mariadb, database, nats_url, sink_factory, service_factory, tmp_path)
    db, tables = database, ["a", "k", "c"]
    mariadb.execute(f"CREATE TABLE `{db}`.a (id INT PRIMARY KEY, v VARCHAR(20))",
                    f"CREATE TABLE `{db}`.k (n INT, v VARCHAR(20))",
                    f"CREATE TABLE `{db}`.c (id INT PRIMARY KEY, n INT)",
                    *(f"INSERT INTO `{db}`.a VALUES ({i}, 'a{i}')" for i in range(1, 21)),
                    f"INSERT INTO `{db}`.k VALUES (1, 'x'), (1, 'x'), (2, NULL)",
                    *(f"INSERT INTO `{db}`.c VALUES ({i}, {i})" for i in range(1, 11)))
    stack.start_loader()
    _settled(stack, tables)
    stack.loader.stop(timeout=60)
    backup = tmp_path / "backup"
    for folder in _folders(stack, "a"):
        shutil.copytree(folder, backup / folder.name)

    stack.start_loader()
    mariadb.execute(f"UPDATE `{db}`.a SET v = 'changed' WHERE id <= 5", f"DELETE FROM `{db}`.a WHERE id > 15",
                    f"ALTER TABLE `{db}`.a ADD COLUMN w INT DEFAULT 7",
                    f"INSERT INTO `{db}`.a VALUES (30, 'late', 8)",
                    f"INSERT INTO `{db}`.k VALUES (1, 'x'), (3, 'y')", f"DELETE FROM `{db}`.k WHERE n = 2",
                    f"UPDATE `{db}`.c SET n = n * 10", f"DELETE FROM `{db}`.c WHERE id = 1")
    _settled(stack, tables)
    stack.loader.stop(timeout=60)
    for t in tables:
        assert_cells_equal(stack, t)

    for folder in _folders(stack, "c"):  # lost
        shutil.rmtree(folder)
    for folder in _folders(stack, "a"):  # restored from the earlier copy
        shutil.rmtree(folder)
        shutil.copytree(backup / folder.name, folder)
    assert stack.current("c") is None
    with pytest.raises(AssertionError):
        assert_cells_equal(stack, "a")

    done = binlake_cli(nats_url, "rewind", "loader", "--to-start")
    assert done.returncode == 0, done.stderr
    stack.batch_rows = 5  # many units below the last committed batch: no cut until they reach it
    again = stack.start_loader()
    _settled(stack, tables)
    for t in tables:
        assert_cells_equal(stack, t)
    (reapplying,) = events(again, "lake.reapplying")
    (reapplied,) = events(again, "lake.reapplied")
    published = [e["cut"] for e in events(again, "lake.cut_published")]
    assert all(cut >= reapplying["until"] for cut in published), (reapplying, published)
    assert reapplied["batch"] >= reapplying["until"]

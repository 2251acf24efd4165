"""Byte-bounded memory (DESIGN §8.6): 400 rows of 900 KiB in a burst through every service,
each with its buffers set to a small byte budget; every service's peak RSS (VmHWM from /proc)
stays within its idle size plus a bound derived from those budgets, and every row arrives.

A memory bound, not a timing: the burst is as fast as MariaDB takes it, and the services
fall behind it as far as they like.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from services.launcher.processes import ServiceProcess
from shared import keys
from tests.integration.conftest import ParserFactory
from tests.integration.lake_stack import Stack, cursor_values, services_answer
from tests.integration.support import snapshot_cli, wait_until
from tests.servers import MariaDB

ServiceFactory = Callable[..., ServiceProcess]
MIB = 1024 * 1024
BUDGET = 16 * MIB  # every buffer's byte budget here
ROWS, ROW_BYTES = 400, 900 * 1024  # 360 MB: 22 budgets
# What a service may hold at its peak beyond its idle size, in budgets: each buffer, the copies
# one message goes through while it is handled (decoded, re-encoded, in a reply) and what the
# allocator keeps of freed blocks. Measured on 2 cores (peak - idle, MiB): parser 100-160, sink
# ~20, store ~70, loader ~180 (pyarrow and py4j copies; the JVM is a process of its own).
# Without the budgets the sink fetched 500 such messages (450 MB) as one batch, could not
# publish it within its timeout, and died.
ALLOWANCE = {"parser": 10, "sink": 4, "store": 6, "meta": 2, "loader": 14}
SLACK = 48 * MIB


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


@pytest.mark.timeout(900)
def test_a_burst_of_large_rows_stays_within_every_services_byte_budget(
        mariadb: MariaDB, database: str, nats_url: str, parser_factory: ParserFactory,
        sink_factory: ServiceFactory, service_factory: ServiceFactory, tmp_path: Path) -> None:
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.wide (id INT PRIMARY KEY, b LONGBLOB)")
    procs = {
        "parser": parser_factory(BINLAKE_BUFFER_BYTES=str(BUDGET), BINLAKE_PUBLISH_WINDOW_BYTES=str(BUDGET)),
        "sink": sink_factory("sink", BINLAKE_FETCH_BYTES=str(BUDGET)),
        "meta": service_factory("services.meta", "meta"),
        "store": service_factory("services.store", "store", BINLAKE_MAX_BATCH_BYTES=str(BUDGET),
                                 BINLAKE_PREFETCH_BYTES=str(BUDGET)),
    }
    wait_until(lambda: services_answer(nats_url), 60, "meta and store to answer", interval=0.5)
    stack = Stack(mariadb, db, nats_url, tmp_path / "data", service_factory,
                  env_extra={"BINLAKE_BATCH_BYTES": str(BUDGET)})
    procs["loader"] = stack.start_loader()
    mariadb.execute(f"INSERT INTO `{db}`.wide VALUES (0, 'warm')")
    wait_until(lambda: stack.changelog("wide") is not None or not stack.loader.running, 300,
               "the first row in the lake")
    assert stack.loader.running, stack.loader.output[-3000:]
    idle = {name: _kib(p.pid, "VmRSS") for name, p in procs.items()}

    # The burst: 40 transactions of 10 rows (9 MB, within a batch's bytes, so the store hands
    # them out whole without growing a batch), each row 900 KiB of bytes that differ per row.
    for start in range(1, ROWS + 1, 10):
        mariadb.execute(f"INSERT INTO `{db}`.wide SELECT seq, REPEAT(LPAD(HEX(seq), 8, '0'), {ROW_BYTES // 8}) "
                        f"FROM `{db}`.seq_{start}_to_{start + 9}")
    want = {i: hashlib.sha256(f"{i:08X}".encode() * (ROW_BYTES // 8)).hexdigest() for i in range(1, ROWS + 1)}

    def landed() -> bool:
        for name, p in procs.items():
            assert p.running, f"{name} died:\n{p.output[-3000:]}"
        log = stack.changelog("wide")
        return log is not None and log.num_rows >= ROWS + 1

    wait_until(landed, 600, f"{ROWS} large rows in the lake's changelog", interval=3)
    peak = {name: _kib(p.pid, "VmHWM") for name, p in procs.items()}
    log = stack.changelog("wide")
    assert log is not None
    got = {r["id"]: hashlib.sha256(r["b"]).hexdigest() for r in log.select(["id", "b"]).to_pylist() if r["id"]}
    assert got == want

    report = {name: f"idle {idle[name] // MIB} MiB, peak {peak[name] // MIB} MiB" for name in procs}
    print("memory:", report)
    for name in procs:
        bound = idle[name] + ALLOWANCE[name] * BUDGET + SLACK
        assert peak[name] <= bound, f"{name}: peak RSS {peak[name] // MIB} MiB over {bound // MIB} MiB ({report})"


@pytest.mark.timeout(900)
def test_the_snapshot_of_a_large_keyless_table_is_read_in_pages_within_the_parsers_budget(
        mariadb: MariaDB, database: str, nats_url: str, parser_factory: ParserFactory) -> None:
    """360 MB in a table without a key, there before binlake (only a snapshot sees it): the parser
    reads it in pages of the chunk's bytes, so its peak stays within the same bound as a burst."""
    db = database
    mariadb.execute(f"CREATE TABLE `{db}`.heap (id INT, b LONGBLOB)")
    parser = parser_factory(BINLAKE_BUFFER_BYTES=str(BUDGET), BINLAKE_PUBLISH_WINDOW_BYTES=str(BUDGET),
                            BINLAKE_SNAPSHOT_CHUNK_BYTES=str(BUDGET // 2), BINLAKE_SNAPSHOT_POLL_S="0.2")
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            for start in range(1, ROWS + 1, 10):
                cur.execute(f"INSERT INTO `{db}`.heap SELECT seq, REPEAT(LPAD(HEX(seq), 8, '0'), {ROW_BYTES // 8}) "
                            f"FROM `{db}`.seq_{start}_to_{start + 9}")
    finally:
        conn.close()
    idle = _kib(parser.pid, "VmRSS")
    done = snapshot_cli(nats_url, f"{db}.heap", timeout=600)
    assert done.returncode == 0, done.stderr + parser.output[-3000:]
    peak = _kib(parser.pid, "VmHWM")
    state = cursor_values(nats_url, keys.snapshot_table("main", db, "heap"))[0]
    assert state is not None and state["rows"] == ROWS and state["state"] == "done", state
    print(f"memory: parser idle {idle // MIB} MiB, peak {peak // MIB} MiB over a {ROWS * ROW_BYTES // MIB} MiB table")
    bound = idle + ALLOWANCE["parser"] * BUDGET + SLACK
    assert peak <= bound, f"parser: peak RSS {peak // MIB} MiB over {bound // MIB} MiB"
    assert state["chunks"] >= ROWS * ROW_BYTES // (BUDGET // 2)  # pages of at most the chunk's bytes

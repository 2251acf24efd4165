"""`binlake up --demo`: a small shop workload on the source and the lake table printed as it changes.

The lake is read straight from its Parquet files and commit pointer with pyarrow, so the
demo needs no second Spark session next to the loader's.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pymysql
import structlog

log = structlog.get_logger().bind(actor="demo")
DDL = ("CREATE DATABASE IF NOT EXISTS demo",
       "CREATE TABLE IF NOT EXISTS demo.orders (id INT PRIMARY KEY, customer VARCHAR(40), "
       "amount DECIMAL(10,2), status ENUM('new','paid','shipped'), updated DATETIME(3))")


def _source(url: str) -> Any:
    from urllib.parse import unquote, urlsplit

    p = urlsplit(url)
    return pymysql.connect(host=p.hostname, port=p.port or 3306, user=unquote(p.username or "root"),
                           password=unquote(p.password or ""), autocommit=True)


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


def lake_view(warehouse: Path) -> str:
    try:
        committed = json.loads((warehouse / "_binlake_commit.json").read_text())["seq"]
        versions = sorted(int(p.name.split("=")[1]) for p in (warehouse / "demo__orders" / "snapshot").iterdir()
                          if p.name.startswith("_version=") and int(p.name.split("=")[1]) <= committed)
    except (OSError, ValueError, KeyError):
        return "lake demo__orders: not loaded yet"
    if not versions:
        return "lake demo__orders: not loaded yet"
    table = pq.read_table(warehouse / "demo__orders" / "snapshot" / f"_version={versions[-1]}")
    rows = sorted(table.to_pylist(), key=lambda r: r["id"])[-5:]
    lines = [f"lake demo__orders @ CDC seq {committed}: {table.num_rows} rows; newest:"]
    lines += [f"  {r['id']:>5} {r['customer']:<6} {r['amount']!s:>9} {r['status']}" for r in rows]
    return "\n".join(lines)


async def run(source_url: str, warehouse: Path) -> None:
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

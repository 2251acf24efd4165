"""A random transactional workload over three tables that counts every row change it makes."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.servers import MariaDB

TABLES = {
    "accounts": "CREATE TABLE `{db}`.accounts (id INT PRIMARY KEY, owner VARCHAR(40), balance DECIMAL(12,2), "
                "updated DATETIME(6))",
    "events": "CREATE TABLE `{db}`.events (id BIGINT UNSIGNED PRIMARY KEY, kind ENUM('a','b','c'), body TEXT, "
              "at TIMESTAMP(3) NULL)",
    "tags": "CREATE TABLE `{db}`.tags (id VARCHAR(20) PRIMARY KEY, n INT, flag BIT(1))",
}


@dataclass
class Workload:
    mariadb: MariaDB
    db: str
    target: int
    seed: int = 7
    rate: float = 1500.0  # row changes per second, so a crash test overlaps the workload
    # MySQL only: the share of transactions written with binlog_transaction_compression=ON in
    # their session, and whether every third transaction carries a tagged GTID (uuid:etl:n)
    compressed: float = 0.0
    tagged: bool = False
    changes: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def create_tables(self) -> None:
        self.mariadb.execute(*(ddl.format(db=self.db) for ddl in TABLES.values()))

    def run(self) -> None:
        rnd = random.Random(self.seed)
        conn = self.mariadb.connect(autocommit=False)
        next_id = {"accounts": 1, "events": 1, "tags": 1}
        started = time.monotonic()
        try:
            with conn.cursor() as cur:
                while self.changes < self.target:
                    ahead = self.changes / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                    self._session(cur, rnd)
                    for _ in range(rnd.choice([1, 1, 2, 3, 40])):  # statements per transaction
                        table = rnd.choice(list(TABLES))
                        self.changes += self._statement(cur, rnd, table, next_id)
                    conn.commit()
        except BaseException as exc:
            self.error = exc
        finally:
            conn.close()
            self.done.set()

    def _session(self, cur: Any, rnd: random.Random) -> None:
        """Between transactions: how the next one is logged (compressed, tagged) on MySQL."""
        if self.compressed:
            cur.execute(f"SET SESSION binlog_transaction_compression = {int(rnd.random() < self.compressed)}")
        if self.tagged:
            cur.execute("SET gtid_next = %s", ("AUTOMATIC:etl" if rnd.random() < 0.33 else "AUTOMATIC",))

    def _statement(self, cur: Any, rnd: random.Random, table: str, next_id: dict[str, int]) -> int:
        kind = rnd.choices(["insert", "update", "delete"], weights=[5, 3, 1])[0]
        lo = max(1, next_id[table] - 200)
        hi = lo + rnd.randint(0, 30)
        t = f"`{self.db}`.{table}"
        if kind == "insert":
            n = rnd.choice([1, 1, 1, 5, 20, 50])
            ids = range(next_id[table], next_id[table] + n)
            next_id[table] += n
            if table == "accounts":
                values = ", ".join(f"({i}, 'owner {i}', {rnd.randint(-10**6, 10**6)}.{i % 100:02d}, "
                                   f"'2024-01-01 00:00:00.{i % 999999:06d}')" for i in ids)
            elif table == "events":
                values = ", ".join(f"({i}, '{rnd.choice('abc')}', REPEAT('x', {i % 300}), "
                                   f"'2024-02-02 02:02:02.{i % 1000:03d}')" for i in ids)
            else:
                values = ", ".join(f"('tag-{i}', {i}, b'{i % 2}')" for i in ids)
            cur.execute(f"INSERT INTO {t} VALUES {values}")
        elif kind == "update":
            if table == "tags":
                cur.execute(f"UPDATE {t} SET n = n + 1 WHERE n BETWEEN %s AND %s", (lo, hi))
            elif table == "accounts" and rnd.random() < 0.2:
                # primary key updates move rows; the replay must follow them
                cur.execute(f"UPDATE {t} SET id = id + 1000000 WHERE id BETWEEN %s AND %s AND id < 1000000", (lo, hi))
            else:
                col = "balance = balance + 1" if table == "accounts" else "body = CONCAT(body, 'y')"
                cur.execute(f"UPDATE {t} SET {col} WHERE id BETWEEN %s AND %s", (lo, hi))
        else:
            key = "n" if table == "tags" else "id"
            cur.execute(f"DELETE FROM {t} WHERE {key} BETWEEN %s AND %s", (lo, lo + rnd.randint(0, 5)))
        return int(cur.rowcount)

    def snapshot(self, table: str) -> dict[Any, Any]:
        """The source table as the envelope would carry it, keyed by primary key."""
        conn = self.mariadb.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT * FROM `{self.db}`.{table}")
                names = [d[0] for d in cur.description]
                return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}
        finally:
            conn.close()

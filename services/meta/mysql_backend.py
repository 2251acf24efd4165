"""Meta backend on MySQL/MariaDB through asyncmy (`binlake meta --backend mysql`).

Cursors: `binlake_cursors(name, value, revision)`; compare-and-set is a conditional UPDATE
(`WHERE revision = expected`) or an INSERT that fails on a duplicate key. Schema history:
`binlake_schema` keyed by (source, db, tbl, scn).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncmy
import asyncmy.errors

from services.meta.backend import Conflict, CursorEntry, SchemaRecord
from shared.errors import SourceUnavailable
from shared.mysql import MAX_IDENTIFIER, TLS_CIPHER_SQL, MysqlUrl

DDL = (
    """CREATE TABLE IF NOT EXISTS binlake_cursors (
        name VARCHAR(255) COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
        value LONGTEXT NOT NULL,
        revision BIGINT NOT NULL
    ) DEFAULT CHARSET = utf8mb4""",
    f"""CREATE TABLE IF NOT EXISTS binlake_schema (
        source VARCHAR({MAX_IDENTIFIER}) COLLATE utf8mb4_bin NOT NULL,
        db VARCHAR({MAX_IDENTIFIER}) COLLATE utf8mb4_bin NOT NULL,
        tbl VARCHAR({MAX_IDENTIFIER}) COLLATE utf8mb4_bin NOT NULL,
        scn BIGINT UNSIGNED NOT NULL,
        record LONGTEXT NOT NULL,
        PRIMARY KEY (source, db, tbl, scn)
    ) DEFAULT CHARSET = utf8mb4""",
)
DUPLICATE_KEY = 1062


class MysqlBackend:
    def __init__(self, url: str) -> None:
        self._dsn = MysqlUrl.parse(url, "BINLAKE_META_MYSQL_URL", need_database=True)
        self._args: dict[str, Any] = self._dsn.asyncmy_settings()
        self._pool: Any = None

    async def start(self) -> None:
        try:
            self._pool = await asyncmy.create_pool(minsize=1, maxsize=4, autocommit=True, **self._args)
        except (asyncmy.errors.MySQLError, OSError) as exc:
            raise SourceUnavailable(f"meta database unreachable: {exc!r}") from exc
        self._dsn.check_tls((await self._query(TLS_CIPHER_SQL) or [("", "")])[0][1])
        for stmt in DDL:
            await self._execute(stmt)

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            await self._pool.wait_closed()
            self._pool = None

    async def _execute(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        async with self._cursor() as cur:
            await cur.execute(sql, args)
            return int(cur.rowcount)

    async def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        async with self._cursor() as cur:
            await cur.execute(sql, args)
            return list(await cur.fetchall())

    @contextlib.asynccontextmanager
    async def _cursor(self) -> AsyncIterator[Any]:
        """A cursor of a pooled connection; the database away (also when the pool connects again) is
        SourceUnavailable, which callers retry."""
        try:
            async with self._pool.acquire() as conn, conn.cursor() as cur:
                yield cur
        except (asyncmy.errors.OperationalError, asyncmy.errors.InterfaceError, OSError) as exc:
            raise SourceUnavailable(f"meta database unreachable: {exc!r}") from exc

    async def get(self, key: str) -> CursorEntry | None:
        rows = await self._query("SELECT value, revision FROM binlake_cursors WHERE name = %s", (key,))
        return CursorEntry(key, json.loads(rows[0][0]), int(rows[0][1])) if rows else None

    async def put(self, key: str, value: dict[str, Any], expected_revision: int | None) -> int:
        data = json.dumps(value)
        if expected_revision is None:
            try:
                await self._execute("INSERT INTO binlake_cursors (name, value, revision) VALUES (%s, %s, 1)",
                                    (key, data))
            except asyncmy.errors.IntegrityError as exc:
                raise Conflict(f"cursor {key} exists already") from exc
            return 1
        changed = await self._execute(
            "UPDATE binlake_cursors SET value = %s, revision = revision + 1 WHERE name = %s AND revision = %s",
            (data, key, expected_revision))
        if changed != 1:
            raise Conflict(f"cursor {key} changed concurrently (expected revision {expected_revision})")
        return expected_revision + 1

    async def list_cursors(self, prefix: str) -> list[CursorEntry]:
        like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = await self._query("SELECT name, value, revision FROM binlake_cursors WHERE name LIKE %s ORDER BY name",
                                 (like,))
        return [CursorEntry(r[0], json.loads(r[1]), int(r[2])) for r in rows]

    async def delete(self, key: str) -> None:
        await self._execute("DELETE FROM binlake_cursors WHERE name = %s", (key,))

    async def add_schema(self, record: SchemaRecord) -> None:
        await self._execute(
            "INSERT INTO binlake_schema (source, db, tbl, scn, record) VALUES (%s, %s, %s, %s, %s) "
            "ON DUPLICATE KEY UPDATE record = %s",  # not VALUES(record): MySQL 8.0.20+ warns on it
            (record.source, record.db, record.table, record.scn, *[json.dumps(record.to_dict())] * 2))

    async def schemas(self, source: str, db: str, table: str) -> list[SchemaRecord]:
        rows = await self._query(
            "SELECT record FROM binlake_schema WHERE source = %s AND db = %s AND tbl = %s ORDER BY scn",
            (source, db, table))
        return [SchemaRecord.from_dict(json.loads(r[0])) for r in rows]

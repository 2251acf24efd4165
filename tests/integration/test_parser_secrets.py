"""Passwords in account statements never leave the parser: not in a stream, a bucket or a log.

On MariaDB and on MySQL, which logs `CREATE USER ... IDENTIFIED BY` and `SET PASSWORD` with the
password's (salted) hash: `IDENTIFIED WITH 'caching_sha2_password' AS '<hash>'`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats
import nats.js.errors

from services.launcher.processes import ServiceProcess
from shared.jetstream import server_urls
from shared.subjects import Names
from tests.integration.conftest import ParserFactory
from tests.integration.support import wait_until
from tests.servers import BOTH_SOURCES, MariaDB, MySQL

SECRETS = ("S3cret", "S3cret2", "S3cret3")
LINK_SECRET = "L1nkS3cret"  # a remote server's password in a table option


async def everything_stored(nats_url: str) -> dict[str, list[bytes]]:
    """Every message of every stream (KV buckets included) as subject + headers + body bytes."""
    nc = await nats.connect(server_urls(nats_url))
    try:
        js = nc.jetstream()
        out: dict[str, list[bytes]] = {}
        for info in await js.streams_info():
            name, state = info.config.name, info.state
            assert name is not None
            out[name] = []
            for seq in range(max(state.first_seq, 1), state.last_seq + 1):
                try:
                    msg = await js.get_msg(name, seq)
                except nats.js.errors.NotFoundError:
                    continue  # deleted or purged
                headers = "".join(f"{k}: {v}\n" for k, v in (msg.headers or {}).items())
                out[name].append(f"{msg.subject}\n{headers}\n".encode() + (msg.data or b""))
        return out
    finally:
        await nc.close()


async def every_bucket(nats_url: str) -> dict[str, dict[str, bytes]]:
    """Every KV bucket's current keys and values, read through the KV API."""
    nc = await nats.connect(server_urls(nats_url))
    try:
        js = nc.jetstream()
        out: dict[str, dict[str, bytes]] = {}
        for info in await js.streams_info():
            name = info.config.name or ""
            if not name.startswith("KV_"):
                continue
            kv = await js.key_value(name[3:])
            try:
                keys = await kv.keys()
            except nats.js.errors.NoKeysError:
                keys = []
            out[name[3:]] = {k: (await kv.get(k)).value or b"" for k in keys}
        return out
    finally:
        await nc.close()


@BOTH_SOURCES
def test_account_statements_are_published_redacted(
        source: MariaDB, database: str, nats_url: str, parser_factory: ParserFactory,
        sink_factory: Callable[..., ServiceProcess], service_factory: Callable[..., ServiceProcess]) -> None:
    user = f"'u1_{database[2:8]}'@'%'"
    mysql = isinstance(source, MySQL)
    statements = [
        f"CREATE USER {user} IDENTIFIED BY 'S3cret'",
        f"ALTER USER {user} IDENTIFIED BY 'S3cret2'",
        f"GRANT SELECT ON *.* TO {user}",
        f"SET PASSWORD FOR {user} = 'S3cret3'" if mysql else f"SET PASSWORD FOR {user} = PASSWORD('S3cret3')",
    ]
    table_ddl = f"CREATE TABLE `{database}`.t (id INT PRIMARY KEY, note VARCHAR(40) DEFAULT 'IDENTIFIED BY x')"
    # Any engine keeps the CONNECTION option; FEDERATED, CONNECT and Spider log in with it.
    link_ddl = f"CREATE TABLE `{database}`.linked (id INT PRIMARY KEY) CONNECTION='mysql://fed:{LINK_SECRET}@h:3306/d/t'"
    # MySQL's hashes are salted: they cannot be computed here, but every one is masked ('***' expected)
    hashes = [] if mysql else [str(source.query("SELECT PASSWORD(%s)", s)[0][0]) for s in SECRETS]
    meta = service_factory("services.meta", "meta")
    parser = parser_factory()
    sink = sink_factory("sink")
    try:
        source.execute(*statements, table_ddl, link_ddl, f"INSERT INTO `{database}`.t VALUES (1, DEFAULT)")
        names = Names()

        expected: list[tuple[str, ...]]
        if mysql:  # every password statement logged as a hash: IDENTIFIED WITH 'caching_sha2_password' AS '...'
            identified = f"{user} IDENTIFIED WITH 'caching_sha2_password' AS '***'"
            expected = [(f"CREATE USER {identified}",), (f"ALTER USER {identified}",),
                        (f"GRANT SELECT ON *.* TO {user}",), ("DEFAULT 'IDENTIFIED BY x'",),
                        ("CONNECTION='mysql://fed:***@h:3306/d/t'",)]
        else:  # MariaDB logs SET PASSWORD with the hash: SET PASSWORD FOR 'u'@'%'='*94BD...'.
            expected = [(f"CREATE USER {user} IDENTIFIED BY '***'",), (f"ALTER USER {user} IDENTIFIED BY '***'",),
                        (f"GRANT SELECT ON *.* TO {user}",), (f"SET PASSWORD FOR {user}", "'***'"),
                        ("DEFAULT 'IDENTIFIED BY x'",), ("CONNECTION='mysql://fed:***@h:3306/d/t'",)]
        places = (names.raw_stream, names.cdc_stream, f"KV_{names.schema_bucket}")

        def all_there() -> dict[str, list[bytes]] | None:
            stored = asyncio.run(everything_stored(nats_url))
            done = all(any(all(p.encode() in m for p in parts) for m in stored.get(place, []))
                       for place in places for parts in expected)
            return stored if done else None

        stored = wait_until(all_there, 60, "the statements in BINLAKE_RAW, BINLAKE_CDC and the schema history")
    finally:
        source.execute(f"DROP USER IF EXISTS {user}")

    leaks = [s.encode() for s in (*SECRETS, LINK_SECRET, *hashes)]
    for stream, msgs in stored.items():
        for m in msgs:
            assert not any(leak in m for leak in leaks), (stream, m)
    buckets = asyncio.run(every_bucket(nats_url))
    assert buckets[names.schema_bucket], "the schema history is empty"
    for bucket, entries in buckets.items():
        for key, value in entries.items():
            assert not any(leak in key.encode() or leak in value for leak in leaks), (bucket, key, value)
    for proc in (parser, sink, meta):
        assert proc.running, proc.output
        assert not any(s in proc.output for s in (*SECRETS, LINK_SECRET, *hashes)), proc.output

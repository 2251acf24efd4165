"""Meta on both backends (JetStream KV and MySQL): the backend contract, and the meta process.

The same test functions run against `KvBackend` and `MysqlBackend` (the `backend` fixture),
then against a real `python -m services.meta` with each backend: monotonic cursor
compare-and-set through `MetaClient`, `schema.add` and its refusals, and the schema history
a real parser records through it (CREATE / ADD / DROP / RENAME COLUMN with rows between; meta
itself never reads BINLAKE_RAW), surviving kill -9 of meta and of the parser.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import msgpack
import nats
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from services.launcher.processes import ROOT, ServiceProcess, clean_env
from services.launcher.servers import free_port
from services.meta.backend import Conflict, CursorEntry, MetaBackend, SchemaRecord
from services.meta.kv_backend import KvBackend
from services.meta.mysql_backend import MysqlBackend
from shared import keys, meta_client
from shared.errors import NatsUnavailable
from shared.meta_client import MetaClient
from shared.rpc import RpcError
from shared.store_client import StoreClient
from tests.integration.support import StoredMsg, http_get, read_stream
from tests.servers import MariaDB

BACKENDS = ["kv", "mysql"]


async def wait_for(check: Callable[[], Awaitable[Any]], timeout: float, what: str, interval: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
        except (NatsUnavailable, RpcError) as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_exc!r})")
        await asyncio.sleep(interval)


@pytest.fixture
def meta_db(mariadb: MariaDB) -> Iterator[str]:
    """A fresh database for the MySQL backend's tables, dropped afterwards."""
    mariadb.start()
    name = f"meta_{uuid.uuid4().hex[:10]}"
    mariadb.execute(f"CREATE DATABASE `{name}`")
    try:
        yield name
    finally:
        mariadb.start()
        mariadb.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[MetaBackend]:
    b: MetaBackend
    if request.param == "kv":
        nc = await nats.connect(request.getfixturevalue("nats_url"))
        b = KvBackend(nc.jetstream(), "binlake_cursors", "binlake_schema")
        await b.start()
        try:
            yield b
        finally:
            await b.close()
            await nc.close()
    else:
        mariadb: MariaDB = request.getfixturevalue("mariadb")
        b = MysqlBackend(mariadb.dsn(database=request.getfixturevalue("meta_db")))
        await b.start()
        try:
            yield b
        finally:
            await b.close()


# -- the backend contract ---------------------------------------------------------------------


async def test_get_of_a_missing_key_is_none(backend: MetaBackend) -> None:
    assert await backend.get("client.main.nobody") is None


async def test_put_creates_then_get_returns_value_and_revision(backend: MetaBackend) -> None:
    value = {"seq": 42, "nested": {"list": [1, 2, 3], "ü": "ß ✓"}, "big": 2**63 + 5, "none": None}
    rev = await backend.put("client.main.a", value, None)
    assert isinstance(rev, int) and rev >= 1
    assert await backend.get("client.main.a") == CursorEntry("client.main.a", value, rev)


async def test_create_of_an_existing_key_is_a_conflict(backend: MetaBackend) -> None:
    rev = await backend.put("k.one", {"seq": 1}, None)
    with pytest.raises(Conflict):
        await backend.put("k.one", {"seq": 2}, None)
    assert await backend.get("k.one") == CursorEntry("k.one", {"seq": 1}, rev)


async def test_put_with_the_current_revision_updates_and_grows_the_revision(backend: MetaBackend) -> None:
    rev1 = await backend.put("k.cas", {"seq": 1}, None)
    rev2 = await backend.put("k.cas", {"seq": 2}, rev1)
    assert rev2 > rev1
    rev3 = await backend.put("k.cas", {"seq": 3}, rev2)
    assert rev3 > rev2
    assert await backend.get("k.cas") == CursorEntry("k.cas", {"seq": 3}, rev3)


async def test_put_with_a_stale_revision_is_a_conflict_and_changes_nothing(backend: MetaBackend) -> None:
    rev1 = await backend.put("k.stale", {"seq": 1}, None)
    rev2 = await backend.put("k.stale", {"seq": 2}, rev1)
    with pytest.raises(Conflict, match=r"k\.stale"):
        await backend.put("k.stale", {"seq": 99}, rev1)
    with pytest.raises(Conflict):
        await backend.put("k.stale", {"seq": 99}, rev2 + 1000)
    assert await backend.get("k.stale") == CursorEntry("k.stale", {"seq": 2}, rev2)


async def test_update_of_a_missing_key_is_a_conflict(backend: MetaBackend) -> None:
    with pytest.raises(Conflict):
        await backend.put("k.missing", {"seq": 1}, 1)
    assert await backend.get("k.missing") is None


async def test_two_writers_with_the_same_revision_one_wins(backend: MetaBackend) -> None:
    rev = await backend.put("k.race", {"seq": 0}, None)
    results = await asyncio.gather(*(backend.put("k.race", {"seq": i}, rev) for i in range(1, 6)),
                                   return_exceptions=True)
    winners = [r for r in results if isinstance(r, int)]
    assert len(winners) == 1
    assert all(isinstance(r, Conflict) for r in results if not isinstance(r, int))
    entry = await backend.get("k.race")
    assert entry is not None and entry.revision == winners[0]
    assert entry.value == {"seq": results.index(winners[0]) + 1}


async def test_list_cursors_by_prefix_sorted_by_key(backend: MetaBackend) -> None:
    for key in ("client.main.b", "client.main.a", "client.other.c", "sink.main.p1", "client.mainx.d",
                "p_q.1", "pzq.1"):
        await backend.put(key, {"key": key}, None)
    listed = await backend.list_cursors("client.main.")
    assert [e.key for e in listed] == ["client.main.a", "client.main.b"]
    assert [e.value for e in listed] == [{"key": "client.main.a"}, {"key": "client.main.b"}]
    assert all(e.revision >= 1 for e in listed)
    assert [e.key for e in await backend.list_cursors("client.")] == [
        "client.main.a", "client.main.b", "client.mainx.d", "client.other.c"]
    assert [e.key for e in await backend.list_cursors("p_q")] == ["p_q.1"]  # '_' is not a wildcard
    assert [e.key for e in await backend.list_cursors("nothing.")] == []
    assert len(await backend.list_cursors("")) == 7


async def test_list_cursors_of_an_empty_store(backend: MetaBackend) -> None:
    assert await backend.list_cursors("") == []


async def test_delete_removes_the_key_and_it_can_be_created_again(backend: MetaBackend) -> None:
    await backend.put("client.main.gone", {"seq": 1}, None)
    await backend.put("client.main.kept", {"seq": 2}, None)
    await backend.delete("client.main.gone")
    assert await backend.get("client.main.gone") is None
    assert [e.key for e in await backend.list_cursors("client.main.")] == ["client.main.kept"]
    rev = await backend.put("client.main.gone", {"seq": 3}, None)
    assert await backend.get("client.main.gone") == CursorEntry("client.main.gone", {"seq": 3}, rev)
    await backend.delete("client.main.never-existed")  # no error


@pytest.mark.parametrize("backend", [
    "kv", "mysql"], indirect=True)
async def test_keys_differing_in_case_are_different_cursors(backend: MetaBackend) -> None:
    await backend.put("client.main.App", {"seq": 1}, None)
    await backend.put("client.main.app", {"seq": 2}, None)
    assert (await backend.get("client.main.App")).value == {"seq": 1}  # type: ignore[union-attr]
    assert (await backend.get("client.main.app")).value == {"seq": 2}  # type: ignore[union-attr]


def rec(scn: int, table: str = "t", *, schema: dict[str, Any] | None = None, ddl: str | None = None,
        db: str = "shop", source: str = "main", ts: int = 0) -> SchemaRecord:
    return SchemaRecord(source, db, table, scn, schema=schema, ddl=ddl, ts=ts)


async def test_schemas_of_an_unknown_table_are_empty(backend: MetaBackend) -> None:
    assert await backend.schemas("main", "shop", "nothing") == []


async def test_schemas_are_ordered_by_scn_and_per_table(backend: MetaBackend) -> None:
    big = (2**31 << 32) | 0xFFFFFFF0
    records = [
        rec(big, schema={"id": "s3", "columns": [{"name": "id"}]}, ts=3),
        rec((1 << 32) | 100, ddl="CREATE TABLE t (id INT)", ts=1),
        rec((1 << 32) | 200, schema={"id": "s1", "columns": [{"name": "id"}]}, ts=1),
        rec((2 << 32) | 4, ddl="ALTER TABLE t ADD c INT", ts=2),
        rec((1 << 32) | 150, "t2", ddl="CREATE TABLE t2 (x INT)"),
        rec((1 << 32) | 160, "tt", ddl="CREATE TABLE tt (x INT)"),
        rec((1 << 32) | 170, db="shop2", ddl="CREATE TABLE t (x INT)"),
        rec((1 << 32) | 180, source="other", ddl="CREATE TABLE t (x INT)"),
    ]
    for r in records:
        await backend.add_schema(r)
    got = await backend.schemas("main", "shop", "t")
    assert [r.scn for r in got] == [(1 << 32) | 100, (1 << 32) | 200, (2 << 32) | 4, big]
    assert got == sorted(records[:4], key=lambda r: r.scn)
    assert [r.ddl for r in await backend.schemas("main", "shop", "t2")] == ["CREATE TABLE t2 (x INT)"]
    assert [r.ddl for r in await backend.schemas("main", "shop2", "t")] == ["CREATE TABLE t (x INT)"]
    assert [r.ddl for r in await backend.schemas("other", "shop", "t")] == ["CREATE TABLE t (x INT)"]


async def test_add_schema_is_idempotent_per_table_and_scn(backend: MetaBackend) -> None:
    r = rec(500, schema={"id": "a", "columns": [{"name": "id", "type": "int"}]}, ts=9)
    await backend.add_schema(r)
    await backend.add_schema(r)
    await backend.add_schema(r)
    assert await backend.schemas("main", "shop", "t") == [r]
    await backend.add_schema(rec(400, ddl="CREATE TABLE t (id INT)"))
    await backend.add_schema(r)
    assert [x.scn for x in await backend.schemas("main", "shop", "t")] == [400, 500]


async def test_schemas_keep_unusual_names(backend: MetaBackend) -> None:
    r1 = rec(10, "tab le.ü*>", db="my.db$", ddl="CREATE TABLE `tab le.ü*>` (x INT)")
    r2 = rec(11, "", db="", schema={"id": "e", "columns": []})
    await backend.add_schema(r1)
    await backend.add_schema(r2)
    assert await backend.schemas("main", "my.db$", "tab le.ü*>") == [r1]
    assert await backend.schemas("main", "", "") == [r2]


@pytest.mark.parametrize("backend", [
    "kv", "mysql"], indirect=True)
async def test_tables_differing_in_case_have_their_own_history(backend: MetaBackend) -> None:
    await backend.add_schema(rec(10, "T", ddl="CREATE TABLE T (x INT)"))
    await backend.add_schema(rec(10, "t", ddl="CREATE TABLE t (y INT)"))
    assert [r.ddl for r in await backend.schemas("main", "shop", "T")] == ["CREATE TABLE T (x INT)"]
    assert [r.ddl for r in await backend.schemas("main", "shop", "t")] == ["CREATE TABLE t (y INT)"]


# -- the meta process -------------------------------------------------------------------------


def meta_env(kind: str, request: pytest.FixtureRequest) -> dict[str, str]:
    if kind == "kv":
        return {"BINLAKE_BACKEND": "kv"}
    mariadb: MariaDB = request.getfixturevalue("mariadb")
    return {"BINLAKE_BACKEND": "mysql",
            "BINLAKE_META_MYSQL_URL": mariadb.dsn(database=request.getfixturevalue("meta_db"))}


async def meta_ready(client: MetaClient, proc: ServiceProcess) -> None:
    async def answers() -> bool:
        assert proc.running, proc.output[-3000:]
        await client.get("ready.probe")
        return True

    await wait_for(answers, 60, "meta to answer")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", BACKENDS)
async def test_meta_cursor_put_is_monotonic_and_compare_and_set(kind, request, service_factory, nats_url):
    meta = service_factory("services.meta", "meta", **meta_env(kind, request))
    nc = await nats.connect(nats_url)
    try:
        mc = MetaClient(nc, timeout_s=10)
        await meta_ready(mc, meta)
        key = "client.main.mono"
        rev1 = await mc.put(key, {"seq": 10, "who": "a"}, None, order="seq")
        with pytest.raises(RpcError) as info:
            await mc.put(key, {"seq": 5}, rev1, order="seq")
        assert info.value.code == "backwards"
        assert "is at seq=10; refusing to move it back to 5 without rewind" in str(info.value)
        assert await mc.get(key) == meta_client.Entry({"seq": 10, "who": "a"}, rev1)
        # equal is not backwards; forward is fine
        rev2 = await mc.put(key, {"seq": 10, "who": "b"}, rev1, order="seq")
        rev3 = await mc.put(key, {"seq": 12}, rev2, order="seq")
        # rewind may move it back
        rev4 = await mc.put(key, {"seq": 3}, rev3, order="seq", rewind=True)
        assert rev1 < rev2 < rev3 < rev4
        assert await mc.get(key) == meta_client.Entry({"seq": 3}, rev4)
        # without an order field the value is not compared
        rev5 = await mc.put(key, {"seq": 1}, rev4)
        # compare-and-set: stale revision, and create of an existing key
        with pytest.raises(meta_client.Conflict) as conflict:
            await mc.put(key, {"seq": 50}, rev4, order="seq")
        assert conflict.value.code == "conflict"
        with pytest.raises(meta_client.Conflict):
            await mc.put(key, {"seq": 50}, None)
        assert await mc.get(key) == meta_client.Entry({"seq": 1}, rev5)
        # a backwards move with a stale revision: refused either way, nothing written
        with pytest.raises(RpcError) as info:
            await mc.put(key, {"seq": 0}, rev1, order="seq")
        assert info.value.code in ("backwards", "conflict")
        # list / delete
        await mc.put("client.main.other", {"seq": 7}, None, order="seq")
        await mc.put("sink.main.p0", {"seq": 7}, None)
        assert [k for k, _ in await mc.list_cursors("client.main.")] == ["client.main.mono", "client.main.other"]
        await mc.delete("client.main.other")
        assert await mc.get("client.main.other") is None
        # malformed requests get bad_request
        malformed: list[dict[str, Any]] = [{"value": {}}, {"key": 1, "value": {}}, {"key": "k", "value": []},
                                           {"key": "k", "value": {}, "revision": "1"}]
        for req in malformed:
            reply = await nc.request("binlake.meta.cursor.put", _pack(req), timeout=10)
            body = _unpack(reply.data)
            assert body["ok"] is False and body["code"] == "bad_request", body
        # kill -9 and restart: every cursor is still there with its revision
        meta.kill()
        meta.start()
        await meta_ready(mc, meta)
        assert await mc.get(key) == meta_client.Entry({"seq": 1}, rev5)
        assert await mc.get("sink.main.p0") is not None
        rev6 = await mc.put(key, {"seq": 2}, rev5, order="seq")
        assert rev6 > rev5
    finally:
        await nc.close()


def _pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def names_of(schema: dict[str, Any] | None) -> list[str] | None:
    return None if schema is None else [c["name"] for c in schema["columns"]]


async def table_events(nats_url: str, db: str, table: str) -> list[StoredMsg]:
    return [m for m in await read_stream(nats_url) if m.env.get("db") == db and m.env.get("table") == table]


async def wait_events(nats_url: str, db: str, table: str, n: int) -> list[StoredMsg]:
    async def enough() -> list[StoredMsg] | None:
        msgs = await table_events(nats_url, db, table)
        return msgs if len(msgs) >= n else None

    return await wait_for(enough, 60, f"{n} raw events of {db}.{table}")  # type: ignore[no-any-return]


async def wait_history(mc: MetaClient, db: str, table: str, check: Callable[[list[dict[str, Any]]], bool],
                       what: str) -> list[dict[str, Any]]:
    async def done() -> list[dict[str, Any]] | None:
        records = await mc.schema_history("main", db, table)
        return records if check(records) else None

    return await wait_for(done, 60, what)  # type: ignore[no-any-return]


async def schema_at(mc: MetaClient, db: str, table: str, scn: int, maybe_empty: bool = False) -> dict[str, Any]:
    """MetaClient.schema_at without the "ok" field."""
    return {k: v for k, v in (await mc.schema_at("main", db, table, scn)).items() if k != "ok"}


async def check_schema_at_every_event(mc: MetaClient, events: list[StoredMsg], pending_at_end: bool) -> None:
    """schema_at before, at and just after every event of one table agrees with the events themselves."""
    for i, m in enumerate(events):
        env = m.env
        scn = env["scn"]
        at = await schema_at(mc, env["db"], env["table"], scn)
        if env["op"] == "ddl":
            assert at["ddl"] == env["ddl"] and at["ddl_scn"] == scn, (i, env["ddl"], at)
            nxt = events[i + 1].env if i + 1 < len(events) else None
            if nxt is None or nxt["op"] == "ddl":
                assert at["schema"] is None, (i, env["ddl"], at)  # pending until rows show the result
            else:
                assert at["schema"] == nxt["schema"] and at["scn"] == nxt["scn"], (i, at)
        else:
            assert at["schema"] == env["schema"], (i, at)
            row = env["rows"][0]
            assert names_of(at["schema"]) == list(row.get("after") or row["before"]), (i, at)
            assert at["scn"] <= scn
        # just before: what the previous event says
        before = await schema_at(mc, env["db"], env["table"], scn - 1, maybe_empty=i == 0)
        if i == 0:
            assert before == {"schema": None, "scn": None, "ddl": None, "ddl_scn": None}
        else:
            prev = await schema_at(mc, env["db"], env["table"], events[i - 1].env["scn"])
            assert before == prev, (i, before, prev)
        # just after (positions between two events)
        after = await schema_at(mc, env["db"], env["table"], scn + 1)
        assert after == at, (i, after, at)
    if pending_at_end:
        last = events[-1].env
        assert last["op"] == "ddl"
        end = await schema_at(mc, last["db"], last["table"], last["scn"] + 10**6)
        assert end["schema"] is None and end["ddl"] == last["ddl"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", BACKENDS)
async def test_schema_history_through_the_pipeline_survives_kill_9(kind, request, mariadb, database, parser_factory,
                                                                  service_factory, nats_url):
    meta = service_factory("services.meta", "meta", **meta_env(kind, request))
    nc = await nats.connect(nats_url)
    try:
        mc = MetaClient(nc, timeout_s=15)
        await meta_ready(mc, meta)
        parser = await asyncio.to_thread(parser_factory)
        t = f"`{database}`.t"
        statements = [
            f"CREATE TABLE {t} (id INT PRIMARY KEY, a INT, b VARCHAR(10))",
            f"INSERT INTO {t} VALUES (1, 10, 'one')",
            f"INSERT INTO {t} VALUES (2, 20, 'two'), (3, 30, 'three')",
            f"ALTER TABLE {t} ADD COLUMN c DATE",
            f"INSERT INTO {t} VALUES (4, 40, 'four', '2020-02-02')",
            f"UPDATE {t} SET a = 41 WHERE id = 4",
            f"ALTER TABLE {t} DROP COLUMN a",
            f"INSERT INTO {t} VALUES (5, 'five', NULL)",
            f"ALTER TABLE {t} RENAME COLUMN b TO name",
            f"INSERT INTO {t} VALUES (6, 'six', '2024-04-04')",
            f"DELETE FROM {t} WHERE id = 2",
            f"ALTER TABLE {t} ADD COLUMN d INT",  # no rows after it yet
        ]
        await asyncio.to_thread(mariadb.execute, *statements)
        events = await wait_events(nats_url, database, "t", 12)
        assert [e.env["op"] for e in events] == ["ddl", "i", "i", "ddl", "i", "u", "ddl", "i", "ddl", "i", "d", "ddl"]
        ddls = [e.env["ddl"] for e in events if e.env["op"] == "ddl"]
        await wait_history(mc, database, "t", lambda rs: [r["ddl"] for r in rs if r["ddl"]] == ddls
                           and sum(1 for r in rs if r["schema"]) >= 4, "5 DDL and 4 schema records")
        await check_schema_at_every_event(mc, events, pending_at_end=True)
        by_scn = {e.env["scn"]: names_of(e.env.get("schema")) for e in events}
        assert [by_scn[e.env["scn"]] for e in events if e.env["op"] == "i"] == [
            ["id", "a", "b"], ["id", "a", "b"], ["id", "a", "b", "c"], ["id", "b", "c"], ["id", "name", "c"]]

        # kill -9 while more changes arrive: the parser goes on publishing, and its recorder
        # records everything meta missed once meta answers again
        meta.kill()
        more = [
            f"INSERT INTO {t} VALUES (7, 'seven', NULL, 7)",
            f"ALTER TABLE {t} MODIFY COLUMN name VARCHAR(40)",
            f"INSERT INTO {t} VALUES (8, 'eight', NULL, 8)",
            f"ALTER TABLE {t} RENAME COLUMN d TO e",
        ]
        await asyncio.to_thread(mariadb.execute, *more)
        events = await wait_events(nats_url, database, "t", 16)
        assert parser.running, parser.output[-3000:]
        meta.start()
        await meta_ready(mc, meta)
        ddls = [e.env["ddl"] for e in events if e.env["op"] == "ddl"]
        assert len(ddls) == 7
        await wait_history(mc, database, "t", lambda rs: [r["ddl"] for r in rs if r["ddl"]] == ddls
                           and {r["scn"] for r in rs if r["schema"]} >= {events[12].env["scn"], events[14].env["scn"]}
                           and sum(1 for r in rs if r["schema"]) >= 6, "every record after the restart")
        await check_schema_at_every_event(mc, events, pending_at_end=True)
        assert names_of((await schema_at(mc, database, "t", events[-2].env["scn"]))["schema"]) == [
            "id", "name", "c", "d"]
        # and once more: nothing lost
        history = await mc.schema_history("main", database, "t")
        meta.kill()
        meta.start()
        await meta_ready(mc, meta)
        await wait_history(mc, database, "t", lambda rs: all(r in rs for r in history),
                           "every record again after the restart")
        await check_schema_at_every_event(mc, events, pending_at_end=True)
    finally:
        await nc.close()


@pytest.mark.timeout(180)
async def test_schema_is_known_after_a_ddl_that_keeps_the_columns(mariadb, database, parser_factory, service_factory,
                                                                  nats_url):
    meta = service_factory("services.meta", "meta")
    nc = await nats.connect(nats_url)
    try:
        mc = MetaClient(nc, timeout_s=15)
        await meta_ready(mc, meta)
        await asyncio.to_thread(parser_factory)
        t = f"`{database}`.t"
        await asyncio.to_thread(mariadb.execute, f"CREATE TABLE {t} (id INT PRIMARY KEY, a INT)",
                                f"INSERT INTO {t} VALUES (1, 1)", f"ALTER TABLE {t} ADD INDEX ia (a)",
                                f"INSERT INTO {t} VALUES (2, 2)")
        events = await wait_events(nats_url, database, "t", 4)
        await wait_history(mc, database, "t", lambda rs: sum(1 for r in rs if r["ddl"]) == 2, "2 DDL records")
        await asyncio.sleep(3)  # the parser's recorder has long seen the last insert
        at = await mc.schema_at("main", database, "t", events[-1].env["scn"])
        assert names_of(at["schema"]) == ["id", "a"], at
    finally:
        await nc.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", BACKENDS)
async def test_schema_add_records_idempotently_and_refuses_malformed_requests(kind, request, service_factory,
                                                                              nats_url):
    meta = service_factory("services.meta", "meta", **meta_env(kind, request))
    nc = await nats.connect(nats_url)
    try:
        mc = MetaClient(nc, timeout_s=10)
        await meta_ready(mc, meta)
        schema = {"id": "s1", "columns": [{"name": "id", "type": "int"}, {"name": "ü", "type": "varchar"}]}
        for _ in range(2):  # recording the same table and scn again changes nothing
            await mc.add_schema("main", "shop", "t", 100, schema=None, ddl="CREATE TABLE t (id INT, ü TEXT)", ts=1)
            await mc.add_schema("main", "shop", "t", 200, schema=schema, ddl=None, ts=2)
        history = await mc.schema_history("main", "shop", "t")
        assert history == [
            {"source": "main", "db": "shop", "table": "t", "scn": 100, "schema": None,
             "ddl": "CREATE TABLE t (id INT, ü TEXT)", "ts": 1},
            {"source": "main", "db": "shop", "table": "t", "scn": 200, "schema": schema, "ddl": None, "ts": 2}]
        assert await schema_at(mc, "shop", "t", 250) == {"schema": schema, "scn": 200,
                                                         "ddl": "CREATE TABLE t (id INT, ü TEXT)", "ddl_scn": 100}
        good = {"source": "main", "db": "shop", "table": "t", "scn": 300, "schema": None, "ddl": "DROP TABLE t",
                "ts": 3}
        malformed: list[tuple[dict[str, Any], str]] = [
            ({**good, "scn": "300"}, "field 'scn' must be int, got str"),
            ({**good, "scn": True}, "field 'scn' must be int, got bool"),
            ({**good, "ts": 3.5}, "field 'ts' must be int, got float"),
            ({**good, "table": 5}, "field 'table' must be str, got int"),
            ({**good, "schema": ["id"]}, "field 'schema' must be dict or nil, got list"),
            ({**good, "ddl": {"sql": "DROP TABLE t"}}, "field 'ddl' must be str or nil, got dict"),
            ({**good, "ddl": None}, "give 'schema' (a table's columns) or 'ddl' (a statement), or both"),
            ({k: v for k, v in good.items() if k != "db"}, "missing field 'db'"),
        ]
        for req, message in malformed:
            reply = _unpack((await nc.request("binlake.meta.schema.add", _pack(req), timeout=10)).data)
            assert reply == {"ok": False, "code": "bad_request", "error": message}, (req, reply)
        with pytest.raises(RpcError) as refused:
            await mc.add_schema("main", "shop", "t", -1, schema=None, ddl="DROP TABLE t", ts=3)
        assert refused.value.code == "bad_request" and "must not be negative" in str(refused.value)
        assert await mc.schema_history("main", "shop", "t") == history  # nothing of it was recorded
    finally:
        await nc.close()


def log_events(proc: ServiceProcess, event: str) -> list[dict[str, Any]]:
    """The structlog JSON lines of a service whose `event` is `event`, in order."""
    out = []
    for line in proc.output.splitlines():
        try:
            rec = json.loads(line) if line.startswith("{") else None
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == event:
            out.append(rec)
    return out


async def cursors_kv(nc: NATS) -> KeyValue:
    return await nc.jetstream().key_value("binlake_cursors")


async def recorder_seq(nc: NATS) -> int | None:
    """The last BINLAKE_RAW sequence the parser's recorder says it recorded (None: no cursor yet)."""
    try:
        entry = await (await cursors_kv(nc)).get(keys.schema_recorder("main"))
    except nats.js.errors.KeyNotFoundError:
        return None
    return int(json.loads(entry.value or b"{}")["seq"])


@pytest.mark.timeout(240)
async def test_the_parser_records_the_history_when_meta_answers_and_continues_after_kill_9(
        mariadb, database, parser_factory, service_factory, nats_url):
    nc = await nats.connect(nats_url)
    try:
        mc = MetaClient(nc, timeout_s=15)
        # 1. No meta: the binlog flows into BINLAKE_RAW all the same; the recorder says why it waits.
        parser = await asyncio.to_thread(parser_factory, log_name="parser1.log")
        old, new = f"`{database}`.old", f"`{database}`.new"
        await asyncio.to_thread(mariadb.execute, f"CREATE TABLE {old} (id INT PRIMARY KEY)",
                                f"INSERT INTO {old} VALUES (1)", f"INSERT INTO {old} VALUES (2)")
        before = await wait_events(nats_url, database, "old", 3)

        async def waits_for_meta() -> bool:
            return any(r.get("actor") == "schema-recorder" and "schema.add" in r.get("reason", "")
                       for r in log_events(parser, "actor.restart"))

        await wait_for(waits_for_meta, 30, "the recorder to wait for meta")
        assert parser.running, parser.output[-3000:]
        await asyncio.to_thread(parser.stop)

        # 2. An upgrade: meta's own recorder had recorded up to here (its cursor is in the bucket
        # with the KV backend); the parser's recorder starts after it.
        kv = await cursors_kv(nc)
        await kv.put(keys.legacy_schema_recorder("main"), json.dumps({"seq": before[-1].seq}).encode())
        await kv.delete(keys.schema_recorder("main"))
        meta = service_factory("services.meta", "meta")
        await meta_ready(mc, meta)
        parser = await asyncio.to_thread(parser_factory, log_name="parser2.log")
        await asyncio.to_thread(mariadb.execute, f"CREATE TABLE {new} (id INT PRIMARY KEY, a INT)",
                                f"INSERT INTO {new} VALUES (1, 1)")
        events = await wait_events(nats_url, database, "new", 2)
        await wait_history(mc, database, "new", lambda rs: [(bool(r["ddl"]), bool(r["schema"])) for r in rs] == [
            (True, False), (False, True)], "the CREATE and the first schema of the new table")
        await check_schema_at_every_event(mc, events, pending_at_end=False)
        assert await mc.schema_history("main", database, "old") == [], "recorded before the old cursor"
        assert log_events(parser, "schema.cursor_migrated")[0]["raw_seq"] == before[-1].seq
        await wait_for(lambda: _at_least(recorder_seq(nc), events[-1].seq), 30, "the recorder's cursor")

        # 3. kill -9 the parser: the next one records from the cursor on.
        parser.kill()
        await asyncio.to_thread(mariadb.execute, f"ALTER TABLE {new} ADD COLUMN b INT",
                                f"INSERT INTO {new} VALUES (2, 2, 2)")
        parser = await asyncio.to_thread(parser_factory, log_name="parser3.log")
        events = await wait_events(nats_url, database, "new", 4)
        await wait_history(mc, database, "new", lambda rs: sum(1 for r in rs if r["ddl"]) == 2
                           and sum(1 for r in rs if r["schema"]) == 2, "the ALTER and the schema after it")
        await check_schema_at_every_event(mc, events, pending_at_end=False)
        assert names_of((await schema_at(mc, database, "new", events[-1].env["scn"]))["schema"]) == ["id", "a", "b"]
        assert not log_events(parser, "schema.cursor_migrated"), "its own cursor was there"
        await wait_for(lambda: _at_least(recorder_seq(nc), events[-1].seq), 30, "the recorder's cursor")
        assert parser.running and meta.running
    finally:
        await nc.close()


async def _at_least(seq: Awaitable[int | None], target: int) -> bool:
    value = await seq
    return value is not None and value >= target


@pytest.mark.timeout(180)
async def test_kv_history_and_list_reads_are_complete_and_leave_no_consumers(nats_url):
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        b = KvBackend(js, "binlake_cursors", "binlake_schema")
        await b.start()
        for i in range(12):
            await b.add_schema(rec(1000 + i, ddl=f"ALTER {i}"))
            await b.put(f"client.main.c{i:02d}", {"seq": i}, None)
        incomplete = 0
        for _ in range(300):
            results = await asyncio.gather(*(b.schemas("main", "shop", "t") for _ in range(3)),
                                           b.list_cursors("client.main."))
            incomplete += sum(len(r) != 12 for r in results)  # type: ignore[arg-type]
        assert incomplete == 0, f"{incomplete} of 1200 reads came back incomplete"
        info = await js.stream_info("KV_binlake_schema")
        assert info.state.consumer_count < 10, f"{info.state.consumer_count} consumers left on the history bucket"
    finally:
        await nc.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", BACKENDS)
async def test_status_shows_the_client_cursors_of_either_backend(
        kind: str, request: pytest.FixtureRequest, service_factory: Callable[..., ServiceProcess],
        nats_url: str) -> None:
    meta = service_factory("services.meta", "meta", **meta_env(kind, request))
    store = service_factory("services.store", "store")
    nc = await nats.connect(nats_url)
    try:
        await meta_ready(MetaClient(nc, timeout_s=10), meta)
        client = StoreClient(nc, "my app/ü", timeout_s=10)

        async def subscribed() -> bool:
            assert store.running, store.output[-3000:]
            await client.subscribe()
            return True

        await wait_for(subscribed, 60, "the store to answer")
    finally:
        await nc.close()
    env = clean_env()
    env["BINLAKE_NATS_URL"] = nats_url
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "services.cli", "status"], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "my app/ü: acked=0 delivered=0 unacked=0 filter=.*" in out.stdout, out.stdout
    assert "meta is not answering" not in out.stdout


@pytest.mark.timeout(180)
async def test_meta_says_on_healthz_while_its_mysql_backend_is_away(mariadb, meta_db, service_factory, nats_url):
    port = free_port()
    meta = service_factory("services.meta", "meta", BINLAKE_BACKEND="mysql", BINLAKE_METRICS_PORT=str(port),
                           BINLAKE_META_MYSQL_URL=mariadb.dsn(database=meta_db))
    healthz = f"http://127.0.0.1:{port}/healthz"
    nc = await nats.connect(nats_url)
    try:
        mc = MetaClient(nc, timeout_s=20)
        await meta_ready(mc, meta)
        assert await asyncio.to_thread(http_get, healthz) == (200, "ok\n")
        await asyncio.to_thread(mariadb.stop)
        with pytest.raises(RpcError) as info:
            await mc.get("client.main.away")
        assert info.value.code == "unavailable", info.value
        code, body = await asyncio.to_thread(http_get, healthz)
        assert code == 503 and "cursor.get" in body, body
        await asyncio.to_thread(mariadb.start)
        await meta_ready(mc, meta)  # it answers again
        assert await asyncio.to_thread(http_get, healthz) == (200, "ok\n")
    finally:
        await nc.close()

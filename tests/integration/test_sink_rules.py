"""Sink rules end to end: MariaDB -> parser -> BINLAKE_RAW -> sink (filters, columns, masks) -> BINLAKE_CDC.

The expected CDC content is computed independently from BINLAKE_RAW with the configured
rules written out by hand here, and every byte of BINLAKE_CDC (bodies and headers) is
scanned for the clear-text values that must never leave the sink.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import msgpack
import nats
import nats.js.errors
import pytest

from tests.integration.support import StoredMsg, count_rows, read_stream_sync, wait_until

CDC = "BINLAKE_CDC"
RAW = "BINLAKE_RAW"
SALT_1 = "salt-one-Ω"
SALT_2 = "salt-two"

# Clear-text values of masked or dropped columns and of filtered tables: none may appear in BINLAKE_CDC.
SSN_1 = "secret-ssn-123-45-6789"
SSN_2 = "secret-ssn-987-65-4321"
SSN_1B = "secret-ssn-555-55-5555"
SSN_3 = "secret-ssn-222-22-2222"
EMAIL_1 = "alice.secret-mail@example.com"
EMAIL_2 = "bob.secret-mail@example.com"
EMAIL_3 = "carol.secret-mail@example.com"
CARD_1 = "4111-secret-card-0001"
CARD_2 = "5500-secret-card-0002"
CARD_3 = "3400-secret-card-0003"
BIO_1 = "biography-secret-text-alice"
BIO_3 = "biography-secret-text-carol"
NOTES = ["dropped-notes-secret-1", "dropped-notes-secret-2", "dropped-notes-secret-3", "dropped-order-notes-1",
         "dropped-order-notes-2", "dropped-order-notes-3"]
INTERNAL_1 = "dropped-internal-secret-1"  # orders.internal: not in columns_include during phase 1
AUDIT_1 = "excluded-audit-secret-1"
AUDIT_1B = "excluded-audit-secret-1b"
IGNORED_1 = "not-included-secret-1"
PHASE1_SECRETS = [SSN_1, SSN_2, SSN_1B, EMAIL_1, EMAIL_2, CARD_1, CARD_2, BIO_1, INTERNAL_1, AUDIT_1, AUDIT_1B,
                  IGNORED_1, *NOTES[:2], *NOTES[3:5]]
PHASE2_SECRETS = [SSN_3, EMAIL_3, CARD_3, BIO_3, NOTES[2], NOTES[5]]


@dataclass(frozen=True)
class RawMsg:
    seq: int
    subject: str
    headers: dict[str, str]
    data: bytes

    @property
    def env(self) -> dict[str, Any]:
        env: dict[str, Any] = msgpack.unpackb(self.data, raw=False, strict_map_key=False)
        return env


async def _raw_messages(nats_url: str, stream: str) -> list[RawMsg]:
    """Every message of `stream` with its undecoded body and headers, in stream order."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            return []
        out = []
        for seq in range(info.state.first_seq or 1, info.state.last_seq + 1):
            try:
                m = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                continue
            assert m.subject is not None and m.seq is not None
            out.append(RawMsg(m.seq, m.subject, dict(m.headers or {}), m.data or b""))
        return out
    finally:
        await nc.close()


def raw_messages(nats_url: str, stream: str = CDC) -> list[RawMsg]:
    return asyncio.run(_raw_messages(nats_url, stream))


def leaked(msgs: list[RawMsg], secrets: list[str]) -> list[tuple[int, str]]:
    """(seq, secret) for every clear-text secret found in a message body, subject or header."""
    found = []
    for m in msgs:
        blob = m.data + m.subject.encode() + b"".join(k.encode() + b"\0" + v.encode() for k, v in m.headers.items())
        found += [(m.seq, s) for s in secrets if s.encode() in blob]
    return found


def sha(salt: str, value: str) -> str:
    return hashlib.sha256(salt.encode() + value.encode()).hexdigest()


@dataclass(frozen=True)
class Config:
    """The rules of one sink configuration, written out independently of services.sink.rules."""

    db: str
    tables: frozenset[str]  # tables whose events reach BINLAKE_CDC
    skip: frozenset[str]
    salt: str
    orders_include: frozenset[str] | None  # columns_include for orders (None: all)

    def env(self) -> dict[str, str]:
        db = re.escape(self.db)
        out = {
            # a comma list; `audit` matches the include list but may be excluded; `ignored` never matches
            "BINLAKE_INCLUDE": rf"{db}\.(users|orders|audit), {db}\.no_such_table",
            "BINLAKE_EXCLUDE": rf"{db}\.audit" if "audit" not in self.tables else "",
            "BINLAKE_SKIP_OPS": ",".join(sorted(self.skip)),
            "BINLAKE_COLUMNS_EXCLUDE": json.dumps({f"{self.db}.*": ["notes"]}),  # a glob key; wins over include
            "BINLAKE_MASKS": json.dumps({f"{self.db}.users": {
                "ssn": "hash", "email": "replace:[email:redacted]", "card": "truncate:4", "bio": "truncate:9"}}),
            "BINLAKE_MASK_SALT": self.salt,
        }
        if self.orders_include is not None:
            out["BINLAKE_COLUMNS_INCLUDE"] = json.dumps({f"{self.db}.orders": sorted(self.orders_include)})
        return out

    def forwarded(self, env: dict[str, Any]) -> bool:
        return env.get("db") == self.db and env.get("table") in self.tables and env["op"] not in self.skip

    def image(self, table: str, values: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in values.items():
            if not self.kept(table, name):
                continue
            if table == "users" and value is not None:
                if name == "ssn":
                    value = sha(self.salt, value)
                elif name == "email":
                    value = "[email:redacted]"
                elif name == "card":
                    value = value[:4]
                elif name == "bio":
                    value = value[:9]
            out[name] = value
        return out

    def kept(self, table: str, name: str) -> bool:
        if name == "notes":
            return False
        return table != "orders" or self.orders_include is None or name in self.orders_include | {"id"}

    def ddl_columns(self, table: str, columns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A CREATE TABLE's `alter.columns` as the lake must get them: the rows' columns, masked as theirs."""
        masks = {"ssn": "hash", "email": "replace", "card": "truncate", "bio": "truncate"} if table == "users" else {}
        return [{**c, "masked": masks[c["name"]]} if c["name"] in masks else c for c in columns
                if self.kept(table, c["name"])]

    def expected(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The CDC envelope of a forwarded raw row event, minus `schema` (checked separately)."""
        rows = [{k: self.image(raw["table"], v) for k, v in row.items()} for row in raw["rows"]]
        out = {**raw, "rows": rows}
        out.pop("schema", None)
        return out


def check_schema(table: str, cfg: Config, raw_schema: dict[str, Any], schema: dict[str, Any]) -> None:
    cols = {c["name"]: c for c in schema["columns"]}
    raw_cols = {c["name"]: c for c in raw_schema["columns"]}
    assert schema["id"] != raw_schema["id"], "a reshaped table needs a schema id of its own"
    if table == "users":
        assert list(cols) == ["id", "name", "email", "ssn", "card", "bio"]
        assert cols["ssn"]["masked"] == "hash" and cols["ssn"]["type"] == "varchar"
        assert cols["email"]["masked"] == "replace" and cols["email"]["type"] == "varchar"
        assert cols["card"] == {**raw_cols["card"], "masked": "truncate"}  # varchar truncated: still varchar
        assert cols["bio"] == {**raw_cols["bio"], "masked": "truncate"}  # text truncated: still text
        assert cols["bio"]["type"] == "text"
        assert cols["id"] == raw_cols["id"] and cols["name"] == raw_cols["name"]
    else:
        keep = [c for c in raw_cols if c != "notes" and (table != "orders" or cfg.orders_include is None
                                                         or c in cfg.orders_include | {"id"})]
        assert list(cols) == keep
        assert all(cols[c] == raw_cols[c] for c in keep)


def assert_cdc_matches(cfg: Config, raw: list[RawMsg], cdc: list[RawMsg], db: str) -> int:
    """Every raw message of `db` in `raw` that `cfg` forwards is in `cdc` exactly once, shaped by `cfg`."""
    by_id = {m.headers["Nats-Msg-Id"]: m for m in cdc}
    checked = 0
    for r in raw:
        env = r.env
        if env.get("db") != db:
            continue
        mid = r.headers["Nats-Msg-Id"]
        if not cfg.forwarded(env):
            assert mid not in by_id, f"{env['op']} on {env['table']} must be filtered: {by_id.get(mid)}"
            continue
        assert mid in by_id, f"{env['op']} on {env['table']} (raw seq {r.seq}) is missing from {CDC}"
        c = by_id[mid]
        out = c.env
        assert c.subject == f"binlake.cdc.main.{db}.{env['table']}"
        if env["op"] in ("i", "u", "d", "r"):
            # every table of the database has a column rule (the `<db>.*` glob), so every row event is reshaped
            assert {k: v for k, v in out.items() if k != "schema"} == cfg.expected(env)
            check_schema(env["table"], cfg, env["schema"], out["schema"])
            for row in out["rows"]:
                for image in row.values():
                    assert list(image) == [col["name"] for col in out["schema"]["columns"]]
        elif env["op"] == "ddl" and env["alter"]["kind"] == "create":
            # every table has a column rule: the CREATE TABLE the loader builds the lake table from has the
            # rows' columns (issue 14); the statement text is the source's
            assert {k: v for k, v in out.items() if k != "alter"} == {k: v for k, v in env.items() if k != "alter"}
            assert out["alter"] == {**env["alter"], "columns": cfg.ddl_columns(env["table"], env["alter"]["columns"])}
            assert "notes" in out["ddl"] and "notes" not in [col["name"] for col in out["alter"]["columns"]]
        else:
            assert c.data == r.data, "an event without rewrite rules travels as the original bytes"
        for key in ("Binlake-Op", "Binlake-Table", "Binlake-Pos", "Binlake-Rows"):
            assert c.headers[key] == r.headers[key]
        checked += 1
    return checked


def cdc_of(msgs: list[RawMsg], db: str) -> list[RawMsg]:
    return [m for m in msgs if m.env.get("db") == db]


def wait_for_cdc(nats_url: str, cfg: Config, db: str, raw_rows: int,
                 since_seq: int = 1) -> tuple[list[RawMsg], list[RawMsg]]:
    """Wait until BINLAKE_RAW holds `raw_rows` row changes of `db` and BINLAKE_CDC every message that `cfg`
    forwards from raw sequence `since_seq` on."""
    wait_until(lambda: count_rows(read_stream_sync(nats_url, RAW), db) >= raw_rows, 60, f"{raw_rows} raw rows")
    raw = raw_messages(nats_url, RAW)
    assert count_rows([StoredMsg(m.seq, m.subject, m.headers, m.env) for m in raw], db) == raw_rows

    def missing() -> list[str]:
        ids = {m.headers["Nats-Msg-Id"] for m in raw_messages(nats_url, CDC)}
        return [f"raw seq {m.seq} {m.subject} {m.env['op']}" for m in raw
                if m.seq >= since_seq and cfg.forwarded(m.env) and m.headers["Nats-Msg-Id"] not in ids]

    try:
        wait_until(lambda: not missing(), 60, "every forwarded event in BINLAKE_CDC")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; missing: {missing()}") from None
    time.sleep(1.5)  # anything filtered that leaked through, or a duplicate, shows up now
    return raw, raw_messages(nats_url, CDC)


def assert_no_duplicates(cdc: list[RawMsg]) -> None:
    ids = Counter(m.headers["Nats-Msg-Id"] for m in cdc)
    assert [i for i, n in ids.items() if n > 1] == [], "duplicate events in BINLAKE_CDC"


@pytest.mark.timeout(180)
def test_filters_columns_and_masks_end_to_end_and_reconfiguration(mariadb, database, parser, sink_factory, nats_url):
    db = database
    q = f"`{db}`"
    mariadb.execute(
        f"CREATE TABLE {q}.users (id INT PRIMARY KEY, name VARCHAR(50), email VARCHAR(100), ssn VARCHAR(40),"
        " card VARCHAR(30), bio TEXT, notes TEXT) CHARACTER SET utf8mb4",
        f"CREATE TABLE {q}.orders (id INT PRIMARY KEY, user_id INT, amount DECIMAL(10,2), internal VARCHAR(60),"
        " status VARCHAR(20), notes TEXT) CHARACTER SET utf8mb4",
        f"CREATE TABLE {q}.audit (id INT PRIMARY KEY, msg VARCHAR(100))",
        f"CREATE TABLE {q}.ignored (id INT PRIMARY KEY, msg VARCHAR(100))",
    )
    cfg1 = Config(db, frozenset({"users", "orders"}), frozenset({"d"}), SALT_1, frozenset({"amount", "status",
                                                                                           "notes"}))
    sink = sink_factory("rules-1", **cfg1.env())

    # Phase 1: 14 row changes.
    mariadb.execute(
        f"INSERT INTO {q}.users VALUES (1, 'Alice', '{EMAIL_1}', '{SSN_1}', '{CARD_1}', '{BIO_1}', '{NOTES[0]}'),"
        f" (2, 'Bob', '{EMAIL_2}', '{SSN_2}', '{CARD_2}', 'short', '{NOTES[1]}'),"
        " (3, 'Nobody', NULL, NULL, NULL, NULL, NULL)",
        f"UPDATE {q}.users SET ssn = '{SSN_1B}' WHERE id = 1",  # before and after image both masked
        f"UPDATE {q}.users SET name = 'Bobby' WHERE id = 2",  # masked value unchanged: same hash twice
        f"DELETE FROM {q}.users WHERE id = 3",  # skipped op
        f"INSERT INTO {q}.orders VALUES (10, 1, 12.50, '{INTERNAL_1}', 'new', '{NOTES[3]}'),"
        f" (11, 2, 99.99, 'x', 'new', '{NOTES[4]}')",
        f"UPDATE {q}.orders SET status = 'paid' WHERE id = 10",
        f"DELETE FROM {q}.orders WHERE id = 11",
        f"INSERT INTO {q}.audit VALUES (1, '{AUDIT_1}')",
        f"UPDATE {q}.audit SET msg = '{AUDIT_1B}' WHERE id = 1",
        f"DELETE FROM {q}.audit WHERE id = 1",
        f"INSERT INTO {q}.ignored VALUES (1, '{IGNORED_1}')",
    )
    raw1, cdc1 = wait_for_cdc(nats_url, cfg1, db, 14)
    assert sink.running, sink.output
    assert_no_duplicates(cdc1)
    assert assert_cdc_matches(cfg1, raw1, cdc1, db) == 2 + 3 + 2  # 2 DDL, 3 users and 2 orders row events

    mine = cdc_of(cdc1, db)
    tables = Counter((m.env["table"], m.env["op"]) for m in mine)
    assert tables == {("users", "ddl"): 1, ("orders", "ddl"): 1, ("users", "i"): 1, ("users", "u"): 2,
                      ("orders", "i"): 1, ("orders", "u"): 1}, "excluded tables, skipped ops: neither rows nor DDL"
    # Spelled-out values, as a reader of BINLAKE_CDC sees them.
    users_insert = next(m.env for m in mine if (m.env["table"], m.env["op"]) == ("users", "i"))
    assert users_insert["rows"] == [
        {"after": {"id": 1, "name": "Alice", "email": "[email:redacted]", "ssn": sha(SALT_1, SSN_1), "card": "4111",
                   "bio": "biography"}},
        {"after": {"id": 2, "name": "Bob", "email": "[email:redacted]", "ssn": sha(SALT_1, SSN_2), "card": "5500",
                   "bio": "short"}},
        {"after": {"id": 3, "name": "Nobody", "email": None, "ssn": None, "card": None, "bio": None}},
    ]
    ssn_update = next(m.env for m in mine if m.env["op"] == "u" and m.env["rows"][0]["after"]["id"] == 1
                      and m.env["table"] == "users")
    assert ssn_update["rows"][0]["before"]["ssn"] == sha(SALT_1, SSN_1)
    assert ssn_update["rows"][0]["after"]["ssn"] == sha(SALT_1, SSN_1B)
    orders_insert = next(m.env for m in mine if (m.env["table"], m.env["op"]) == ("orders", "i"))
    assert orders_insert["rows"] == [{"after": {"id": 10, "amount": "12.50", "status": "new"}},
                                     {"after": {"id": 11, "amount": "99.99", "status": "new"}}]
    # The scan is meaningful: the secrets are in BINLAKE_RAW, and nowhere in BINLAKE_CDC.
    assert {s for _, s in leaked(raw1, PHASE1_SECRETS)} == set(PHASE1_SECRETS)
    assert leaked(cdc1, PHASE1_SECRETS) == []

    # Phase 2: a new configuration (new salt, audit no longer excluded, deletes forwarded, every orders column
    # but notes) takes effect for new changes only; the new worker continues from the partition cursors.
    sink.stop()  # SIGTERM (see test_sink_stops_promptly_on_sigterm for why it may end in SIGKILL)
    assert "partition.final_commit_failed" not in sink.output, sink.output
    before_restart = {m.seq: m for m in raw_messages(nats_url, CDC)}
    first_new_raw = max(m.seq for m in raw_messages(nats_url, RAW)) + 1
    cfg2 = Config(db, frozenset({"users", "orders", "audit"}), frozenset(), SALT_2, None)
    sink2 = sink_factory("rules-2", **cfg2.env())
    mariadb.execute(
        f"INSERT INTO {q}.users VALUES (4, 'Carol', '{EMAIL_3}', '{SSN_3}', '{CARD_3}', '{BIO_3}', '{NOTES[2]}')",
        f"UPDATE {q}.users SET ssn = '{SSN_3}', name = 'Alice2' WHERE id = 1",
        f"DELETE FROM {q}.users WHERE id = 2",
        f"UPDATE {q}.orders SET internal = 'visible-now', notes = '{NOTES[5]}' WHERE id = 10",
        f"INSERT INTO {q}.audit VALUES (2, 'audit-visible-now')",
        f"INSERT INTO {q}.ignored VALUES (2, 'still-ignored-2')",
    )
    raw2, cdc2 = wait_for_cdc(nats_url, cfg2, db, 14 + 6, since_seq=first_new_raw)
    assert sink2.running, sink2.output
    assert_no_duplicates(cdc2)
    # History is untouched: every message stored before the restart is still there, byte for byte ...
    assert {m.seq: m for m in cdc2 if m.seq in before_restart} == before_restart
    # ... nothing that the old configuration filtered was replayed with the new one ...
    new = [m for m in cdc2 if m.seq not in before_restart]
    assert all(int(m.headers["Binlake-Raw-Seq"]) >= first_new_raw for m in new if m.env.get("db") == db), \
        "the restarted sink replayed history"
    # ... and the new changes follow the new rules exactly.
    raw_new = [m for m in raw2 if m.seq >= first_new_raw]
    assert assert_cdc_matches(cfg2, raw_new, cdc2, db) == 5
    ops = Counter((m.env["table"], m.env["op"]) for m in new if m.env.get("db") == db)
    assert ops == {("users", "i"): 1, ("users", "u"): 1, ("users", "d"): 1, ("orders", "u"): 1, ("audit", "i"): 1}
    update = next(m.env for m in new if m.env.get("db") == db and (m.env["table"], m.env["op"]) == ("users", "u"))
    assert update["rows"][0]["before"]["ssn"] == sha(SALT_2, SSN_1B)
    assert update["rows"][0]["after"]["ssn"] == sha(SALT_2, SSN_3)
    orders_update = next(m.env for m in new if m.env.get("db") == db and m.env["table"] == "orders")
    assert orders_update["rows"][0]["after"] == {"id": 10, "user_id": 1, "amount": "12.50",
                                                 "internal": "visible-now", "status": "paid"}
    # Nothing before the restart of the newly included table or op appears afterwards.
    assert [m.env["rows"] for m in cdc_of(cdc2, db) if m.env["table"] == "audit"] == \
        [[{"after": {"id": 2, "msg": "audit-visible-now"}}]]
    assert [m.env["rows"][0]["before"]["id"] for m in cdc_of(cdc2, db) if m.env["op"] == "d"] == [2]
    assert {s for _, s in leaked(raw2, PHASE2_SECRETS)} == set(PHASE2_SECRETS)
    # orders.internal is no longer dropped, so its old value is legitimately visible in the before image now
    assert leaked(cdc2, [s for s in PHASE1_SECRETS if s != INTERNAL_1] + PHASE2_SECRETS) == []


@pytest.mark.timeout(90)
def test_sink_stops_promptly_on_sigterm(nats_url, sink_factory):
    sink = sink_factory("stopper", BINLAKE_LOG_LEVEL="debug")  # partition.start is a debug line
    wait_until(lambda: sink.output.count('"partition.start"') == 16 or not sink.running, 20, "16 partitions")
    assert sink.running, sink.output
    # Idle partitions keep polling their empty raw subjects (each poll ends in a timeout); none of
    # that may leave a subscription behind that a clean stop then waits for.
    time.sleep(5)
    # A subscription left behind would hold the stop for ever: a generous bound tells that from a
    # loaded machine (coverage writes its data at exit), without timing the stop.
    assert sink.stop(timeout=60) == 0, sink.output
    assert '"service.stopped"' in sink.output, sink.output[-3000:]


@pytest.mark.timeout(90)
def test_reshaped_event_headers_name_the_reshaped_schema(mariadb, database, parser, sink_factory, nats_url):
    q = f"`{database}`"
    mariadb.execute(f"CREATE TABLE {q}.t (id INT PRIMARY KEY, ssn VARCHAR(40), notes TEXT)",
                    f"INSERT INTO {q}.t VALUES (1, '{SSN_1}', 'n')")
    sink_factory("schema-header", BINLAKE_COLUMNS_EXCLUDE=json.dumps({f"{database}.t": ["notes"]}),
                 BINLAKE_MASKS=json.dumps({f"{database}.t": {"ssn": "hash"}}), BINLAKE_MASK_SALT=SALT_1)
    cdc = wait_until(lambda: [m for m in raw_messages(nats_url, CDC) if m.env.get("db") == database
                              and m.env["op"] == "i"], 30, "the insert in BINLAKE_CDC")
    raw = [m for m in raw_messages(nats_url, RAW) if m.headers["Nats-Msg-Id"] == cdc[0].headers["Nats-Msg-Id"]]
    assert raw[0].headers["Binlake-Schema"] == raw[0].env["schema"]["id"]  # the parser's contract
    body_id = cdc[0].env["schema"]["id"]
    assert body_id != raw[0].env["schema"]["id"]
    assert cdc[0].headers.get("Binlake-Schema", body_id) == body_id


def test_masks_match_columns_as_mysql_does_and_typos_are_reported(mariadb, database, parser, sink_factory, nats_url):
    q = f"`{database}`"
    mariadb.execute(f"CREATE TABLE {q}.t (id INT PRIMARY KEY, email VARCHAR(40), notes TEXT)",
                    f"INSERT INTO {q}.t VALUES (1, 'a@example.com', 'n')")
    sink = sink_factory("case", BINLAKE_MASKS=json.dumps({f"{database}.t": {"Email": "replace:x", "emial": "hash"}}),
                        BINLAKE_MASK_SALT=SALT_1)
    cdc = wait_until(lambda: [m for m in raw_messages(nats_url, CDC) if m.env.get("db") == database
                              and m.env["op"] == "i"], 30, "the insert in BINLAKE_CDC")
    assert cdc[0].env["rows"][0]["after"]["email"] == "x"
    assert b"a@example.com" not in cdc[0].data
    wait_until(lambda: '"sink.rule_names_missing_column"' in sink.output, 10, "the warning about the typo")
    line = next(x for x in sink.output.splitlines() if "rule_names_missing_column" in x)
    assert '"emial"' in line and f"{database}.t" in line


@pytest.mark.timeout(120)
def test_rules_spelled_as_the_sql_does_match_a_lower_case_table_names_source(
        mariadb_factory, parser_factory, sink_factory, nats_url):
    """On a server with lower_case_table_names=1 the binlog names `Shop.Orders` as `shop.orders`; rules
    written the way the application's SQL spells the names (the sink's default setting) still apply."""
    server = mariadb_factory(extra_args=["--lower-case-table-names=1"])
    assert server.query("SELECT @@lower_case_table_names") == [(1,)]
    parser_factory(BINLAKE_SOURCE_URL=server.dsn())
    sink_factory("lctn", BINLAKE_INCLUDE=r"Shop\.Orders", BINLAKE_COLUMNS_EXCLUDE=json.dumps({"SHOP.*": ["NOTES"]}),
                 BINLAKE_MASKS=json.dumps({"Shop.Orders": {"EMAIL": "replace:x"}}), BINLAKE_MASK_SALT=SALT_1)
    server.execute("CREATE DATABASE Shop CHARACTER SET utf8mb4",
                   "CREATE TABLE Shop.Orders (id INT PRIMARY KEY, EMAIL VARCHAR(60), Notes TEXT)",
                   "CREATE TABLE Shop.Other (id INT PRIMARY KEY, EMAIL VARCHAR(60))",
                   f"INSERT INTO Shop.Orders VALUES (1, '{EMAIL_1}', '{NOTES[0]}')",
                   f"INSERT INTO Shop.Other VALUES (1, '{EMAIL_2}')",
                   f"UPDATE Shop.Orders SET EMAIL = '{EMAIL_3}' WHERE id = 1")
    wait_until(lambda: count_rows(read_stream_sync(nats_url, RAW), "shop") >= 3, 60, "3 raw rows")
    raw = raw_messages(nats_url, RAW)
    assert {(m.env["db"], m.env["table"]) for m in raw if m.env["op"] == "i"} == {("shop", "orders"),
                                                                                   ("shop", "other")}
    wait_until(lambda: any(m.env["op"] == "u" for m in raw_messages(nats_url, CDC)), 30, "the update in BINLAKE_CDC")
    time.sleep(1.5)  # anything filtered that leaked through shows up now
    cdc = raw_messages(nats_url, CDC)
    rows = [(m.env["table"], m.env["op"], m.env["rows"]) for m in cdc if m.env["op"] in ("i", "u", "d")]
    assert rows == [("orders", "i", [{"after": {"id": 1, "EMAIL": "x"}}]),
                    ("orders", "u", [{"before": {"id": 1, "EMAIL": "x"}, "after": {"id": 1, "EMAIL": "x"}}])]
    assert {s for _, s in leaked(raw, [EMAIL_1, EMAIL_2, EMAIL_3, NOTES[0]])} == {EMAIL_1, EMAIL_2, EMAIL_3, NOTES[0]}
    assert leaked(cdc, [EMAIL_1, EMAIL_2, EMAIL_3, NOTES[0]]) == []

"""No authenticated user acts outside its role, whatever reply subject or deliver subject it names.

For every user binlake generates (each service role and a store client) and every subject its
grant lets it publish to, a request goes out with, as its reply subject, each JetStream API verb
on each stream and bucket (under both API prefixes), each stream subject, each KV key and each
meta and store request subject, but those its own grant covers; every user that may create
consumers also creates push consumers delivering there. Afterwards every stream still holds
exactly what it held, plus the writes the users were allowed to make, and meta and the store
still answer. Run against `binlake up`'s
configuration and the compose file's (deploy/nats/permissions.conf), and, as the control that
shows the sweep finds an escalation, against one account with per-user permissions only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig

from services.launcher import login
from services.launcher.processes import ServiceProcess
from services.ops import init
from shared import permissions
from shared.config import NatsSettings
from shared.errors import NatsUnavailable
from shared.jetstream import connect
from shared.meta_client import MetaClient
from shared.rpc import RpcError
from shared.subjects import Names, subject_matches
from tests.servers import NatsServer, start_nats

NAMES = Names()
USERS = (*[r for r in permissions.ROLES if r != "admin"], "app1")
MARK = b"allowed write|"
"""The body of every write a user makes: only its own grant let it through."""


def _grant(user: str) -> permissions.Grant:
    return permissions.client_grant(NAMES, user) if user == "app1" else permissions.grants(NAMES)[user]


def _client_block() -> str:
    """app1's account, as `server_config` writes it (the block a deployment adds per client)."""
    text = permissions.server_config(NAMES, {}, {"app1": '"app1-pw"'}, roles=False)
    return "".join(line + "\n" for line in text.splitlines()[1:-1])


def _with_client(conf: str) -> str:
    return conf.replace("accounts {\n", "accounts {\n" + _client_block(), 1)


def _up_conf(tmp_path: Path) -> tuple[str, dict[str, str]]:
    data = tmp_path / "up"
    data.mkdir()
    text = login.server_config(data, NAMES).read_text()
    return _with_client(text), {**{r: login.password(data, r) for r in permissions.ROLES}, "app1": "app1-pw"}


def _compose_conf(monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, str]]:
    passwords = {r: f"{r}-pw" for r in permissions.ROLES}
    for role, pw in passwords.items():  # nats-server reads $VARS from its environment
        monkeypatch.setenv(f"BINLAKE_{role.upper()}_PASSWORD", pw)
    text = (Path(__file__).resolve().parents[2] / "deploy" / "nats" / "permissions.conf").read_text()
    return _with_client(text), {**passwords, "app1": "app1-pw"}


def _one_account_conf() -> tuple[str, dict[str, str]]:
    """The design the accounts replace: every user in one account, confined by publish permissions."""
    users = []
    for user in USERS:
        grant = _grant(user)
        allow = ", ".join(json.dumps(s) for s in dict.fromkeys(grant.publish))
        sub = ", ".join(json.dumps(s) for s in grant.subscribe)
        users.append(f'{{user: "{user}", password: "{user}-pw", permissions: {{publish: {{allow: [{allow}]}}, '
                     f'subscribe: {{allow: [{sub}]}}, allow_responses: {{max: -1}}}}}}')
    users.append('{user: "admin", password: "admin-pw"}')
    return "authorization { users: [\n" + "\n".join(users) + "\n] }\n", {u: f"{u}-pw" for u in (*USERS, "admin")}


@dataclass
class Bus:
    server: NatsServer
    passwords: dict[str, str]
    accounts: bool

    def login(self, user: str) -> NatsSettings:
        api = permissions.api_prefix(user) if self.accounts else permissions.JS_API
        return NatsSettings(nats_user=user, nats_password=self.passwords[user], nats_inbox=permissions.inbox(user),
                            nats_api_prefix=api)

    def env(self, user: str) -> dict[str, str]:
        settings = self.login(user)
        return {"BINLAKE_NATS_URL": self.server.url, "BINLAKE_NATS_USER": user,
                "BINLAKE_NATS_PASSWORD": settings.nats_password, "BINLAKE_NATS_INBOX": settings.nats_inbox,
                "BINLAKE_NATS_API_PREFIX": settings.nats_api_prefix, "BINLAKE_METRICS_PORT": "-1"}


@pytest.fixture(params=["up", "compose", "one-account"])
def bus(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bus]:
    if request.param == "up":
        conf, passwords = _up_conf(tmp_path)
    elif request.param == "compose":
        conf, passwords = _compose_conf(monkeypatch)
    else:
        conf, passwords = _one_account_conf()
    path = tmp_path / "nats.conf"
    path.write_text(conf)
    server = start_nats(tmp_path / "nats", extra_args=["-c", str(path)])
    yield Bus(server, passwords, accounts=request.param != "one-account")
    server.stop()


async def _open(bus: Bus, user: str) -> NATS:
    return await connect(bus.server.url, f"escalation-{user}", auth=bus.login(user))


async def _contents(js: Any, streams: list[str]) -> dict[str, dict[int, tuple[str, bytes]]]:
    """Every message of every stream, by sequence (the streams here hold a few dozen)."""
    out: dict[str, dict[int, tuple[str, bytes]]] = {}
    for stream in streams:
        info = await js.stream_info(stream)
        held: dict[int, tuple[str, bytes]] = {}
        for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
            try:
                msg = await js.get_msg(stream, seq=seq)
            except nats.js.errors.NotFoundError:
                continue
            held[seq] = (msg.subject or "", msg.data or b"")
        out[stream] = held
    return out


async def _stream_names(js: Any) -> list[str]:
    return sorted(s.config.name or "" for s in await js.streams_info())


def _targets(accounts: bool, streams: list[str], keys: list[str]) -> list[str]:
    """Every subject an answer must not reach."""
    verbs = ["STREAM.PURGE", "STREAM.DELETE", "STREAM.MSG.DELETE", "STREAM.UPDATE", "STREAM.CREATE",
             "CONSUMER.CREATE"]
    prefixes = [permissions.JS_API, permissions.ROLE_API] if accounts else [permissions.JS_API]
    out = [f"{p}.{v}.{s}" for p in prefixes for v in verbs for s in streams]
    out += [NAMES.raw("main", "shop", "t"), NAMES.cdc("main", "shop", "t"), "binlake.dlq.main.x",
            f"$O.{NAMES.cdc_objects_bucket}.C.x", f"$O.{NAMES.raw_objects_bucket}.M.x"]
    out += keys
    out += [NAMES.meta_rpc(v) for v in ("cursor.put", "cursor.delete", "rewind", "schema.add")]
    out += [NAMES.store_client_rpc("main", v, "loader") for v in ("rollback", "unsubscribe", "ack")]
    return out


def _concrete(subject: str, consumers: dict[str, str]) -> str:
    """A subject a user may publish to, its wildcards filled in (with its consumer's name where one is meant)."""
    for stream, name in consumers.items():
        subject = subject.replace(f".CONSUMER.MSG.NEXT.{stream}.*", f".CONSUMER.MSG.NEXT.{stream}.{name}")
    return subject.replace(".*.", ".main.").replace(".*", ".x").replace(".>", ".x.y")


def _body(subject: str) -> bytes:
    """A request that JetStream answers without changing anything (not found, bad request), or a write."""
    if ".DIRECT.GET." in subject:
        return json.dumps({"seq": 10**9}).encode() if subject.count(".") <= 4 else b""
    if ".STREAM.MSG.GET." in subject:
        return json.dumps({"seq": 10**9}).encode()
    if ".CONSUMER.MSG.NEXT." in subject:
        return json.dumps({"batch": 5, "expires": 200_000_000}).encode()
    if ".STREAM.PURGE." in subject:  # the role's own right (an object replaced): a filter that matches nothing
        return json.dumps({"filter": "nothing.matches.this"}).encode()
    if subject.startswith(("$JS.", "binlake.meta.", "binlake.store.")):
        return b"\x00 not json"
    return MARK + subject.encode()


async def _sweep(bus: Bus, user: str, targets: list[str]) -> int:
    """Send every subject of `user`'s grant with every target as the reply, and create push consumers
    delivering to every target; the number of (user, subject, reply) tries."""
    grant = _grant(user)
    local = grant.local if bus.accounts else (lambda s: s)
    # What it may do itself anyway (a parser may purge its own objects bucket) is no escalation.
    targets = [t for t in targets if not any(subject_matches(local(p), t) for p in grant.publish)]
    nc = await _open(bus, user)
    js = nc.jetstream(prefix=bus.login(user).nats_api_prefix)
    tries = 0
    try:
        consumers: dict[str, str] = {}
        readable = sorted({s.split(".")[-2] for s in grant.publish if ".CONSUMER.MSG.NEXT." in s})
        for stream in readable:
            try:
                info = await js.add_consumer(stream, ConsumerConfig(ack_policy=AckPolicy.NONE, inactive_threshold=60.0))
            except nats.js.errors.Error as exc:
                if bus.accounts:
                    raise AssertionError(f"{user} cannot read {stream}: {exc}") from exc
                continue  # the control: an earlier user's sweep deleted it
            consumers[stream] = info.name or ""
        for subject in dict.fromkeys(grant.publish):
            concrete = _concrete(local(subject), consumers)
            for target in targets:
                await nc.publish(concrete, _body(concrete), reply=target)
                tries += 1
            await nc.flush()
        for stream in readable:  # a push consumer delivers into the streams' account
            for target in targets:
                try:
                    await js.add_consumer(stream, ConsumerConfig(deliver_subject=target, ack_policy=AckPolicy.NONE,
                                                                 inactive_threshold=5.0))
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
                    pass  # refused: fine
                tries += 1
        await asyncio.sleep(1.5)
    finally:
        await nc.close()
    return tries


def _allowed(user_grants: dict[str, permissions.Grant], stream: str, subject: str, data: bytes) -> bool:
    """Whether a new message is a write some user's grant allowed: its body names the subject it was
    sent to, which that grant covers, and it is stored under that subject (RAW adds a partition token)."""
    if not data.startswith(MARK):
        return False
    sent = data[len(MARK):].decode()
    if not any(any(subject_matches(p, sent) for p in g.publish) for g in user_grants.values()):
        return False
    parts = subject.split(".")
    return subject == sent or (stream == NAMES.raw_stream and ".".join(parts[:3] + parts[4:]) == sent)


@pytest.mark.timeout(600)
async def test_no_user_acts_outside_its_role_whatever_reply_it_names(bus: Bus, tmp_path: Path) -> None:
    admin_nc = await _open(bus, "admin")
    js = admin_nc.jetstream()
    services: list[ServiceProcess] = []
    try:
        await init.init(bus.server.url, bus.login("admin"), {})
        for subject in (NAMES.raw("main", "shop", "t"), NAMES.cdc("main", "shop", "t"), "binlake.dlq.main.x"):
            await js.publish(subject, b"setup " + subject.encode())
        keys = []
        for bucket, key in ((NAMES.cursors_bucket, "parser.main"), (NAMES.cursors_bucket, "client.main.loader"),
                            (NAMES.cursors_bucket, "sink.main.p0"), (NAMES.schema_bucket, "main.shop.t")):
            kv = await js.key_value(bucket)
            await kv.put(key, b'{"setup": true}')
            keys.append(f"$KV.{bucket}.{key}")
        for bucket in (NAMES.raw_objects_bucket, NAMES.cdc_objects_bucket):
            await (await js.object_store(bucket)).put("setup", b"x" * 1000)
        streams = await _stream_names(js)
        kept = [s for s in streams if s not in (f"KV_{NAMES.leases_bucket}", f"KV_{NAMES.members_bucket}")]
        before = await _contents(js, streams)  # the TTL buckets only must not get what no one wrote

        for module, role in (("services.meta", "meta"), ("services.store", "store")):
            services.append(ServiceProcess(module, bus.env(role), tmp_path / f"{role}.log").start())
        meta = MetaClient(admin_nc, NAMES.prefix, timeout_s=5.0)
        for _ in range(100):
            try:
                await meta.get("parser.main")
                break
            except (RpcError, NatsUnavailable):  # not up yet
                await asyncio.sleep(0.2)

        targets = _targets(bus.accounts, streams, keys)
        tries = {user: await _sweep(bus, user, targets) for user in USERS}
        print(f"(user, subject, reply) tries: {sum(tries.values())} {tries}")

        after = await _contents(js, await _stream_names(js))
        grants = {u: _grant(u) for u in USERS}
        problems = []
        for stream in streams:
            if stream not in after:
                problems.append(f"{stream} deleted")
                continue
            if stream in kept:
                lost = {seq: m for seq, m in before[stream].items() if after[stream].get(seq) != m}
                if lost:
                    problems.append(f"{stream} lost or changed {len(lost)} messages")
            forged = [(seq, subject, data[:60]) for seq, (subject, data) in after[stream].items()
                      if seq not in before[stream] and not _allowed(grants, stream, subject, data)]
            if forged:
                problems.append(f"{stream} got {len(forged)} messages no grant allows, e.g. {forged[:3]}")
        alive = all(p.running for p in services)
        if bus.accounts:
            assert not problems, problems
            assert alive, [p.output for p in services]
            assert await meta.get("parser.main") is not None
        else:  # the control: the same sweep does find the escalation in one account
            assert problems
    finally:
        for proc in services:
            proc.stop()
        await admin_nc.close()

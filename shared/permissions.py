"""Who may do what on the bus: binlake's NATS accounts and users, as nats-server configuration.

NATS enforces it, not binlake. Every stream and bucket lives in one account (`DATA`) that has no
user at all; each role, and each store client, is an account of its own with one user, and
reaches the streams, meta and the store only through the imports listed here (`Grant.publish`,
each subject as its owner names it). Accounts, not per-user permissions alone, because NATS
does not check the reply subject of a request: in one account, a direct get that finds
nothing, a pull request or a stored get answers to whatever reply subject the requester named,
from inside JetStream, so a reader could purge or forge into any stream. Across accounts an
answer goes back to the requester's own account, where nothing but its own imports listens.
`DATA` imports nothing and has no users, so nothing there listens on a subject a push
consumer's `deliver_subject` could name but the admin's inboxes, which no one else can guess
(tests/integration/test_bus_escalation.py tries all of it).

A role account has no JetStream of its own: it calls DATA's API under `ROLE_API`
(BINLAKE_NATS_API_PREFIX, `$JS.binlake.API`); the admin's account imports the whole API under
its usual name, and hears push consumers' deliveries into its inboxes, so the `nats` CLI works
as admin unchanged (but `nats sub` on a stream's subject: nothing published there reaches it).

Only `admin` may create or update a stream or bucket: whoever may define one can add a source,
a subject or a republish to it; `binlake init` (run by `binlake up` and the compose files'
`init` service) defines them all first. Only
`parser` and `sink` read BINLAKE_RAW (every database, unmasked), only the sink writes
BINLAKE_CDC, and a store client (`client_grant`) acts only as itself (and reads the CDC objects
bucket, `shared.objects`). `binlake up` runs its NATS with `server_config`;
deploy/nats/permissions.conf is `shipped()`.

Roles are not limited per source (a deployment's sources share a role's account), and meta
trusts the keys its callers name (the store's user may write any cursor through meta).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shared import bus
from shared.objects import object_stream
from shared.subjects import Names, escape_token, kv_stream

JS_API = "$JS.API"
ROLE_API = "$JS.binlake.API"
"""What a role's or a client's account calls the streams' JetStream API (BINLAKE_NATS_API_PREFIX)."""
DATA = "BINLAKE"
"""The account of every stream and bucket: no users, no imports."""

ROLES = ("parser", "sink", "store", "meta", "loader", "admin")
"""The services' users, and `admin` for the operator's commands (status, tail, snapshot, rewind)."""


def inbox(user: str) -> str:
    """The reply-subject prefix (BINLAKE_NATS_INBOX) of a user: it may subscribe to nothing else."""
    return f"_INBOX_{escape_token(user)}"


@dataclass
class Grant:
    """What one account (one user) may reach, and on which subjects it takes requests.

    `publish`: subjects as their owner names them (`owner`), each one an import of the account;
    `subscribe`: its own inbox and the subjects it serves; `responses`: it answers requests;
    `api`: its name for the streams' JetStream API."""

    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)
    responses: bool = False
    api: str = ROLE_API
    hears: list[str] = field(default_factory=list)  # subjects of the streams' account delivered to it

    def read(self, stream: str) -> Grant:
        """Read a stream: pull consumers of its own, direct and stored gets, acks."""
        self.publish += [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}",
                         f"$JS.API.CONSUMER.CREATE.{stream}.>", f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.*",
                         f"$JS.API.CONSUMER.INFO.{stream}.*", f"$JS.API.CONSUMER.DELETE.{stream}.*",
                         f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*", f"$JS.API.STREAM.MSG.GET.{stream}",
                         f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>", f"$JS.ACK.{stream}.>"]
        return self

    def bucket(self, bucket: str, writes: Iterable[str] = (), *, read: bool = True) -> Grant:
        """Read a KV bucket (or, `read=False`, only find it) and write (put, delete) the keys `writes`."""
        if read:
            self.read(kv_stream(bucket))
        else:
            self.publish.append(f"$JS.API.STREAM.INFO.{kv_stream(bucket)}")
        self.publish += [f"$KV.{bucket}.{key}" for key in writes]
        return self

    def objects(self, bucket: str, *, write: bool = False) -> Grant:
        """Read an object store bucket by direct gets, and with `write` put objects into it."""
        stream = object_stream(bucket)
        self.publish += [f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]
        if write:  # nats-py's put looks the bucket up, and a put replacing an object purges its old chunks
            self.publish += [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}",
                             f"$O.{bucket}.C.>", f"$O.{bucket}.M.>", f"$JS.API.STREAM.PURGE.{stream}"]
        return self

    def local(self, subject: str) -> str:
        """What this account calls `subject` (the streams' API under its own prefix)."""
        return self.api + subject[len(JS_API):] if subject.startswith(JS_API + ".") else subject

    def imports(self, names: Names) -> list[tuple[str, str, str]]:
        """(owner account, subject, local name) of each import."""
        return [(owner(names, s), s, self.local(s)) for s in dict.fromkeys(self.publish)]

    def permissions(self, indent: str) -> str:
        def block(subjects: Iterable[str]) -> str:
            inner = "".join(f"\n{indent}    {_quoted(s)}" for s in dict.fromkeys(subjects))
            return f"{{ allow: [{inner}\n{indent}  ] }}"

        lines = [f"publish: {block(self.local(s) for s in self.publish)}", f"subscribe: {block(self.subscribe)}"]
        if self.responses:
            # Any number of messages per request (a large store batch is sent in parts), for
            # as long as a long-poll `get` may wait.
            lines.append(f"allow_responses: {{ max: -1, expires: {_quoted(RESPONSE_WINDOW)} }}")
        return "{\n" + "".join(f"{indent}  {line}\n" for line in lines) + indent + "}"


RESPONSE_WINDOW = "10m"
"""How long an answer may take and go on: a store `get` long-polls, and a large batch comes in parts."""


def owner(names: Names, subject: str) -> str:
    """The account that answers `subject`: meta's and the store's requests, else the streams'."""
    if subject.startswith(f"{names.prefix}.meta."):
        return account("meta")
    if subject.startswith(f"{names.prefix}.store."):
        return account("store")
    return DATA


def _streamed(subject: str) -> bool:
    """Answered with several messages: a pull request's, or the store's parts of a batch."""
    return ".CONSUMER.MSG.NEXT." in subject or subject == f"{JS_API}.>" or ".store." in subject


def _quoted(subject: str) -> str:
    return '"' + subject.replace("\\", "\\\\").replace('"', '\\"') + '"'


def api_prefix(user: str) -> str:
    """The JetStream API's subjects in `user`'s account: the usual names for the admin only."""
    return JS_API if user == "admin" else ROLE_API


def login_env(user: str) -> dict[str, str]:
    """The BINLAKE_NATS_* settings (but the password) a role or a store client logs in with."""
    env = {"BINLAKE_NATS_USER": user, "BINLAKE_NATS_INBOX": inbox(user)}
    return env if user == "admin" else {**env, "BINLAKE_NATS_API_PREFIX": api_prefix(user)}


def account(role: str) -> str:
    """A role's account."""
    return role.upper()


def client_account(client: str) -> str:
    """A store client's account."""
    return f"CLIENT_{escape_token(client)}"


def _service(user: str) -> Grant:
    return Grant(publish=["$JS.API.INFO"], subscribe=[f"{inbox(user)}.>"])


def grants(names: Names) -> dict[str, Grant]:
    """Each role's grant for a deployment's prefix: its streams and buckets as `shared.bus` says, and its requests."""
    p = names.prefix
    roles = {role: _grant_bus(names, role, _service(role)) for role in ("parser", "sink", "store", "meta")}
    roles["loader"] = _grant_bus(names, "loader", client_grant(names, "loader", user="loader"))
    roles["loader"].publish.append("$JS.API.INFO")
    roles["parser"].publish.append(names.meta_rpc("schema.add"))
    roles["store"].publish += [names.meta_rpc(verb) for verb in ("cursor.get", "cursor.put", "cursor.delete", "rewind")]
    roles["store"].subscribe.append(f"{p}.store.>")
    roles["meta"].subscribe.append(f"{p}.meta.>")
    roles["store"].responses = roles["meta"].responses = True
    # The operator: every stream and bucket under the API's usual name (the `nats` CLI), meta
    # and the store; its account listens on nothing the others can make JetStream publish to.
    # Push consumers (the `nats` CLI's `kv ls`, `kv watch`) deliver in the streams' account: into
    # the admin's inboxes only, whose names no one else can guess.
    roles["admin"] = Grant(publish=[f"{JS_API}.>", "$KV.>", "$O.>", "$JS.ACK.>", "$JS.FC.>",
                                    *(s.subjects(names) for s in bus.STREAMS), f"{p}.meta.>", f"{p}.store.>"],
                           subscribe=[">"], responses=True, api=JS_API, hears=["_INBOX.>", f"{inbox('admin')}.>"])
    return roles


def _grant_bus(names: Names, role: str, grant: Grant) -> Grant:
    """Add to `grant` what `shared.bus` lets `role` do with each stream and bucket."""
    for stream in bus.STREAMS:
        if role in stream.reads:
            grant.read(stream.name(names))
        if role in stream.writes:
            grant.publish.append(stream.subjects(names))
        if role in stream.finds:
            grant.publish.append(f"{JS_API}.STREAM.INFO.{stream.name(names)}")
    for kv in bus.BUCKETS:
        if role in (*kv.reads, *kv.writes, *kv.finds):
            grant.bucket(kv.name(names), kv.writes.get(role, ()), read=role in kv.reads)
    for obj in bus.OBJECT_BUCKETS:
        if role in (*obj.reads, *obj.writes):
            grant.objects(obj.name(names), write=role in obj.writes)
        if role in obj.finds:
            grant.publish.append(f"{JS_API}.STREAM.INFO.{object_stream(obj.name(names))}")
    return grant


def client_grant(names: Names, client: str, *, user: str | None = None, source: str = "*") -> Grant:
    """A batch-protocol client's user: its own store subjects (any source unless `source`), its
    inbox, and what `shared.bus` grants every client."""
    token = "*" if source == "*" else escape_token(source)
    return _grant_bus(names, bus.CLIENT, Grant(publish=[f"{names.prefix}.store.{token}.*.{escape_token(client)}"],
                                               subscribe=[f"{inbox(user or client)}.>"]))


def _account_block(name: str, users: list[tuple[str, str, Grant]], imports: list[tuple[str, str, str]],
                   exports: Iterable[str] = (), *, jetstream: bool = False, hears: Iterable[str] = (),
                   delivers: Iterable[str] = ()) -> str:
    lines = ["    jetstream: enabled\n"] if jetstream else []
    if users:
        lines.append("    users: [\n" + "".join(
            f"      {{ user: {_quoted(user)}, password: {pw},\n"
            f"        permissions: {grant.permissions('        ')} }}\n" for user, pw, grant in users) + "    ]\n")
    imported = "".join(f"      {{ stream: {{ account: {_quoted(DATA)}, subject: {_quoted(subject)} }} }}\n"
                       for subject in hears)
    if imports:
        lines.append("    imports: [\n" + "".join(
            f"      {{ service: {{ account: {_quoted(acc)}, subject: {_quoted(subject)} }}"
            + (f", to: {_quoted(to)}" if to != subject else "") + " }\n" for acc, subject, to in imports)
            + imported + "    ]\n")
    exported = "".join(f"      {{ stream: {_quoted(subject)} }}\n" for subject in delivers)
    if exports or exported:
        lines.append("    exports: [\n" + "".join(
            f"      {{ service: {_quoted(subject)}"
            + (f", response: stream, threshold: {_quoted(RESPONSE_WINDOW)}" if _streamed(subject) else "") + " }\n"
            for subject in exports) + exported + "    ]\n")
    return f"  {_quoted(name)}: {{\n" + "".join(lines) + "  }\n"


def server_config(names: Names, passwords: Mapping[str, str], clients: Mapping[str, str] | None = None, *,
                  roles: bool = True) -> str:
    """nats-server `accounts` block: the streams' account, an account and user per role
    (`passwords[role]`, verbatim: a quoted string, or `$VAR` to take it from nats-server's
    environment), and one per store client."""
    members = [(account(role), role, passwords[role], grant) for role, grant in grants(names).items()] if roles else []
    members += [(client_account(client), client, pw, client_grant(names, client))
                for client, pw in (clients or {}).items()]
    # Meta and the store serve all their subjects (a client added later imports its own); the
    # streams' account exports only what some account imports.
    exports: dict[str, list[str]] = {DATA: [], account("meta"): [f"{names.prefix}.meta.>"],
                                     account("store"): [f"{names.prefix}.store.>"]}
    for _, _, _, grant in members:
        exports[DATA] += [subject for acc, subject, _ in grant.imports(names) if acc == DATA]
    delivers = [subject for *_, grant in members for subject in grant.hears]
    blocks = [_account_block(DATA, [], [], dict.fromkeys(exports[DATA]), jetstream=True,
                             delivers=dict.fromkeys(delivers))] if roles else []
    blocks += [_account_block(acc, [(user, pw, grant)], grant.imports(names),
                              dict.fromkeys(exports.get(acc, [])) if roles else (), hears=grant.hears)
               for acc, user, pw, grant in members]
    return "accounts {\n" + "".join(blocks) + "}\n"


SHIPPED_HEADER = """\
# binlake's NATS accounts and users, for `nats-server -c permissions.conf` (add your own
# jetstream, port and TLS settings, or `include` this file). Generated by
# `python -m shared.permissions`: do not edit, change shared/permissions.py. The passwords come
# from nats-server's environment: BINLAKE_<ROLE>_PASSWORD for the roles parser, sink, store,
# meta, loader and admin.
#
# The streams and buckets live in account BINLAKE, which has no user: each role is an account
# of its own that imports only what it needs, so no user can act outside its role, whatever
# reply subject it names. Each service connects as its role: BINLAKE_NATS_USER=<role>,
# BINLAKE_NATS_PASSWORD(_FILE), BINLAKE_NATS_INBOX=_INBOX_<role> and
# BINLAKE_NATS_API_PREFIX=$JS.binlake.API (its name for the streams' JetStream API). `admin` is
# for the operator's commands (binlake init, status, tail, snapshot, rewind) and the nats CLI,
# with the usual API names. Only parser and sink read BINLAKE_RAW. Only admin defines streams and
# buckets: run `binlake init` as admin before the services.
#
# A batch-protocol client gets an account of its own: it may only publish to its own store
# subjects (binlake.store.<source>.<verb>.<client>) and receive replies in its own inbox
# (connect with inbox prefix _INBOX_<client> and JetStream API prefix $JS.binlake.API; for
# binlake's StoreClient, BINLAKE_NATS_INBOX and api_prefix): it cannot read, ack, roll back or
# unsubscribe another client, rewind anyone, nor touch a stream or a bucket, except reading
# binlake_cdc_objects (events larger than a NATS message, which StoreClient fetches itself).
# For a client `app1`, add to the accounts below:
"""


def shipped() -> str:
    """deploy/nats/permissions.conf: each role's account, passwords from the environment; a client's as a comment."""
    passwords = {role: f"$BINLAKE_{role.upper()}_PASSWORD" for role in ROLES}
    example = server_config(Names(), {}, {"app1": "$APP1_PASSWORD"}, roles=False).splitlines()[1:-1]
    return SHIPPED_HEADER + "".join(f"#{line}\n" for line in example) + server_config(Names(), passwords)


if __name__ == "__main__":
    print(shipped(), end="")

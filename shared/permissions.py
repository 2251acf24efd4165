"""Who may do what on the bus: the NATS users of binlake's roles, as nats-server configuration.

NATS enforces it, not binlake: each role's user may publish and subscribe only on the subjects
listed here (its streams' JetStream API, its own KV keys, its own RPC subjects, its own reply
inbox `_INBOX_<user>`). Only `admin` may create or update a stream or bucket: whoever may
define one can add a source, a subject or a republish to it, and so read or write any other
stream; `binlake init` (run by `binlake up` and the compose files' `init` service) defines them
all first. Only `parser` and `sink` can read BINLAKE_RAW (every database, unmasked), only the
sink writes BINLAKE_CDC, and a store client user (`client_grant`) acts only as itself (and reads
the CDC objects bucket, `shared.objects`).
`binlake up` runs its NATS with `server_config`; deploy/nats/permissions.conf is `shipped()`.

Roles are not limited per source (a deployment's sources share a role's user), and meta trusts
the keys its callers name (the store's user may write any cursor through meta).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shared.objects import object_stream
from shared.subjects import Names, escape_token, kv_stream

ROLES = ("parser", "sink", "store", "meta", "loader", "admin")
"""The services' users, and `admin` for the operator's commands (status, tail, snapshot, rewind)."""


def inbox(user: str) -> str:
    """The reply-subject prefix (BINLAKE_NATS_INBOX) of a user: it may subscribe to nothing else."""
    return f"_INBOX_{escape_token(user)}"


@dataclass
class Grant:
    """What one user may publish and subscribe to; `responses`: it may answer the requests it gets."""

    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)
    responses: bool = False

    def read(self, stream: str) -> Grant:
        """Read a stream: consumers of its own, direct and stored gets, acks and flow control."""
        self.publish += [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}",
                         f"$JS.API.CONSUMER.CREATE.{stream}.>", f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.*",
                         f"$JS.API.CONSUMER.INFO.{stream}.*", f"$JS.API.CONSUMER.DELETE.{stream}.*",
                         f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*", f"$JS.API.STREAM.MSG.GET.{stream}",
                         f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>",
                         f"$JS.ACK.{stream}.>", f"$JS.FC.{stream}.>"]
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
        """Read an object store bucket by direct gets only (`shared.objects`: no consumer, whose
        deliver subject nats-server would not check), and with `write` put objects into it."""
        stream = object_stream(bucket)
        self.publish += [f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]
        if write:  # nats-py's put looks the bucket up, and a put replacing an object purges its old chunks
            self.publish += [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}",
                             f"$O.{bucket}.C.>", f"$O.{bucket}.M.>", f"$JS.API.STREAM.PURGE.{stream}"]
        return self

    def conf(self, indent: str) -> str:
        def block(subjects: list[str]) -> str:
            inner = "".join(f"\n{indent}    {_quoted(s)}" for s in dict.fromkeys(subjects))
            return f"{{ allow: [{inner}\n{indent}  ] }}"

        lines = [f"publish: {block(self.publish)}", f"subscribe: {block(self.subscribe)}"]
        if self.responses:
            # Any number of messages per request (a large store batch is sent in parts), for
            # as long as a long-poll `get` may wait.
            lines.append("allow_responses: { max: -1, expires: \"10m\" }")
        return "{\n" + "".join(f"{indent}  {line}\n" for line in lines) + indent + "}"


def _quoted(subject: str) -> str:
    return '"' + subject.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _service(user: str) -> Grant:
    return Grant(publish=["$JS.API.INFO"], subscribe=[f"{inbox(user)}.>"])


def grants(names: Names) -> dict[str, Grant]:
    """Each role's grant for a deployment's prefix."""
    raw, cdc, dlq, p = names.raw_stream, names.cdc_stream, names.dlq_stream, names.prefix
    cursors, leases, members, schema = (names.cursors_bucket, names.leases_bucket, names.members_bucket,
                                        names.schema_bucket)
    parser = _service("parser").read(raw).bucket(leases, ["parser.>"]).bucket(cursors, ["parser.>", "snapshot.>"])
    parser.objects(names.raw_objects_bucket, write=True)
    parser.publish += [names.raw_all, names.meta_rpc("schema.add")]
    sink = _service("sink").read(raw).read(cdc).bucket(members, ["sink.>"]).bucket(cursors, ["sink.>"])
    sink.objects(names.raw_objects_bucket).objects(names.cdc_objects_bucket, write=True)
    sink.publish += [names.cdc_all, names.dlq_all, f"$JS.API.STREAM.INFO.{dlq}"]
    store = _service("store").read(cdc)
    store.publish += [names.meta_rpc(verb) for verb in ("cursor.get", "cursor.put", "cursor.delete", "rewind")]
    store.publish.append(f"$JS.API.STREAM.INFO.{object_stream(names.cdc_objects_bucket)}")  # checks its TTL
    store.subscribe += [f"{p}.store.>"]
    store.responses = True
    meta = _service("meta").read(cdc).bucket(cursors, [">"]).bucket(schema, [">"])
    meta.subscribe += [f"{p}.meta.>"]
    meta.responses = True
    # It asks for a table to be read again (a snapshot request); it reads no cursor: snapshot
    # progress holds primary-key values.
    loader = (client_grant(names, "loader", user="loader").bucket(leases, ["loader.>"])
              .bucket(cursors, ["snapshot.*.request.>"], read=False))
    loader.publish += ["$JS.API.INFO"]
    admin = Grant(publish=[">"], subscribe=[">"], responses=True)
    return {"parser": parser, "sink": sink, "store": store, "meta": meta, "loader": loader, "admin": admin}


def client_grant(names: Names, client: str, *, user: str | None = None, source: str = "*") -> Grant:
    """A batch-protocol client's user: its own store subjects (any source unless `source`) and inbox."""
    token = "*" if source == "*" else escape_token(source)
    # The CDC objects (messages too large for NATS) it resolves itself: what the store would
    # hand it anyway, since a client picks its own table filter.
    return Grant(publish=[f"{names.prefix}.store.{token}.*.{escape_token(client)}"],
                 subscribe=[f"{inbox(user or client)}.>"]).objects(names.cdc_objects_bucket)


def server_config(names: Names, passwords: Mapping[str, str], clients: Mapping[str, str] | None = None, *,
                  roles: bool = True) -> str:
    """nats-server `authorization` block: a user per role (`passwords[role]`, verbatim: a quoted
    string, or `$VAR` to take it from nats-server's environment), and a user per store client."""
    users = [(role, passwords[role], grant) for role, grant in grants(names).items()] if roles else []
    users += [(client, pw, client_grant(names, client)) for client, pw in (clients or {}).items()]
    body = "".join(f"    {{ user: {_quoted(user)}, password: {pw},\n      permissions: {grant.conf('      ')} }}\n"
                   for user, pw, grant in users)
    return f"authorization {{\n  users = [\n{body}  ]\n}}\n"


SHIPPED_HEADER = """\
# binlake's NATS users, for `nats-server -c permissions.conf` (add your own jetstream, port and
# TLS settings, or `include` this file). Generated by `python -m shared.permissions`: do not edit,
# change shared/permissions.py. The passwords come from nats-server's environment:
# BINLAKE_<ROLE>_PASSWORD for the roles parser, sink, store, meta, loader and admin.
#
# Each service connects as its role: BINLAKE_NATS_USER=<role>, BINLAKE_NATS_PASSWORD(_FILE),
# BINLAKE_NATS_INBOX=_INBOX_<role>. `admin` is for the operator's commands (binlake init,
# status, tail, snapshot, rewind) and the nats CLI. Only parser and sink read BINLAKE_RAW. Only
# admin defines streams and buckets: run `binlake init` as admin before the services.
#
# A batch-protocol client gets a user of its own: it may only publish to its own store
# subjects (binlake.store.<source>.<verb>.<client>) and receive replies in its own inbox
# (connect with inbox prefix _INBOX_<client>; BINLAKE_NATS_INBOX for binlake's StoreClient):
# it cannot read, ack, roll back or unsubscribe another client, rewind anyone, nor touch a
# stream or a bucket, except reading binlake_cdc_objects (events larger than a NATS message,
# which StoreClient fetches itself). For a client `app1`, add to the users below:
"""


def shipped() -> str:
    """deploy/nats/permissions.conf: each role's user, passwords from the environment; a client's as a comment."""
    passwords = {role: f"$BINLAKE_{role.upper()}_PASSWORD" for role in ROLES}
    example = server_config(Names(), {}, {"app1": "$APP1_PASSWORD"}, roles=False).splitlines()[2:-2]
    return SHIPPED_HEADER + "".join(f"#{line[3:]}\n" for line in example) + server_config(Names(), passwords)


if __name__ == "__main__":
    print(shipped(), end="")

"""Every stream and bucket binlake keeps on NATS, and which role may do what with each.

The one table: `binlake init` defines exactly these (`define_all`), the NATS accounts grant
exactly this (`shared.permissions.grants`), and the tests check both against it. A role reads
a stream or a bucket (its own consumers, gets), writes it (publishes; for a KV bucket, the keys
named), or only finds it (stream info). `CLIENT` stands for every batch-protocol client of the
store (`shared.permissions.client_grant`), the loader among them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from nats.js import JetStreamContext

from shared import jetstream, objects
from shared.jetstream import Limits
from shared.subjects import Names

CLIENT = "client"
LEASE_TTL_S = 15.0  # the parser's and loader's default `lease_ttl_s`; their leases adapt to the bucket's
MEMBER_TTL_S = 15.0  # the sink's default `member_ttl_s`
CURSOR_HISTORY = 16  # revisions a cursor keeps: `nats kv history` shows where a reader was


@dataclass(frozen=True)
class Stream:
    key: str  # as settings name it: BINLAKE_<KEY>_MAX_AGE_S
    name: Callable[[Names], str]
    subjects: Callable[[Names], str]
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    finds: tuple[str, ...] = ()


@dataclass(frozen=True)
class KvBucket:
    name: Callable[[Names], str]
    writes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # role -> the keys it puts and deletes
    reads: tuple[str, ...] = ()
    finds: tuple[str, ...] = ()
    ttl_s: float | None = None
    history: int = 1


@dataclass(frozen=True)
class ObjectBucket:
    name: Callable[[Names], str]
    follows: str  # the stream whose messages name its objects: they live as long (`shared.objects`)
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    finds: tuple[str, ...] = ()


STREAMS = (
    Stream("raw", attrgetter("raw_stream"), attrgetter("raw_all"), reads=("parser", "sink"), writes=("parser",)),
    Stream("cdc", attrgetter("cdc_stream"), attrgetter("cdc_all"), reads=("sink", "store", "meta"),
           writes=("sink",)),
    Stream("dlq", attrgetter("dlq_stream"), attrgetter("dlq_all"), writes=("sink",), finds=("sink",)),
)
BUCKETS = (
    KvBucket(attrgetter("leases_bucket"), {"parser": ("parser.>",), "loader": ("loader.>",)},
             reads=("parser", "loader"), ttl_s=LEASE_TTL_S),
    # The loader asks for a table to be read again (a snapshot request) and says which tables it
    # set aside; it reads no cursor: snapshot progress holds primary-key values.
    KvBucket(attrgetter("cursors_bucket"), {"parser": ("parser.>", "snapshot.>"), "sink": ("sink.>",),
                                            "meta": (">",), "loader": ("snapshot.*.request.>", "loader.>")},
             reads=("parser", "sink", "meta"), finds=("loader",), history=CURSOR_HISTORY),
    KvBucket(attrgetter("members_bucket"), {"sink": ("sink.>",)}, reads=("sink",), ttl_s=MEMBER_TTL_S),
    KvBucket(attrgetter("schema_bucket"), {"meta": (">",)}, reads=("meta",)),
)
OBJECT_BUCKETS = (
    ObjectBucket(attrgetter("raw_objects_bucket"), "raw", reads=("sink",), writes=("parser",)),
    # The store checks its TTL against BINLAKE_CDC's age; a client resolves the events larger
    # than a NATS message itself, what the store would hand it anyway.
    ObjectBucket(attrgetter("cdc_objects_bucket"), "cdc", reads=(CLIENT,), writes=("sink",), finds=("store",)),
)


def stream(key: str) -> Stream:
    return next(s for s in STREAMS if s.key == key)


def names_of(names: Names) -> list[str]:
    """Every stream and bucket of a deployment, in the order `define_all` defines them."""
    return ([s.name(names) for s in STREAMS] + [b.name(names) for b in BUCKETS]
            + [b.name(names) for b in OBJECT_BUCKETS])


async def define_all(js: JetStreamContext, names: Names, partitions: int, replicas: int,
                     limits: Mapping[str, Limits]) -> list[str]:
    """As the admin: every stream and bucket created; of those that exist, the streams' `limits`
    and atomic batches, the object buckets' TTL (after their stream's age) and the KV buckets'
    rollups (off) brought up to date, a KV bucket's TTL and history kept as they are; their names."""
    await jetstream.ensure_streams(js, names, partitions, replicas, limits=limits, repair=True)
    for obj in OBJECT_BUCKETS:
        await objects.ensure_bucket(js, obj.name(names), stream(obj.follows).name(names), replicas=replicas,
                                    update=True)
    for kv in BUCKETS:
        await jetstream.ensure_kv(js, kv.name(names), ttl_s=kv.ttl_s, history=kv.history, replicas=replicas,
                                  repair=True)
    return names_of(names)

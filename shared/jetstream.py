"""NATS connection and JetStream definitions shared by every service."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RawStreamMsg,
    StorageType,
    StreamConfig,
    StreamInfo,
    SubjectTransform,
)
from nats.js.kv import KeyValue

from shared.errors import ConfigError, NatsUnavailable, StoreFull, StreamMismatch, StreamRedefined
from shared.logging import redact
from shared.nats_client import Client
from shared.subjects import STREAMS, Names, kv_stream, kv_subject

if TYPE_CHECKING:  # shared.config needs shared.actor, which needs this module
    from shared.config import NatsSettings

log = structlog.get_logger()
NAME_IN_USE = 10058  # JetStream: "stream name already in use with a different configuration"
DUPLICATES_OVER_AGE = 10052  # "duplicates window can not be larger then max age"


def login_options(auth: NatsSettings, servers: list[str]) -> dict[str, Any]:
    """nats.connect's keyword arguments for the login and TLS settings."""
    opts: dict[str, Any] = {"inbox_prefix": auth.nats_inbox}
    if auth.nats_user:
        opts.update(user=auth.nats_user, password=auth.nats_password)
    if auth.nats_token:
        opts["token"] = auth.nats_token
    if auth.nats_creds:
        opts["user_credentials"] = auth.nats_creds
    if auth.nats_nkey_seed:
        opts["nkeys_seed"] = auth.nats_nkey_seed
    if auth.nats_tls_ca or auth.nats_tls_cert or any(u.startswith("tls://") for u in servers):
        try:
            tls = ssl.create_default_context(cafile=auth.nats_tls_ca or None)
            if auth.nats_tls_cert:
                tls.load_cert_chain(auth.nats_tls_cert, auth.nats_tls_key)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ConfigError(f"NATS TLS settings (BINLAKE_NATS_TLS_CA/_CERT/_KEY) cannot be used: {exc}") from None
        opts["tls"] = tls
        # TLS before any byte of ours, on every (re)connection: a peer that does not speak TLS
        # never sees CONNECT, with its password, in clear (the server needs handshake_first).
        opts["tls_handshake_first"] = True
    return opts


def _refusal(exc: BaseException, shown: str) -> str | None:
    """What to fix when the server refused the connection (not merely unreachable)."""
    text = str(exc).lower()
    if "authorization" in text or "authentication" in text or "permissions violation" in text:
        return (f"NATS at {shown} refused the login ({exc}); set the credentials binlake connects with: "
                "BINLAKE_NATS_USER and _PASSWORD, _TOKEN, _CREDS or _NKEY_SEED (each also as *_FILE)")
    if isinstance(exc, ssl.SSLError) or "tls" in text or "certificate" in text:
        return (f"TLS with NATS at {shown} failed ({exc!r}); binlake starts TLS before it sends anything, so the "
                "server needs TLS with `tls { handshake_first: true }` in its configuration (nats-server 2.10 or "
                "later), and BINLAKE_NATS_TLS_CA the CA that signed the server's certificate "
                "(BINLAKE_NATS_TLS_CERT/_KEY if it verifies clients)")
    return None


async def connect(url: str, name: str, *, auth: NatsSettings | None = None, connect_timeout: float = 5.0,
                  first_connect_s: float = 10.0) -> NATS:
    """Connect with reconnect-forever settings.

    `url` may list several servers of a cluster, comma-separated: the client picks one and
    fails over to the others. The first connection is retried for `first_connect_s` (a
    compose stack may start NATS later than the service); then an unreachable server raises
    NatsUnavailable, a refused login or TLS handshake ConfigError. `auth` defaults to the
    BINLAKE_NATS_* settings of the environment.
    """
    from shared.config import NatsSettings

    servers = server_urls(url)
    auth = auth if auth is not None else NatsSettings.from_env()
    login = login_options(auth, servers)
    shown = ",".join(redact(u) for u in servers)

    seen_errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        seen_errors[:] = [*seen_errors[-4:], exc]  # a refused login shows here first
        if "permissions violation" in str(exc).lower():
            # The request it refused only times out: say here what to change.
            log.error("nats.permission_denied", error=str(exc), user=auth.nats_user or None,
                      fix="give this user its role's permissions (shared/permissions.py, "
                          "deploy/nats/permissions.conf)")
            return
        log.warning("nats.error", error=repr(exc))

    holder: list[NATS] = []

    async def on_disconnected() -> None:
        nc = holder[0] if holder else None
        if nc is not None and (nc.is_closed or nc.is_draining):
            return  # our own close, not an outage
        log.warning("nats.disconnected", url=shown)

    async def on_reconnected() -> None:
        log.info("nats.reconnected", url=shown)

    try:
        nc = Client()
        holder.append(nc)
        options: dict[str, Any] = dict(  # nats-py types whole seconds, and takes fractions
            name=name, connect_timeout=connect_timeout, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            ping_interval=10, max_outstanding_pings=3, allow_reconnect=True, error_cb=on_error,
            disconnected_cb=on_disconnected, reconnected_cb=on_reconnected, **login)
        await asyncio.wait_for(nc.connect(servers, **options), first_connect_s)
    except (OSError, nats.errors.Error, TimeoutError) as exc:
        refused = _refusal(exc, shown) or next((r for e in seen_errors if (r := _refusal(e, shown))), None)
        if refused:
            raise ConfigError(refused) from exc
        raise NatsUnavailable(f"cannot reach NATS at {shown} ({exc!r}); start nats-server -js or fix the URL") \
            from exc
    return nc


def server_urls(url: str) -> list[str]:
    """`nats://a:4222,nats://b:4222` -> each server's URL (BINLAKE_NATS_URL may name a whole cluster)."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not servers:
        raise ConfigError("BINLAKE_NATS_URL is empty; set it to nats://host:4222 (several: comma-separated)")
    return servers


# What a bus that is away for a moment (a restart, a JetStream leader election) raises.
TRANSIENT: tuple[type[BaseException], ...] = (
    TimeoutError, nats.errors.TimeoutError, nats.errors.ConnectionClosedError, nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError)


NO_ROOM = frozenset({10023, 10047, 10002})
"""JetStream's "insufficient resources", "insufficient storage resources available", "resource
limits exceeded for account": the server's or the account's storage limit is reached."""


def store_full(exc: BaseException, stream: str, what: str) -> StoreFull | None:
    """The StoreFull to raise when JetStream refused `what` for want of room, else None."""
    if not (isinstance(exc, nats.js.errors.APIError) and exc.err_code in NO_ROOM):
        return None
    return StoreFull(
        f"JetStream has no room for {what} in {stream} ({exc.description}): free disk space on the NATS "
        "servers, raise JetStream's storage limit (`jetstream { max_file_store }`; `binlake up`: "
        "BINLAKE_NATS_MAX_STORE), or keep less (BINLAKE_RAW_/_CDC_/_DLQ_MAX_AGE_S and _MAX_BYTES, "
        "applied by `binlake init`); binlake goes on by itself once there is room, and loses nothing while the "
        "source keeps its binlogs")


@contextlib.contextmanager
def nats_errors(what: str) -> Iterator[None]:
    """Translate timeouts and lost connections into retriable NatsUnavailable, a refusal for want
    of room into StoreFull (waited out)."""
    try:
        yield
    except TRANSIENT as exc:
        raise (store_full(exc, what, "a write") or NatsUnavailable(f"{what}: {exc!r}")) from exc


Limits = tuple[float, int]
"""A stream's (max age in seconds, 0 = none; max bytes, -1 = none): `ServiceConfig.stream_limits`."""
DUPLICATE_WINDOW_S = 300.0  # a stream's age limit may not be shorter (JetStream refuses it)
RAW_LIMITS: Limits = (7 * 86400.0, -1)
CDC_LIMITS: Limits = (7 * 86400.0, -1)
DLQ_LIMITS: Limits = (0.0, -1)  # dead letters wait for a person


def raw_stream_config(names: Names, partitions: int, *, replicas: int = 1,
                      duplicate_window_s: float = DUPLICATE_WINDOW_S,
                      limits: Limits = RAW_LIMITS) -> StreamConfig:
    src, dest = names.raw_transform(partitions)
    return StreamConfig(
        name=names.raw_stream, subjects=[names.raw_all], storage=StorageType.FILE,
        duplicate_window=duplicate_window_s, max_age=limits[0], max_bytes=limits[1],
        discard=DiscardPolicy.OLD, subject_transform=SubjectTransform(src=src, dest=dest), num_replicas=replicas,
        allow_direct=True, description="binlake: raw binlog changes, partitioned per table",
    )


def cdc_stream_config(names: Names, *, replicas: int = 1, duplicate_window_s: float = DUPLICATE_WINDOW_S,
                      limits: Limits = CDC_LIMITS) -> StreamConfig:
    """BINLAKE_CDC: the durable, per-table-ordered stream clients read."""
    return StreamConfig(
        name=names.cdc_stream, subjects=[names.cdc_all], storage=StorageType.FILE,
        duplicate_window=duplicate_window_s, max_age=limits[0], max_bytes=limits[1],
        discard=DiscardPolicy.OLD, allow_direct=True, num_replicas=replicas,
        description="binlake: routed change events per table",
        allow_atomic=True,  # the sink's fenced batches; a server before 2.12 drops the field
    )


def dlq_stream_config(names: Names, *, replicas: int = 1, limits: Limits = DLQ_LIMITS) -> StreamConfig:
    """BINLAKE_DLQ: events a service could not process, with the reason in a header."""
    return StreamConfig(
        name=names.dlq_stream, subjects=[names.dlq_all], storage=StorageType.FILE, max_age=limits[0],
        max_bytes=limits[1], duplicate_window=DUPLICATE_WINDOW_S, discard=DiscardPolicy.OLD, num_replicas=replicas,
        description="binlake: dead letters",
    )


async def ensure_stream(js: JetStreamContext, config: StreamConfig, *, repair: bool = False) -> StreamInfo:
    """Create the stream, or check that the existing one is compatible (same subject transform).

    `repair` (the admin's `binlake init`): also give an existing stream the configured limits
    (age, bytes) and what this binlake needs (atomic batches). A service only says what differs:
    with a NATS user per service it may not change streams (`shared.permissions`).
    """
    assert config.name is not None
    with nats_errors(f"stream {config.name}"):
        try:
            info = await js.stream_info(config.name)
        except nats.js.errors.NotFoundError:
            try:
                return await js.add_stream(config)
            except nats.js.errors.APIError as exc:
                if exc.err_code != NAME_IN_USE:
                    raise _refused(config, exc) from exc
                # Another service created it since (the store with its retention, say): check that one.
                info = await js.stream_info(config.name)
    have = info.config.subject_transform
    want = config.subject_transform
    if (have.dest if have else None) != (want.dest if want else None):
        raise StreamMismatch(
            f"stream {config.name} exists with subject transform {have.dest if have else None!r}, "
            f"this configuration needs {want.dest if want else None!r}; partitions are fixed at creation, "
            "set the partition count back or recreate the stream"
        )
    changes: dict[str, Any] = {}
    if config.allow_atomic and not info.config.allow_atomic:  # created by an older binlake
        changes["allow_atomic"] = True
    if (limits_of(info.config)) != limits_of(config):
        changes.update(max_age=config.max_age, max_bytes=config.max_bytes)
    if not changes:
        return info
    if not repair:
        log.warning("stream.differs", stream=config.name, wanted=changes,
                    fix="run `binlake init` as NATS admin with the same settings (nats-server >= 2.12 for atomic "
                        "batches) to apply them")
        return info
    log.info("stream.update", stream=config.name, **changes)
    with nats_errors(f"stream {config.name}"):
        try:
            return await js.update_stream(dataclasses.replace(info.config, **changes))
        except nats.js.errors.APIError as exc:
            raise _refused(config, exc) from exc


def _refused(config: StreamConfig, exc: nats.js.errors.APIError) -> Exception:
    """What to change when JetStream refuses a stream's definition; other errors as they are."""
    if exc.err_code in NO_ROOM:
        return ConfigError(
            f"JetStream refuses {config.name} with max_bytes {config.max_bytes} ({exc.description}): it reserves "
            "each stream's max bytes against its storage limit, and the streams' BINLAKE_*_MAX_BYTES together "
            "exceed what is left; lower them, or raise the server's max_file_store (`binlake up`: "
            "BINLAKE_NATS_MAX_STORE)")
    if exc.err_code == DUPLICATES_OVER_AGE:
        return ConfigError(f"JetStream refuses {config.name} with max age {config.max_age}s ({exc.description}); "
                           f"an age limit must be 0 or at least {DUPLICATE_WINDOW_S:.0f} s")
    return exc


def limits_of(config: StreamConfig) -> Limits:
    """A stream's (max age, max bytes), as the server reports them (None for none)."""
    return float(config.max_age or 0), int(config.max_bytes if config.max_bytes is not None else -1)


async def allows_atomic(js: JetStreamContext, stream: str) -> bool:
    """Whether `stream` takes atomic batches (the server knows them and the stream allows them)."""
    with nats_errors(f"stream {stream}"):
        info = await js.stream_info(stream)
    return bool(info.config.allow_atomic)


@dataclasses.dataclass(frozen=True)
class StreamIdentity:
    """Which definition of a stream a cursor's sequences belong to, and how far that stream reaches.

    `id` is the stream's creation time as the server reports it: a stream deleted and defined
    again (an operator's reset, a lost volume and `binlake init`) gets a new one, and its
    sequences start at 1 again. Every cursor into a stream records the `id` it counts in.
    """

    id: str
    first_seq: int
    last_seq: int

    def check(self, stream: str, recorded: str, cursor: int, reader: str, resume: str) -> None:
        """StreamRedefined when a cursor at `cursor`, counted in stream definition `recorded`, cannot go on
        here: the stream was defined again, or it ends before the cursor. `resume`: the operator's way on."""
        if recorded and recorded != self.id:
            why = (f"{stream} was deleted and defined again (created {self.id}; {reader} counted its position "
                   f"{cursor} in the stream created {recorded}): its sequences started again at 1")
        elif cursor > self.last_seq:
            why = (f"{stream} ends at sequence {self.last_seq}, before {reader}'s position {cursor} (messages "
                   "were lost, or the stream was defined again)")
        else:
            return
        raise StreamRedefined(f"{why}. Going on would skip or misread messages, so {reader} stops. Changes "
                              f"published in between may be lost to it: snapshot the affected tables again "
                              f"(binlake snapshot) if needed, then resume deliberately: {resume}")


async def stream_identity(js: JetStreamContext, stream: str) -> StreamIdentity:
    """The current definition of `stream` (NatsUnavailable when it cannot be asked, or is missing:
    an operator's reset deletes it and `binlake init` defines it again a moment later)."""
    with nats_errors(f"stream {stream}"):
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError as exc:
            raise NatsUnavailable(f"stream {stream} does not exist; waiting for it (binlake init defines it)") from exc
    created = info.created.isoformat() if info.created is not None else ""
    return StreamIdentity(created, int(info.state.first_seq), int(info.state.last_seq))


async def ensure_streams(js: JetStreamContext, names: Names, partitions: int, replicas: int = 1, *,
                         streams: tuple[str, ...] = STREAMS, limits: Mapping[str, Limits] | None = None,
                         repair: bool = False) -> None:
    """BINLAKE_RAW (with `partitions`), BINLAKE_CDC and BINLAKE_DLQ, or those of them in `streams`
    (the ones a service uses), created when missing, with `limits[stream]` (else the defaults).
    With a NATS user per service only the admin may create them (`binlake init`,
    `shared.permissions`); then this only checks them.

    `replicas` applies when a stream is created; an existing stream keeps its own (change it
    with `nats stream edit --replicas`).
    """
    limits = limits or {}
    configs = {"raw": lambda: raw_stream_config(names, partitions, replicas=replicas,
                                                limits=limits.get("raw", RAW_LIMITS)),
               "cdc": lambda: cdc_stream_config(names, replicas=replicas, limits=limits.get("cdc", CDC_LIMITS)),
               "dlq": lambda: dlq_stream_config(names, replicas=replicas, limits=limits.get("dlq", DLQ_LIMITS))}
    for stream in streams:
        await ensure_stream(js, configs[stream](), repair=repair)


async def ensure_kv(js: JetStreamContext, bucket: str, *, ttl_s: float | None = None, history: int = 1,
                    replicas: int = 1, repair: bool = False) -> KeyValue:
    """The bucket, created with `replicas` copies when it does not exist yet.

    Without rollup headers: with them, one put of a writer's own key carrying `Nats-Rollup: all`
    would purge every other key of the bucket (binlake never purges). A bucket that an older
    binlake created has them until `binlake init` (`repair`, as admin) turns them off.
    """
    with nats_errors(f"bucket {bucket}"):
        try:
            kv = await js.key_value(bucket)
            created = False
        except nats.js.errors.BucketNotFoundError:
            try:
                kv = await js.create_key_value(
                    KeyValueConfig(bucket=bucket, ttl=ttl_s, history=history, storage=StorageType.FILE,
                                   replicas=replicas)
                )
                created = True
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != NAME_IN_USE:
                    raise
                kv, created = await js.key_value(bucket), False  # another service created it since, its way
        if created or repair:
            info = await js.stream_info(kv_stream(bucket))
            if info.config.allow_rollup_hdrs:
                await js.update_stream(dataclasses.replace(info.config, allow_rollup_hdrs=False))
        return kv


async def last_msg(js: JetStreamContext, stream: str, subject: str) -> RawStreamMsg | None:
    """The newest message of `stream` matching `subject` (wildcards allowed), or None."""
    with nats_errors(f"last message of {stream}"):
        try:
            return await js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None


async def kv_entries(js: JetStreamContext, bucket: str, key_filter: str = ">") -> list[tuple[str, bytes, int]]:
    """(key, value, revision) of every live key matching `key_filter`, read once.

    nats.py's KV `keys()`/`watch()` leave an ephemeral consumer behind per call and can end
    before their initial values arrived; this reads the bucket's stream with a short-lived
    last-per-subject consumer until nothing is pending, then deletes it.
    """
    stream, prefix = kv_stream(bucket), kv_subject(bucket, "")
    cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                         filter_subject=kv_subject(bucket, key_filter), mem_storage=True, inactive_threshold=10.0)
    out: list[tuple[str, bytes, int]] = []
    with nats_errors(f"bucket {bucket}"):
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            return out
        if info.state.messages == 0:
            return out
        sub = await js.pull_subscribe(kv_subject(bucket, key_filter), stream=stream, config=cfg)
        try:
            # Fetch exactly what is pending: a fetch of more waits out its whole timeout.
            pending = (await sub.consumer_info()).num_pending or 0
            while pending > 0:
                try:
                    msgs = await sub.fetch(min(500, pending), timeout=5.0)
                except (nats.errors.TimeoutError, TimeoutError):
                    break
                for m in msgs:
                    op = (m.headers or {}).get("KV-Operation")
                    if op not in ("DEL", "PURGE"):
                        out.append((m.subject[len(prefix):], m.data, m.metadata.sequence.stream))
                pending = msgs[-1].metadata.num_pending if msgs else 0
        finally:
            name = getattr(sub, "_consumer", None)
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
                await sub.unsubscribe()
                if name:
                    await js.delete_consumer(stream, name)
    return out


def header(msg: Any, key: str) -> str | None:
    hdrs = getattr(msg, "headers", None) or {}
    value = hdrs.get(key)
    return str(value) if value is not None else None

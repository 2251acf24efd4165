"""Messages too large for NATS: the envelope in a JetStream object store, a reference in the stream.

One row can be larger than `max_payload` (a 64 MiB LONGBLOB). Such a message travels as a
*reference envelope*: its small fields (`KEPT`) with `rows` empty and `ref` = `{"bucket",
"name", "size", "sha256"}`, header `Binlake-Object: <bucket>/<name>`; the object holds the whole envelope's
msgpack bytes. The parser puts its objects in the raw bucket (`binlake_raw_objects`, read only by
the sink, like BINLAKE_RAW); the sink resolves them, applies its rules, and puts what is still
too large in the CDC bucket (`binlake_cdc_objects`), which the store client, `binlake tail` and
the loader resolve transparently. Each bucket's objects live as long as its stream's messages
plus a day (`object_ttl`). `nats object ls binlake_cdc_objects` shows them.

An object is named after its message id and a digest of its bytes (`Ref.of_data`), so a replay
after a crash finds it already there (the put is skipped unless the object is old) and other
bytes never replace what a stored reference names; a reader that cannot get an object
(expired, removed, corrupt) raises `ObjectMissing`, never skips the message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import hashlib
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import msgpack
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType

from shared import envelope
from shared.errors import ConfigError, FatalError, NatsUnavailable
from shared.jetstream import NAME_IN_USE, nats_errors, store_full

log = structlog.get_logger()
REF: Final = "ref"
VERSION: Final = envelope.REF_VERSION  # a reader that cannot resolve a reference refuses it, never reads "no rows"
_REF_KEY: Final = msgpack.packb(REF)
# What a reference keeps of its envelope: the small fields that order, route and resume it
# (`rows`, `schema`, `ddl` and `alter` can be what made it too large).
KEPT: Final = frozenset({"v", "source", "db", "table", "op", "ts", "pos", "scn", "chunk", "txn", "pk", "resume"})
HEADER: Final = "Binlake-Object"
MARGIN_S: Final = 86_400.0  # objects outlive the messages that name them by a day


class ObjectMissing(FatalError):
    """A reference names an object the bucket does not hold (whole)."""


@dataclasses.dataclass(frozen=True)
class Ref:
    bucket: str
    name: str
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of_data(cls, bucket: str, msg_id: str, data: bytes) -> Ref:
        """The reference for `data`, the encoded envelope of message `msg_id`, stored in `bucket`."""
        digest = hashlib.sha256(data).hexdigest()
        return cls(bucket, f"{msg_id}.{digest[:16]}", len(data), digest)

    @classmethod
    def of(cls, env: Mapping[str, Any], bucket: str | None = None) -> Ref | None:
        """The reference an envelope carries (None for an ordinary one), which must name `bucket`
        when given; EnvelopeError when malformed."""
        ref = env.get(REF)
        if ref is None:
            if env.get("v") == VERSION:
                raise envelope.EnvelopeError(f"envelope version {VERSION} without an object reference")
            return None
        if not isinstance(ref, dict) or not isinstance(ref.get("bucket"), str) or not isinstance(
                ref.get("name"), str) or not isinstance(ref.get("size"), int) or not isinstance(ref.get("sha256"), str):
            raise envelope.EnvelopeError(f"malformed object reference {str(ref)[:200]!r}")
        if env.get("v") != VERSION or ref["size"] < 0 or len(ref["sha256"]) != 64 or env.get("rows") \
                or not 0 < len(ref["name"]) <= 512:
            raise envelope.EnvelopeError(f"malformed object reference {str(ref)[:200]!r}")
        if bucket is not None and ref["bucket"] != bucket:
            raise envelope.EnvelopeError(f"object reference to bucket {ref['bucket'][:80]!r}, expected {bucket}")
        return cls(ref["bucket"], ref["name"], ref["size"], ref["sha256"])


def object_stream(bucket: str) -> str:
    """The stream nats-server keeps an object store bucket in."""
    return f"OBJ_{bucket}"


def object_ttl(stream_max_age_s: float | None) -> float | None:
    """How long a bucket keeps objects: its stream's message age plus a day; forever when the stream is."""
    return stream_max_age_s + MARGIN_S if stream_max_age_s else None


def reference(env: Mapping[str, Any], data: bytes, bucket: str, msg_id: str) -> dict[str, Any]:
    """The reference envelope for `env`, whose encoding `data` goes to `bucket`."""
    return referring(env, Ref.of_data(bucket, msg_id, data))


def referring(env: Mapping[str, Any], ref: Ref) -> dict[str, Any]:
    """The reference envelope that stands for `env` in its stream, naming the object `ref`."""
    return {**{k: v for k, v in env.items() if k in KEPT}, "v": VERSION, "rows": [], REF: ref.to_dict()}


def resolved_size(data: bytes) -> int:
    """The bytes a reader holds for this message once it has resolved it (`resolve`): the object's
    size for a reference envelope, its own size otherwise. A malformed reference counts as itself:
    resolving it is what refuses it, with the reason."""
    if not maybe_reference(data):
        return len(data)
    try:
        ref = Ref.of(envelope.decode(data))
    except envelope.EnvelopeError:
        return len(data)
    return len(data) if ref is None else max(ref.size, len(data))


def maybe_reference(data: bytes) -> bool:
    """Cheap pre-check: False means `data` is certainly no reference envelope."""
    return _REF_KEY in data


async def ensure_bucket(js: JetStreamContext, bucket: str, follows: str, *, replicas: int = 1,
                        update: bool = False) -> None:
    """Create the bucket when missing, its objects kept as long as stream `follows` keeps messages
    (`object_ttl`); `update` (the stream's owner, or `binlake init`) also brings an existing
    bucket's TTL in line with the stream's age limit now."""
    with nats_errors(f"object bucket {bucket}"):
        ttl_s = object_ttl((await js.stream_info(follows)).config.max_age)
        try:
            info = await js.stream_info(object_stream(bucket))
        except nats.js.errors.NotFoundError:
            try:
                await js.create_object_store(bucket, ObjectStoreConfig(
                    bucket=bucket, ttl=ttl_s, storage=StorageType.FILE, replicas=replicas,
                    description=f"binlake: messages of {follows} larger than max_payload"))
                return
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != NAME_IN_USE:
                    raise
                info = await js.stream_info(object_stream(bucket))  # another service created it since
        if update and (info.config.max_age or 0) != (ttl_s or 0):
            await js.update_stream(dataclasses.replace(info.config, max_age=ttl_s or 0))


async def ensure_or_warn(js: JetStreamContext, bucket: str, follows: str, *, replicas: int = 1) -> None:
    """`ensure_bucket` for a service: a bucket it may not create (a NATS user per service, before
    `binlake init` defined it) is logged, and the service goes on; only a too large message needs it."""
    try:
        await ensure_bucket(js, bucket, follows, replicas=replicas)
    except NatsUnavailable as exc:
        log.error("objects.bucket_missing", bucket=bucket, error=str(exc),
                  fix="run `binlake init` as NATS admin: messages larger than max_payload need this bucket")


async def put(js: JetStreamContext, ref: Ref, data: bytes) -> None:
    """Store `data` as the object `ref` names, unless it is there already and young (a replay):
    an older one is put again, so that it outlives the message that names it now."""
    with _mapped(ref):
        info = await _info(js, ref.bucket, ref.name, tries=1)  # usually new: no waiting for a replica
        if info is not None and info.get("digest") == _nats_digest(data) and info.get("size") == len(data) \
                and time.time() - _mtime(info) < MARGIN_S / 2:
            return
        store = await js.object_store(ref.bucket)
        await store.put(ref.name, data)


async def get(js: JetStreamContext, ref: Ref) -> bytes:
    """The bytes of the referenced object, checked against the reference; ObjectMissing when they cannot be had.

    Read with direct gets only (no consumer): a store client may read the bucket, and nothing more.
    """
    with _mapped(ref):
        info = await _info(js, ref.bucket, ref.name)
        if info is None or info.get("deleted"):
            raise ObjectMissing(f"object {ref.name!r} is not in bucket {ref.bucket} (expired or removed; its stream "
                                "kept the message longer than the bucket kept the object): the row it holds is lost "
                                "to this reader; load the table again (binlake snapshot)")
        size, chunks, nuid = int(info.get("size", -1)), int(info.get("chunks", 0)), str(info.get("nuid", ""))
        if size != ref.size:
            raise ObjectMissing(f"object {ref.name!r} in {ref.bucket} has {size} bytes, its reference says {ref.size}")
        out = bytearray()
        seq, subject = 1, f"$O.{ref.bucket}.C.{nuid}"
        for n in range(chunks):
            msg = await _direct(js, ref.bucket, {"seq": seq, "next_by_subj": subject})
            if msg is None:
                raise ObjectMissing(f"object {ref.name!r} in {ref.bucket}: chunk {n + 1} of {chunks} is gone")
            out += msg.data
            seq = int(msg.headers["Nats-Sequence"]) + 1 if msg.headers else seq + 1
            if len(out) > ref.size:
                break
    if len(out) != ref.size or hashlib.sha256(out).hexdigest() != ref.sha256:
        raise ObjectMissing(f"object {ref.name!r} in {ref.bucket} does not hold what its reference names "
                            f"({len(out)} bytes, sha256 mismatch or truncated)")
    return bytes(out)


async def resolve(js: JetStreamContext, data: bytes, bucket: str) -> bytes:
    """The whole envelope of a message: `data` itself, or the object in `bucket` a reference envelope names."""
    if not maybe_reference(data):
        return data
    env = envelope.decode(data)
    ref = Ref.of(env, bucket)
    if ref is None:
        return data
    full = await get(js, ref)
    whole = envelope.decode(full)
    if REF in whole or any(whole.get(k) != env.get(k) for k in ("source", "db", "table", "op", "scn", "chunk")):
        raise envelope.EnvelopeError(f"object {ref.name!r} in {ref.bucket} holds another message than its reference")
    return full


@contextlib.contextmanager
def _mapped(ref: Ref) -> Iterator[None]:
    """NATS errors as binlake's: a missing bucket names its fix, a refusal is transient."""
    try:
        yield
    except nats.js.errors.NotFoundError:
        raise ConfigError(f"object bucket {ref.bucket} does not exist: run `binlake init` as NATS admin") from None
    except (nats.js.errors.Error, nats.errors.Error, TimeoutError) as exc:
        raise (store_full(exc, ref.bucket, f"object {ref.name}")
               or NatsUnavailable(f"object {ref.name} in {ref.bucket}: {exc!r}")) from exc


async def _direct(js: JetStreamContext, bucket: str, req: dict[str, Any], subject: str | None = None, *,
                  tries: int = 5) -> Msg | None:
    """A direct get on the bucket's stream (by `req`, or the last message of `subject`); None when
    there is none after `tries` (a replica serving direct gets can be a moment behind its leader)."""
    api = f"{js._prefix}.DIRECT.GET.{object_stream(bucket)}"
    for attempt in range(tries):
        msg = await js._nc.request(f"{api}.{subject}" if subject else api, b"" if subject else json.dumps(req).encode(),
                                   timeout=5.0)
        status = (msg.headers or {}).get("Status") if not msg.data else None
        if status is None:
            return msg
        if status != "404":
            reason = (msg.headers or {}).get("Description")
            raise NatsUnavailable(f"direct get on {object_stream(bucket)}: {status} {reason}")
        if attempt < tries - 1:
            await asyncio.sleep(0.2 * (attempt + 1))
    return None


async def _info(js: JetStreamContext, bucket: str, name: str, *, tries: int = 5) -> dict[str, Any] | None:
    subject = f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"
    msg = await _direct(js, bucket, {}, subject, tries=tries)
    if msg is None:
        return None
    try:
        info = json.loads(msg.data or b"")
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _mtime(info: Mapping[str, Any]) -> float:
    try:
        return datetime.datetime.fromisoformat(str(info.get("mtime"))).timestamp()
    except ValueError:
        return 0.0


def _nats_digest(data: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()

"""Messages too large for NATS: the envelope in a JetStream object store, a reference in the stream.

One row can be larger than `max_payload` (a 64 MiB LONGBLOB). Such a message travels as a
*reference envelope*: the same map with `rows` empty and `ref` = `{"bucket", "name", "size",
"sha256"}`, header `Binlake-Object: <bucket>/<name>`; the object holds the whole envelope's
msgpack bytes. The parser puts its objects in the raw bucket (`binlake_raw_objects`, read only by
the sink, like BINLAKE_RAW); the sink resolves them, applies its rules, and puts what is still
too large in the CDC bucket (`binlake_cdc_objects`), which the store client, `binlake tail` and
the loader resolve transparently. Each bucket's objects live as long as its stream's messages
plus a day (`object_ttl`). `nats object ls binlake_cdc_objects` shows them.

An object is named after its message id, so a replay after a crash finds it already there and
the put is skipped; a reader that cannot get an object (expired, removed, corrupt) raises
`ObjectMissing`, never skips the message.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any, Final

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType

from shared import envelope
from shared.errors import FatalError, NatsUnavailable
from shared.jetstream import NAME_IN_USE, nats_errors
from shared.ordered_reader import OrderedReader

log = structlog.get_logger()
REF: Final = "ref"
HEADER: Final = "Binlake-Object"
CHUNK: Final = 128 * 1024  # nats-py's chunk size: well under any max_payload
STALL_S: Final = 30.0  # no chunk for this long while reading an object: it is gone
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
    def of(cls, env: Mapping[str, Any]) -> Ref | None:
        """The reference an envelope carries, None for an ordinary one; EnvelopeError when malformed."""
        ref = env.get(REF)
        if ref is None:
            return None
        if not isinstance(ref, dict) or not isinstance(ref.get("bucket"), str) or not isinstance(
                ref.get("name"), str) or not isinstance(ref.get("size"), int) or not isinstance(ref.get("sha256"), str):
            raise envelope.EnvelopeError(f"malformed object reference {str(ref)[:200]!r}")
        if ref["size"] < 0 or len(ref["sha256"]) != 64 or env.get("rows"):
            raise envelope.EnvelopeError(f"malformed object reference {str(ref)[:200]!r}")
        return cls(ref["bucket"], ref["name"], ref["size"], ref["sha256"])


def object_stream(bucket: str) -> str:
    """The stream nats-server keeps an object store bucket in."""
    return f"OBJ_{bucket}"


def object_ttl(stream_max_age_s: float | None) -> float | None:
    """How long a bucket keeps objects: its stream's message age plus a day; forever when the stream is."""
    return stream_max_age_s + MARGIN_S if stream_max_age_s else None


def reference(env: Mapping[str, Any], data: bytes, bucket: str, name: str) -> dict[str, Any]:
    """The reference envelope for `env`, whose encoding `data` goes to object `name` of `bucket`."""
    ref = Ref(bucket, name, len(data), hashlib.sha256(data).hexdigest())
    return {**{k: v for k, v in env.items() if k != "schema"}, "rows": [], REF: ref.to_dict()}


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


async def put(js: JetStreamContext, bucket: str, name: str, data: bytes) -> None:
    """Store `data` as object `name`, unless the same bytes are there already (a replay)."""
    digest = _nats_digest(data)
    with nats_errors(f"object {name} in {bucket}"):
        info = await _info(js, bucket, name)
        if info is not None and info.get("digest") == digest and info.get("size") == len(data):
            return
        store = await js.object_store(bucket)
        await store.put(name, data)


async def get(js: JetStreamContext, ref: Ref) -> bytes:
    """The bytes of the referenced object, checked against the reference; ObjectMissing when they cannot be had."""
    with nats_errors(f"object {ref.name} in {ref.bucket}"):
        info = await _info(js, ref.bucket, ref.name)
    if info is None or info.get("deleted"):
        raise ObjectMissing(f"object {ref.name!r} is not in bucket {ref.bucket} (expired or removed; its stream "
                            "kept the message longer than the bucket kept the object): the row it holds is lost to "
                            "this reader; load the table again (binlake snapshot)")
    size, chunks, nuid = int(info.get("size", -1)), int(info.get("chunks", 0)), str(info.get("nuid", ""))
    if size != ref.size:
        raise ObjectMissing(f"object {ref.name!r} in {ref.bucket} has {size} bytes, its reference says {ref.size}")
    out = bytearray()
    if size > 0:
        reader = OrderedReader(js, object_stream(ref.bucket), f"$O.{ref.bucket}.C.{nuid}", 1, 64)
        try:
            got, last = 0, time.monotonic()
            while got < chunks:
                msgs = await reader.fetch(wait_s=1.0)
                if msgs:
                    last = time.monotonic()
                elif time.monotonic() - last > STALL_S:
                    raise ObjectMissing(f"object {ref.name!r} in {ref.bucket}: {got} of {chunks} chunks arrived")
                for m in msgs[:chunks - got]:
                    out += m.data
                got += len(msgs)
        finally:
            await reader.close()
    if len(out) != ref.size or hashlib.sha256(out).hexdigest() != ref.sha256:
        raise ObjectMissing(f"object {ref.name!r} in {ref.bucket} does not hold what its reference names "
                            f"({len(out)} bytes, sha256 mismatch or truncated)")
    return bytes(out)


async def resolve(js: JetStreamContext, data: bytes) -> bytes:
    """The whole envelope of a message: `data` itself, or the object a reference envelope names."""
    env = envelope.decode(data)
    ref = Ref.of(env)
    if ref is None:
        return data
    full = await get(js, ref)
    whole = envelope.decode(full)
    if any(whole.get(k) != env.get(k) for k in ("source", "db", "table", "op", "scn", "chunk")):
        raise envelope.EnvelopeError(f"object {ref.name!r} in {ref.bucket} holds another message than its reference")
    return full


async def _info(js: JetStreamContext, bucket: str, name: str) -> dict[str, Any] | None:
    subject = f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"
    try:
        msg = await js.get_last_msg(object_stream(bucket), subject)
    except nats.js.errors.NotFoundError:
        return None
    except nats.errors.Error as exc:
        raise NatsUnavailable(f"object {name} in {bucket}: {exc!r}") from exc
    try:
        info = json.loads(msg.data or b"")
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _nats_digest(data: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()

"""The store owns BINLAKE_CDC's definition: create it, and apply retention changes (to the CDC
objects bucket too: its objects live as long as the messages that name them, `shared.objects`)."""

from __future__ import annotations

import structlog
from nats.js import JetStreamContext
from nats.js.api import StreamInfo

from shared import jetstream, objects
from shared.errors import ConfigError, NatsUnavailable
from shared.jetstream import nats_errors
from shared.subjects import Names

log = structlog.get_logger()


async def apply_retention(js: JetStreamContext, names: Names, max_age_s: float, max_bytes: int,
                          replicas: int = 1, *, must_apply: bool = True) -> StreamInfo:
    """BINLAKE_CDC with the configured limits (`_apply_to_stream`), then its objects bucket's TTL."""
    info = await _apply_to_stream(js, names, max_age_s, max_bytes, replicas, must_apply=must_apply)
    try:
        await objects.ensure_bucket(js, names.cdc_objects_bucket, names.cdc_stream, replicas=replicas, update=True)
    except NatsUnavailable as exc:
        if must_apply:
            raise
        log.error("store.object_retention_not_applied", reason=str(exc), bucket=names.cdc_objects_bucket,
                  fix="run `binlake init` as NATS admin")
    return info


async def _apply_to_stream(js: JetStreamContext, names: Names, max_age_s: float, max_bytes: int,
                           replicas: int = 1, *, must_apply: bool = True) -> StreamInfo:
    """Create BINLAKE_CDC (with `replicas`) or bring its limits to the configured ones, as `binlake
    init` does. `must_apply=False`: a change the server refuses (a per-service NATS user may not
    change streams, `shared.permissions`) is logged, and the stream is taken as it is."""
    want = jetstream.cdc_stream_config(names, replicas=replicas, limits=(max_age_s, max_bytes))
    try:
        return await jetstream.ensure_stream(js, want, repair=True)
    except (NatsUnavailable, ConfigError) as exc:
        if must_apply:
            raise
        log.error("store.retention_not_applied", reason=str(exc), max_age_s=max_age_s, max_bytes=max_bytes,
                  fix="run `binlake init` as NATS admin with the same BINLAKE_CDC_MAX_AGE_S / _MAX_BYTES")
    with nats_errors(f"stream {names.cdc_stream}"):
        return await js.stream_info(names.cdc_stream)

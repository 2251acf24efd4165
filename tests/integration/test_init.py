"""`binlake init` brings what an older binlake created up to date: atomic batches on BINLAKE_CDC,
no rollup headers on the buckets (one rollup put would purge every other key)."""

from __future__ import annotations

import dataclasses

import nats
import nats.js.errors
import pytest
from nats.js.api import KeyValueConfig, StorageType

from services.ops import init
from shared import bus, jetstream
from shared.config import NatsSettings
from shared.errors import ConfigError
from shared.objects import object_stream, object_ttl
from shared.subjects import Names, kv_stream, kv_subject


async def test_init_turns_off_rollups_and_turns_on_atomic_batches_of_an_older_deployment(nats_url: str) -> None:
    names = Names()
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        old_cdc = jetstream.cdc_stream_config(names)
        old_cdc.allow_atomic = False
        await js.add_stream(old_cdc)
        for bucket in (names.cursors_bucket, names.members_bucket):
            await js.create_key_value(KeyValueConfig(bucket=bucket, history=16, storage=StorageType.FILE))
            info = await js.stream_info(kv_stream(bucket))
            if not info.config.allow_rollup_hdrs:  # what nats-py created before binlake turned them off
                await js.update_stream(dataclasses.replace(info.config, allow_rollup_hdrs=True))
        cursors = await js.key_value(names.cursors_bucket)
        await cursors.put("sink.main.p1", b'{"seq": 5}')

        await jetstream.ensure_kv(js, names.cursors_bucket, history=16)  # a service: finds it, changes nothing
        assert (await js.stream_info(kv_stream(names.cursors_bucket))).config.allow_rollup_hdrs

        defined = await init.init(nats_url, NatsSettings(), {})
        assert set(defined) >= {names.cdc_stream, names.cursors_bucket, names.members_bucket}
        assert await jetstream.allows_atomic(js, names.cdc_stream)
        for bucket in (names.cursors_bucket, names.members_bucket):
            assert not (await js.stream_info(kv_stream(bucket))).config.allow_rollup_hdrs, bucket

        # A put of one's own key asking for a rollup of the whole bucket is refused; nothing is purged.
        with pytest.raises(nats.js.errors.APIError):
            await js.publish(kv_subject(names.cursors_bucket, "snapshot.main.request.x"), b"{}",
                             headers={"Nats-Rollup": "all"})
        assert (await cursors.get("sink.main.p1")).value == b'{"seq": 5}'
    finally:
        await nc.close()


async def test_a_stream_or_bucket_another_service_creates_meanwhile_is_taken(nats_url: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Services start together: the store creates BINLAKE_CDC with its retention between another
    service's lookup and its create. The loser checks the winner's stream instead of failing."""
    names = Names()
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await js.add_stream(jetstream.cdc_stream_config(names))  # the store's, first
        await js.create_key_value(KeyValueConfig(bucket=names.leases_bucket, ttl=2.0))  # a test parser's TTL
        real_info, real_kv = js.stream_info, js.key_value
        seen: set[str] = set()

        async def not_yet(name: str, *args: object, **kwargs: object) -> object:
            if name == names.cdc_stream and name not in seen:  # looked up just before the store's create
                seen.add(name)
                raise nats.js.errors.NotFoundError()
            return await real_info(name)

        async def no_bucket_yet(bucket: str) -> object:
            if bucket not in seen:
                seen.add(bucket)
                raise nats.js.errors.BucketNotFoundError()
            return await real_kv(bucket)

        monkeypatch.setattr(js, "stream_info", not_yet)
        monkeypatch.setattr(js, "key_value", no_bucket_yet)
        info = await jetstream.ensure_stream(js, jetstream.cdc_stream_config(names))
        assert info.config.max_age == 7 * 86400.0  # the store's stream, untouched
        kv = await jetstream.ensure_kv(js, names.leases_bucket, ttl_s=15.0)
        assert kv is not None
    finally:
        await nc.close()


async def test_init_gives_every_stream_the_configured_limits(nats_url: str) -> None:
    """BINLAKE_RAW_/_CDC_/_DLQ_MAX_AGE_S and _MAX_BYTES: set at creation, changed on an existing
    stream by the next `binlake init`; the raw objects follow the raw stream's age."""
    names = Names()
    await init.init(nats_url, NatsSettings(), {})
    env = {"BINLAKE_RAW_MAX_AGE_S": "3600", "BINLAKE_RAW_MAX_BYTES": str(64 << 20),
           "BINLAKE_CDC_MAX_AGE_S": "0", "BINLAKE_CDC_MAX_BYTES": str(128 << 20), "BINLAKE_DLQ_MAX_AGE_S": "86400"}
    await init.init(nats_url, NatsSettings(), env)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        got = {s: jetstream.limits_of((await js.stream_info(s)).config)
               for s in (names.raw_stream, names.cdc_stream, names.dlq_stream)}
        assert got == {names.raw_stream: (3600.0, 64 << 20), names.cdc_stream: (0.0, 128 << 20),
                       names.dlq_stream: (86400.0, -1)}
        raw_objects = (await js.stream_info(object_stream(names.raw_objects_bucket))).config.max_age
        assert raw_objects == object_ttl(3600.0)
    finally:
        await nc.close()


async def test_init_defines_exactly_the_table(nats_url: str) -> None:
    names = Names()
    defined = await init.init(nats_url, NatsSettings(), {})
    assert defined == bus.names_of(names)
    nc = await nats.connect(nats_url)
    try:
        streams = {info.config.name for info in await nc.jetstream().streams_info()}
    finally:
        await nc.close()
    assert streams == ({s.name(names) for s in bus.STREAMS} | {kv_stream(b.name(names)) for b in bus.BUCKETS}
                       | {object_stream(b.name(names)) for b in bus.OBJECT_BUCKETS})


async def test_limits_jetstream_cannot_reserve_are_refused_with_what_to_change(nats_url: str) -> None:
    with pytest.raises(ConfigError, match="reserves each stream's max bytes against its storage limit"):
        await init.init(nats_url, NatsSettings(), {"BINLAKE_RAW_MAX_BYTES": str(10**16)})

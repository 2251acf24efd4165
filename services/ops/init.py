"""`binlake init`: create (or bring up to date) every stream and bucket binlake uses, as admin.

With a NATS user per service (`shared.permissions`) only the admin may define streams: a user
that may create or update a stream could add a source, a subject or a republish to it and so
read or write any other stream. `binlake up` runs this before the services, the compose files
run it as their `init` service; the services then only find what they need. Without per-service
users (one user, or no login) the services still create what is missing themselves.

Settings (environment, like the services'): BINLAKE_PARTITIONS, BINLAKE_REPLICAS, and BINLAKE_CDC's
retention BINLAKE_CDC_MAX_AGE_S / BINLAKE_CDC_MAX_BYTES.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

import structlog
from nats.js import JetStreamContext

from services.ops.common import nats_auth, nats_url, run
from services.store.config import StoreConfig
from services.store.retention import apply_retention
from shared import jetstream, objects
from shared.config import NatsSettings
from shared.subjects import Names

log = structlog.get_logger()

LEASE_TTL_S = 15.0  # the parser's and loader's default `lease_ttl_s`; their leases adapt to the bucket's
MEMBER_TTL_S = 15.0  # the sink's default `member_ttl_s`


async def define_all(js: JetStreamContext, cfg: StoreConfig) -> list[str]:
    """Every stream and bucket, created when missing or brought up to date (atomic batches, no
    rollups), CDC's retention applied; their names."""
    names = Names(cfg.prefix)
    await apply_retention(js, names, cfg.cdc_max_age_s, cfg.cdc_max_bytes, cfg.replicas)
    await jetstream.ensure_streams(js, names, cfg.partitions, cfg.replicas, repair=True)
    await objects.ensure_bucket(js, names.raw_objects_bucket, names.raw_stream, replicas=cfg.replicas, update=True)
    await jetstream.ensure_kv(js, names.cursors_bucket, history=16, replicas=cfg.replicas, repair=True)
    await jetstream.ensure_kv(js, names.schema_bucket, replicas=cfg.replicas, repair=True)
    await jetstream.ensure_kv(js, names.leases_bucket, ttl_s=LEASE_TTL_S, replicas=cfg.replicas, repair=True)
    await jetstream.ensure_kv(js, names.members_bucket, ttl_s=MEMBER_TTL_S, replicas=cfg.replicas, repair=True)
    return [names.raw_stream, names.cdc_stream, names.dlq_stream, names.cursors_bucket, names.schema_bucket,
            names.leases_bucket, names.members_bucket, names.raw_objects_bucket, names.cdc_objects_bucket]


async def init(url: str, auth: NatsSettings, env: Mapping[str, str] | None = None) -> list[str]:
    cfg = StoreConfig.from_env(env)
    nc = await jetstream.connect(url, name="binlake-init", auth=auth, first_connect_s=10.0)
    try:
        return await define_all(nc.jetstream(prefix=auth.nats_api_prefix), cfg)
    finally:
        await nc.close()


def main() -> None:
    argparse.ArgumentParser(prog="binlake init", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(sys.argv[1:])
    defined = run("init", lambda: init(nats_url(), nats_auth()))
    print("ready: " + ", ".join(defined))

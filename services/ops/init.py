"""`binlake init`: create (or bring up to date) every stream and bucket binlake uses (`shared.bus`), as admin.

With a NATS user per service (`shared.permissions`) only the admin may define streams: a user
that may create or update a stream could add a source, a subject or a republish to it and so
read or write any other stream. `binlake up` runs this before the services, the compose files
run it as their `init` service; the services then only find what they need. Without per-service
users (one user, or no login) the services still create what is missing themselves.

Settings (environment, like the services'): BINLAKE_PARTITIONS, BINLAKE_REPLICAS, and each
stream's limits BINLAKE_RAW_/_CDC_/_DLQ_MAX_AGE_S and _MAX_BYTES (applied to existing streams too).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from services.ops.common import nats_auth, nats_url, run
from services.store.config import StoreConfig
from shared import bus, jetstream
from shared.config import NatsSettings
from shared.subjects import Names


async def init(url: str, auth: NatsSettings, env: Mapping[str, str] | None = None) -> list[str]:
    cfg = StoreConfig.from_env(env)
    nc = await jetstream.connect(url, name="binlake-init", auth=auth, first_connect_s=10.0)
    try:
        return await bus.define_all(nc.jetstream(prefix=auth.nats_api_prefix), Names(cfg.prefix), cfg.partitions,
                                    cfg.replicas, cfg.limits)
    finally:
        await nc.close()


def main() -> None:
    argparse.ArgumentParser(prog="binlake init", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(sys.argv[1:])
    defined = run("init", lambda: init(nats_url(), nats_auth()))
    print("ready: " + ", ".join(defined))

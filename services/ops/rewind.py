"""`binlake rewind <client> --to-timestamp T | --to-position FILE:OFFSET | --to-gtid SET` (DTS-style seek)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from services.ops.common import nats_auth, nats_url, run
from shared import jetstream
from shared.errors import ConfigError
from shared.meta_client import MetaClient


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds, or an ISO-8601 time (UTC unless it names a zone)."""
    if text.isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--to-timestamp must be epoch ms or ISO-8601, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


async def rewind(url: str, prefix: str, source: str, client: str, timestamp: str | None,
                 position: str | None, gtid: str | None = None) -> dict[str, object]:
    nc = await jetstream.connect(url, name="binlake-rewind", auth=nats_auth(), first_connect_s=3.0)
    try:
        meta = MetaClient(nc, prefix, timeout_s=60.0)
        if timestamp is not None:
            return await meta.rewind(source, client, timestamp_ms=parse_timestamp(timestamp))
        if gtid is not None:
            return await meta.rewind(source, client, gtid=gtid)
        return await meta.rewind(source, client, position=position)
    finally:
        await nc.close()


def main() -> None:
    ap = argparse.ArgumentParser(prog="binlake rewind", description=__doc__)
    ap.add_argument("client")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--to-timestamp", help="epoch ms or ISO-8601 (e.g. 2026-11-22T06:00:00Z)")
    group.add_argument("--to-position", help="binlog position, e.g. mysql-bin.000042:1234")
    group.add_argument("--to-gtid", help="what the client has: a MySQL GTID set (uuid:1-100,uuid:tag:1-5) or "
                                         "a MariaDB GTID state (0-1-100); it goes back to the first transaction "
                                         "not in it")
    ap.add_argument("--source", default="main")
    ap.add_argument("--prefix", default="binlake")
    args = ap.parse_args(sys.argv[1:])
    result = run("rewind", lambda: rewind(nats_url(), args.prefix, args.source, args.client, args.to_timestamp,
                                          args.to_position, args.to_gtid))
    print(f"client {args.client} rewound: next event is CDC sequence {result['seq']}")

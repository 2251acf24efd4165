"""`binlake rewind <client> --to-timestamp T | --to-position FILE:OFFSET | --to-gtid SET | --to-start` (DTS-style seek).

`binlake rewind --sink-partition P|all --to-start` puts sink partitions at the start of
BINLAKE_RAW as it is now: how partitions halted by a BINLAKE_RAW defined again resume (`all`:
every partition whose cursor counts in another stream or lies past its end).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from services.ops.common import nats_auth, nats_url, run
from shared import jetstream, keys
from shared.errors import ConfigError
from shared.meta_client import MetaClient
from shared.partition_cursor import PartitionCursor
from shared.subjects import Names


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


async def rewind_partitions(url: str, prefix: str, source: str, partition: str) -> list[int]:
    """Sink partition `partition` (a number, or `all` halted ones) to the start of BINLAKE_RAW; which were moved."""
    names = Names(prefix)
    nc = await jetstream.connect(url, name="binlake-rewind", auth=nats_auth(), first_connect_s=3.0)
    try:
        js = nc.jetstream()
        ident = await jetstream.stream_identity(js, names.raw_stream)
        start = PartitionCursor(max(0, ident.first_seq - 1), 0, ident.id)
        with jetstream.nats_errors(f"bucket {names.cursors_bucket}"):
            kv = await js.key_value(names.cursors_bucket)
            if partition != "all":
                await kv.put(keys.partition_cursor(source, int(partition)), start.encode())
                return [int(partition)]
            moved = []
            for key, value, _ in await jetstream.kv_entries(js, names.cursors_bucket, keys.partition_cursors(source)):
                cursor = PartitionCursor.decode(value, key, names.cursors_bucket)
                if cursor.stream_id != ident.id or cursor.handled > ident.last_seq:
                    await kv.put(key, start.encode())
                    moved.append(int(key.rsplit(".p", 1)[1]))
            return sorted(moved)
    finally:
        await nc.close()


async def rewind(url: str, prefix: str, source: str, client: str, timestamp: str | None,
                 position: str | None, gtid: str | None = None, start: bool = False) -> dict[str, object]:
    nc = await jetstream.connect(url, name="binlake-rewind", auth=nats_auth(), first_connect_s=3.0)
    try:
        meta = MetaClient(nc, prefix, timeout_s=60.0)
        if timestamp is not None:
            return await meta.rewind(source, client, timestamp_ms=parse_timestamp(timestamp))
        if gtid is not None:
            return await meta.rewind(source, client, gtid=gtid)
        if start:
            return await meta.rewind(source, client, start=True)
        return await meta.rewind(source, client, position=position)
    finally:
        await nc.close()


def main() -> None:
    ap = argparse.ArgumentParser(prog="binlake rewind", description=__doc__)
    ap.add_argument("client", nargs="?")
    ap.add_argument("--sink-partition", help="a sink partition (number, or 'all' halted by a BINLAKE_RAW defined "
                                             "again) instead of a client; only with --to-start")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--to-timestamp", help="epoch ms or ISO-8601 (e.g. 2026-11-22T06:00:00Z)")
    group.add_argument("--to-position", help="binlog position, e.g. mysql-bin.000042:1234")
    group.add_argument("--to-gtid", help="what the client has: a MySQL GTID set (uuid:1-100,uuid:tag:1-5) or "
                                         "a MariaDB GTID state (0-1-100); it goes back to the first transaction "
                                         "not in it")
    group.add_argument("--to-start", action="store_true",
                       help="the first message BINLAKE_CDC holds; how a client resumes after the stream was "
                            "defined again")
    ap.add_argument("--source", default="main")
    ap.add_argument("--prefix", default="binlake")
    args = ap.parse_args(sys.argv[1:])
    if args.sink_partition is not None:
        if args.client is not None or not args.to_start:
            ap.error("--sink-partition takes no client, and only --to-start")
        if args.sink_partition != "all" and not args.sink_partition.isdigit():
            ap.error(f"--sink-partition is a partition number or 'all', got {args.sink_partition!r}")
        moved = run("rewind", lambda: rewind_partitions(nats_url(), args.prefix, args.source, args.sink_partition))
        print(f"sink partitions {moved or 'none'} at the start of BINLAKE_RAW; restart the sink")
        return
    if args.client is None:
        ap.error("name a client (or --sink-partition)")
    result = run("rewind", lambda: rewind(nats_url(), args.prefix, args.source, args.client, args.to_timestamp,
                                          args.to_position, args.to_gtid, args.to_start))
    print(f"client {args.client} rewound: next event is CDC sequence {result['seq']}")

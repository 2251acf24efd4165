"""`binlake status`: positions and lag, partition owners, clients and their cursors, stream sizes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext

from services.ops.common import nats_url, run
from shared import jetstream
from shared import snapshots as snap
from shared.assignment import owned
from shared.subjects import Names


async def _kv(js: JetStreamContext, bucket: str) -> dict[str, Any]:
    try:
        kv = await js.key_value(bucket)
        keys = await kv.keys()
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.NoKeysError):
        return {}
    out: dict[str, Any] = {}
    for key in keys:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            continue
        try:
            out[key] = json.loads(entry.value or b"null")
        except ValueError:
            out[key] = (entry.value or b"").decode(errors="replace")
    return out


async def collect(url: str, prefix: str, source: str, partitions: int) -> dict[str, Any]:
    names = Names(prefix)
    nc = await jetstream.connect(url, name="binlake-status", first_connect_s=3.0)
    try:
        js = nc.jetstream()
        streams: dict[str, dict[str, int] | None] = {}
        for stream in (names.raw_stream, names.cdc_stream, names.dlq_stream):
            try:
                info = await js.stream_info(stream)
                streams[stream] = {"messages": info.state.messages, "bytes": info.state.bytes,
                                   "last_seq": info.state.last_seq}
            except nats.js.errors.NotFoundError:
                streams[stream] = None
        cursors = await _kv(js, names.cursors_bucket)
        leases = await _kv(js, names.leases_bucket)
        members = sorted(k for k in (await _kv(js, names.members_bucket)) if k.startswith(f"sink.{source}."))
        short = {m: m[len(f"sink.{source}."):] for m in members}
        owners = {p: short[m] for m in members for p in owned(members, m, partitions)}
        parser = cursors.get(f"parser.{source}")
        now = int(time.time() * 1000)
        return {
            "source": source,
            "parser": {**parser, "age_s": round((now - parser["updated_ms"]) / 1000, 1),
                       "active": leases.get(f"parser.{source}")} if isinstance(parser, dict) else None,
            "partitions": [{"partition": p, "owner": owners.get(p),
                            "cursor": (cursors.get(f"sink.{source}.p{p}") or {}).get("seq")}
                           for p in range(partitions)],
            "clients": {k.split(".", 2)[2]: {f: v.get(f) for f in ("acked", "delivered", "batches", "filter")}
                        for k, v in cursors.items() if k.startswith(f"client.{source}.") and isinstance(v, dict)},
            "snapshots": [_snapshot(v) for k, v in sorted(cursors.items())
                          if k.startswith(snap.tables_filter(source)[:-1]) and isinstance(v, dict)],
            "streams": streams,
        }
    finally:
        await nc.close()


def _snapshot(d: dict[str, Any]) -> dict[str, Any]:
    p = snap.TableProgress.from_json(json.dumps(d).encode())
    # An estimate at or below the rows done is stale: the total is unknown until the end.
    total = p.rows if p.finished else (p.estimate if p.estimate > p.rows else None)
    return {"table": p.name, "state": p.state, "rows": p.rows, "estimate": total, "chunks": p.chunks,
            "retries": p.retries, "key": p.key_kind, "error": p.error}


def render(s: dict[str, Any]) -> str:
    lines = [f"source {s['source']}"]
    p = s["parser"]
    if p:
        lines.append(f"  parser    {p['file']}:{p['offset']} gtid={p.get('gtid')} lag={p.get('lag_ms', 0) / 1000:.1f}s "
                     f"(reported {p['age_s']}s ago, active: {p.get('active')})")
    else:
        lines.append("  parser    no position reported yet")
    lines.append("  partitions")
    for part in s["partitions"]:
        lines.append(f"    {part['partition']:>3}  owner={part['owner'] or '-'}  cursor={part['cursor'] or 0}")
    lines.append("  clients")
    for name, c in sorted(s["clients"].items()):
        lines.append(f"    {name}: acked={c['acked']} delivered={c['delivered']} unacked={len(c['batches'] or [])} "
                     f"filter={c['filter']}")
    if not s["clients"]:
        lines.append("    (none)")
    if s.get("snapshots"):
        lines.append("  snapshots")
        for t in s["snapshots"]:
            if t["estimate"] is None:
                done = f"{t['rows']}/? rows"
            else:
                pct = 100.0 * t["rows"] / t["estimate"] if t["estimate"] else 100.0
                done = f"{t['rows']}/{t['estimate']} rows ({min(pct, 100.0):.0f}%)"
            lines.append(f"    {t['table']}: {t['state']} {done}, "
                         f"{t['chunks']} chunks, {t['retries']} retries, key={t['key'] or '-'}"
                         + (f", error: {t['error']}" if t["error"] else ""))
    lines.append("  streams")
    for name, info in s["streams"].items():
        lines.append(f"    {name}: " + (f"{info['messages']} messages, {info['bytes']} bytes, last seq "
                                         f"{info['last_seq']}" if info else "missing"))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="binlake status", description=__doc__)
    ap.add_argument("--source", default="main")
    ap.add_argument("--prefix", default="binlake")
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(sys.argv[1:])
    status = run("status", lambda: collect(nats_url(), args.prefix, args.source, args.partitions))
    print(json.dumps(status, indent=2, default=str) if args.json else render(status))

"""`binlake status`: problems first, in words; then lag per stage and per table (rows and seconds),
positions, partition owners, clients and their cursors, stream sizes."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from services.ops import lag
from services.ops.common import nats_auth, nats_url, run
from shared import jetstream, keys
from shared import snapshots as snap
from shared.assignment import owned, tables_per_partition
from shared.errors import ForeignValue, NatsUnavailable
from shared.meta_client import MetaClient
from shared.partition_cursor import PartitionCursor
from shared.subjects import Names


async def _kv(js: JetStreamContext, bucket: str) -> dict[str, Any]:
    """Every live key of `bucket`, its value parsed as JSON where it is JSON (a pull consumer: a
    push consumer, as nats.py's `keys()` uses, delivers nothing across NATS accounts)."""
    out: dict[str, Any] = {}
    for key, value, _ in await jetstream.kv_entries(js, bucket):
        try:
            out[key] = json.loads(value or b"null")
        except ValueError:
            out[key] = (value or b"").decode(errors="replace")
    return out


_PARTITIONS = re.compile(r"partition\((\d+),")


async def collect(url: str, prefix: str, source: str, partitions: int | None) -> dict[str, Any]:
    names = Names(prefix)
    auth = nats_auth()
    nc = await jetstream.connect(url, name="binlake-status", auth=auth, first_connect_s=3.0)
    try:
        js = nc.jetstream(prefix=auth.nats_api_prefix)
        streams: dict[str, dict[str, Any] | None] = {}
        for stream in (names.raw_stream, names.cdc_stream, names.dlq_stream):
            try:
                info = await js.stream_info(stream)
                transform = info.config.subject_transform
                if stream == names.raw_stream and partitions is None and transform is not None:
                    # The partition count the stream was created with, not a guess.
                    found = _PARTITIONS.search(transform.dest or "")
                    partitions = int(found.group(1)) if found else None
                streams[stream] = {"messages": info.state.messages, "bytes": info.state.bytes,
                                   "first_seq": info.state.first_seq, "last_seq": info.state.last_seq,
                                   "id": info.created.isoformat() if info.created is not None else ""}
            except nats.js.errors.NotFoundError:
                streams[stream] = None
        cursors = await _kv(js, names.cursors_bucket)
        leases = await _kv(js, names.leases_bucket)
        prefix_len = len(keys.members_prefix(source))
        members = sorted(k for k in (await _kv(js, names.members_bucket)) if k.startswith(keys.members_prefix(source)))
        partitions = partitions or 16
        tables: dict[int, int] = {}
        if streams[names.raw_stream] is not None:  # the sinks spread tables, so their owners depend on them
            raw = await js.stream_info(names.raw_stream, subjects_filter=names.raw_source_filter(source))
            tables = tables_per_partition(names, source, raw.state.subjects or {})
        owners = {p: keys.unescape_key(m[prefix_len:]) for m in members
                  for p in owned(members, m, partitions, tables)}
        parser = cursors.get(keys.parser_cursor(source))
        now = int(time.time() * 1000)
        part_cursors = {p: _partition_cursor(cursors.get(key := keys.partition_cursor(source, p)), key,
                                             names.cursors_bucket) for p in range(partitions)}
        clients = _edge(await _clients(nc, names, source, cursors), streams.get(names.cdc_stream))
        return {
            "source": source,
            "prefix": prefix,
            "parser": {**parser, "age_s": round((now - parser["updated_ms"]) / 1000, 1),
                       "active": leases.get(keys.parser_lease(source))} if isinstance(parser, dict) else None,
            "partitions": [{"partition": p, "owner": owners.get(p), "tables": tables.get(p, 0),
                            "cursor": c.seq if c else None, "stream_id": c.stream_id if c else None}
                           for p, c in part_cursors.items()],
            "clients": clients,
            "lag": await _lag(js, names, source, streams, part_cursors, clients, tables),
            "held": {client: v for k, v in sorted(cursors.items())
                     if (client := keys.held_client(source, k)) is not None and v},
            "snapshots": [_snapshot(v) for k, v in sorted(cursors.items())
                          if k.startswith(keys.snapshot_tables(source)[:-1]) and isinstance(v, dict)],
            "streams": streams,
        }
    finally:
        await nc.close()


def _partition_cursor(value: Any, key: str, bucket: str) -> PartitionCursor | None:
    """The partition's cursor; None when there is none, or none binlake wrote (the sink halts on it and says so)."""
    if value is None:
        return None
    try:
        return PartitionCursor.from_dict(value, key, bucket)
    except ForeignValue:
        return None


SINK_STAGE = "RAW → CDC"


def client_stage(client: str) -> str:
    return f"CDC → {client}"


async def _lag(js: JetStreamContext, names: Names, source: str, streams: dict[str, dict[str, Any] | None],
               part_cursors: dict[int, PartitionCursor | None], clients: dict[str, Any],
               tables: dict[int, int]) -> dict[str, Any]:
    """Each stage's backlog (the sinks' over every partition, each store client's) in rows and seconds,
    and per table. Partitions and clients whose position counts in another stream are left out
    (`problems` names them)."""
    now = lag.now_ms()
    stages: dict[str, lag.Backlog | None] = {}  # None: it could not be read
    raw, cdc = streams.get(names.raw_stream), streams.get(names.cdc_stream)
    if raw is not None:
        sinks = lag.Backlog()
        for p, c in part_cursors.items():
            if c is not None and c.stream_id and c.stream_id != raw["id"]:
                continue
            if c is None and not tables.get(p):
                continue  # no cursor and no table: nothing to read
            after = c.handled if c is not None else raw["first_seq"] - 1
            try:
                sinks.merge(await lag.backlog(js, names.raw_stream, names.raw_partition_filter(source, p), after))
            except NatsUnavailable:
                stages[SINK_STAGE] = None
                break
        else:
            stages[SINK_STAGE] = sinks
    if cdc is not None:
        for name, c in sorted(clients.items()):
            if name == "_note" or not isinstance(c.get("acked"), int) or _redefined(c, cdc):
                continue
            wanted = lag.client_wants(c.get("filter"), int(c.get("min_ts") or 0), int(c.get("min_scn") or 0))
            try:
                stages[client_stage(name)] = await lag.backlog(
                    js, names.cdc_stream, names.cdc_source_filter(source), max(c["acked"], cdc["first_seq"] - 1),
                    wanted=wanted)
            except NatsUnavailable:
                stages[client_stage(name)] = None
    per_table: dict[str, dict[str, Any]] = {}
    for stage, b in stages.items():
        for table, behind in (b.tables if b is not None else {}).items():
            row = per_table.setdefault(table, {"seconds": 0.0})
            row[stage] = behind.rows
            row["seconds"] = max(row["seconds"], round(behind.seconds(now), 1))
    return {
        "stages": {stage: None if b is None else {"rows": b.total.rows, "messages": b.total.messages,
                                                  "capped": b.capped, "seconds": round(b.total.seconds(now), 1)}
                   for stage, b in stages.items()},
        "tables": dict(sorted(per_table.items(), key=lambda kv: -kv[1]["seconds"])),
    }


def _redefined(client: dict[str, Any], cdc: dict[str, Any]) -> bool:
    """Whether the client's position counts in an earlier BINLAKE_CDC (the store refuses its gets)."""
    return bool(client.get("stream_id")) and client["stream_id"] != cdc.get("id")


async def _clients(nc: NATS, names: Names, source: str, cursors: dict[str, Any]) -> dict[str, Any]:
    """Client cursors, from meta: they live in its backend (KV, or MySQL with `--backend mysql`).

    Without a meta answering, the KV bucket is what there is (and says so)."""
    fields = ("acked", "delivered", "batches", "filter", "stream_id", "min_ts", "min_scn")
    try:
        meta = MetaClient(nc, names.prefix, timeout_s=3.0)
        entries = [(k, e.value) for k, e in await meta.list_cursors(keys.clients_prefix(source))]
        note = None
    except NatsUnavailable:
        entries = [(k, v) for k, v in cursors.items() if k.startswith(keys.clients_prefix(source))]
        note = "meta is not answering: client cursors read from the KV bucket"
    out: dict[str, Any] = {keys.client_of(k): {f: v.get(f) for f in fields} for k, v in entries if isinstance(v, dict)}
    if note:
        out = {"_note": note, **out}
    return out


def _edge(clients: dict[str, Any], cdc: dict[str, int] | None) -> dict[str, Any]:
    """Each client's distance to BINLAKE_CDC's retention edge: how many of the messages it has read
    the stream still holds (negative: messages it had not read are gone, its next get fails)."""
    if cdc is None:
        return clients
    for name, c in clients.items():
        if name != "_note" and isinstance(c.get("acked"), int) and c["acked"] > 0:  # 0: starts at the edge
            c["retention_headroom"] = c["acked"] - cdc["first_seq"] + 1
    return clients


def _snapshot(d: dict[str, Any]) -> dict[str, Any]:
    p = snap.TableProgress.from_json(json.dumps(d).encode())
    # An estimate at or below the rows done is stale: the total is unknown until the end.
    total = p.rows if p.finished else (p.estimate if p.estimate > p.rows else None)
    return {"table": p.name, "state": p.state, "rows": p.rows, "estimate": total, "chunks": p.chunks,
            "retries": p.retries, "key": p.key_kind, "error": p.error}


PARSER_QUIET_S = 60.0  # a parser reports its position every second while it runs


def problems(s: dict[str, Any]) -> list[str]:
    """What keeps the pipeline from being fresh and whole, in words, with what to do."""
    out: list[str] = []
    names = Names(s.get("prefix") or "binlake")
    streams = s.get("streams") or {}
    for name, info in streams.items():
        if info is None:
            out.append(f"{name} is missing: `binlake init` defines it (the services create it when they start)")
    p = s.get("parser")
    if p is None:
        out.append("no parser has reported a position yet: is `binlake parser` running and reaching the source?")
    else:
        if not p.get("active"):
            out.append("no parser holds the lease: none is running (or it lost NATS)")
        if p.get("age_s", 0) > PARSER_QUIET_S:
            out.append(f"the parser last reported its position {p['age_s']:.0f} s ago: is it running? (its /healthz "
                       "says why it waits)")
    raw = streams.get(names.raw_stream) or {}
    redefined = [part["partition"] for part in s.get("partitions") or []
                 if part.get("stream_id") and raw.get("id") and part["stream_id"] != raw["id"]]
    if redefined:
        out.append(f"sink partitions {redefined} count in an earlier {names.raw_stream} (deleted and defined "
                   "again): they are halted; `binlake rewind --sink-partition all --to-start`, then restart the sinks")
    orphans = [part["partition"] for part in s.get("partitions") or [] if part.get("tables") and not part.get("owner")]
    if orphans:
        out.append(f"no sink worker owns partitions {orphans} (they hold tables): start `binlake sink`")
    dlq = streams.get(names.dlq_stream) or {}
    if dlq.get("messages"):
        out.append(f"{dlq['messages']} dead letters in {names.dlq_stream} stopped their partitions: `nats stream "
                   f"view {names.dlq_stream}` shows each one's Binlake-Dlq-Reason")
    cdc = streams.get(names.cdc_stream)
    for name, c in (s.get("clients") or {}).items():
        if name == "_note":
            continue
        if cdc is not None and _redefined(c, cdc):
            out.append(f"client {name} counts in an earlier {names.cdc_stream} (deleted and defined again): the "
                       f"store refuses its gets; `binlake rewind {name} --to-start`")
        elif isinstance(c.get("retention_headroom"), int) and c["retention_headroom"] < 0:
            out.append(f"client {name}: {-c['retention_headroom']} messages it had not read were removed by "
                       f"{names.cdc_stream}'s limits; snapshot its tables again (binlake snapshot) and rewind it")
    for client, tables in (s.get("held") or {}).items():
        out.append(f"{client} set aside {len(tables)} table(s): {', '.join(sorted(tables))} (reasons below)")
    for t in s.get("snapshots") or []:
        if t.get("error"):
            out.append(f"snapshot of {t['table']} {t['state']}: {t['error']}")
    return out


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell: the first left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    def line(r: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return [indent + line(r) for r in (header, *rows)]


def _lag_lines(s: dict[str, Any]) -> list[str]:
    lag_ = s.get("lag") or {}
    stages: dict[str, Any] = lag_.get("stages") or {}
    p = s.get("parser")
    rows = [("binlog → RAW", "-", f"{p.get('lag_ms', 0) / 1000:.1f}" if p else "-")]
    for stage, b in stages.items():
        if b is None:
            rows.append((stage, "?", "?"))  # NATS did not answer in time
            continue
        more = "≥" if b["capped"] else ""
        rows.append((stage, f"{more}{b['rows']:,}", f"{b['seconds']:.1f}"))
    lines = ["lag (rows not yet through each stage; seconds since the oldest of them was committed at the source)"]
    lines += _table(("stage", "rows", "seconds"), rows)
    tables: dict[str, Any] = lag_.get("tables") or {}
    if tables:
        shown = list(tables.items())[:20]
        lines.append("tables behind" + (f" (the 20 furthest of {len(tables)})" if len(tables) > 20 else ""))
        lines += _table(("table", *stages, "seconds"),
                        [(name, *(f"{t.get(st, 0):,}" for st in stages), f"{t['seconds']:.1f}") for name, t in shown])
    return lines


def render(s: dict[str, Any]) -> str:
    lines = [f"source {s['source']}"]
    found = problems(s)
    lines += ["problems", *(f"  ! {p}" for p in found)] if found else ["no problems"]
    lines += _lag_lines(s)
    p = s["parser"]
    if p:
        lines.append(f"  parser    {p['file']}:{p['offset']} gtid={p.get('gtid')} lag={p.get('lag_ms', 0) / 1000:.1f}s "
                     f"(reported {p['age_s']}s ago, active: {p.get('active')})")
    else:
        lines.append("  parser    no position reported yet")
    lines.append("  sink partitions (owner: partitions, tables in them)")
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for part in s["partitions"]:
        by_owner.setdefault(part["owner"] or "(no owner)", []).append(part)
    for owner, parts in sorted(by_owner.items()):
        lines.append(f"    {owner}: {' '.join(str(x['partition']) for x in parts)} "
                     f"({sum(x['tables'] for x in parts)} tables)")
    lines.append("  clients")
    for name, c in sorted(s["clients"].items()):
        if name == "_note":
            lines.append(f"    ({c})")
            continue
        edge = c.get("retention_headroom")
        edge_text = "" if edge is None else (f" retention headroom={edge} messages" if edge >= 0 else
                                             f" RETENTION GAP: {-edge} unread messages removed")
        lines.append(f"    {name}: acked={c['acked']} delivered={c['delivered']} unacked={len(c['batches'] or [])} "
                     f"filter={c['filter']}{edge_text}")
    if not [n for n in s["clients"] if n != "_note"]:
        lines.append("    (none)")
    for client, tables in (s.get("held") or {}).items():
        lines.append(f"  tables set aside by {client} (their changes kept in the lake's _binlake.held)")
        for name, h in tables.items():
            lines.append(f"    {name}: since batch {h.get('since_batch')}: {h.get('reason')}")
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
    ap.add_argument("--partitions", type=int, default=None,
                    help="raw partitions (default: as BINLAKE_RAW was created with)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(sys.argv[1:])
    status = run("status", lambda: collect(nats_url(), args.prefix, args.source, args.partitions))
    print(json.dumps(status, indent=2, default=str) if args.json else render(status))

"""`binlake snapshot <db.table | regex> ...`: load existing rows of tables into the stream.

Files a request in the cursor bucket; the running parser expands the patterns against the
source, reads each table in key-ordered chunks between binlog watermarks, and emits the rows
as `op = "r"` events on the tables' own subjects. This command then draws progress until
every table is done (`--no-wait` returns at once). Stopping it does not stop the snapshot:
the parser owns it, and a killed parser resumes from the last finished chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from typing import TextIO

import nats.js.errors

from services.ops.common import nats_auth, nats_url, replicas, run
from shared import bus, jetstream, keys
from shared import snapshots as snap
from shared.errors import BinlakeError, ConfigError
from shared.patterns import PatternError, compile_pattern
from shared.subjects import Names


class SnapshotFailed(BinlakeError):
    """The parser refused the request or a table's snapshot failed."""


def bar(done: int, total: int | None, width: int = 28) -> str:
    """`[####....]  42.0%`; an unknown total (None) draws an empty bar and `?`."""
    if total is None:
        return "[" + "." * width + "]     ?%"
    frac = 1.0 if total <= 0 else min(1.0, done / total)
    filled = int(frac * width)
    return "[" + "#" * filled + "." * (width - filled) + f"] {frac * 100:5.1f}%"


def line(p: snap.TableProgress, rate: float | None) -> str:
    total: int | None = p.rows if p.finished else p.estimate
    if not p.finished and p.estimate <= p.rows:
        total = None  # the estimate is stale or missing: never show 100% before the end
    speed = f"  {rate:,.0f} rows/s" if rate else ""
    tail = f"  {p.error}" if p.error else ""
    shown = "?" if total is None else f"{total:,}"
    return f"{p.name:<40} {bar(p.rows, total)} {p.rows:>12,}/{shown:<12} {p.state}{speed}{tail}"


class Progress:
    """Redraws one line per table on a terminal; prints each finished table once otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self._drawn = 0
        self._reported: set[str] = set()
        self._seen: dict[str, tuple[float, int]] = {}

    def draw(self, tables: list[snap.TableProgress]) -> None:
        now = time.monotonic()
        lines = []
        for p in tables:
            first = self._seen.setdefault(p.name, (now, p.rows))
            rate = (p.rows - first[1]) / (now - first[0]) if now - first[0] > 0.5 else None
            lines.append(line(p, rate))
        if self.tty:
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F")
            self.out.write("".join(f"\x1b[2K{text}\n" for text in lines))
            self._drawn = len(lines)
        else:
            for p, text in zip(tables, lines, strict=True):
                if p.finished and p.name not in self._reported:
                    self._reported.add(p.name)
                    self.out.write(text + "\n")
        self.out.flush()


async def request(url: str, prefix: str, source: str, patterns: list[str], *, wait: bool, accept_timeout_s: float,
                  out: TextIO) -> int:
    names = Names(prefix)
    auth = nats_auth()
    nc = await jetstream.connect(url, name="binlake-snapshot", auth=auth, first_connect_s=3.0)
    try:
        js = nc.jetstream(prefix=auth.nats_api_prefix)
        kv = await jetstream.ensure_kv(js, names.cursors_bucket, history=bus.CURSOR_HISTORY, replicas=replicas())
        req = snap.SnapshotRequest(id=secrets.token_hex(6), patterns=patterns, created_ms=int(time.time() * 1000))
        key = keys.snapshot_request(source, req.id)
        with jetstream.nats_errors("snapshot request"):
            await kv.create(key, req.to_json())
        out.write(f"snapshot request {req.id} for {' '.join(patterns)} filed\n")
        if not wait:
            return 0
        deadline = time.monotonic() + accept_timeout_s
        while req.state == "new":
            if time.monotonic() > deadline:
                raise SnapshotFailed(f"no parser of source {source!r} took the request within {accept_timeout_s:.0f}s; "
                                     "is `binlake parser` running? The request stays filed and runs when it starts")
            await asyncio.sleep(0.3)
            with jetstream.nats_errors("snapshot request"):
                entry = await kv.get(key)
            req = snap.SnapshotRequest.from_json(entry.value or b"{}")
        if req.state == "failed":
            raise SnapshotFailed(req.error or "the parser refused the request")
        progress = Progress(out)
        while True:
            tables = []
            for tkey in req.tables:
                try:
                    with jetstream.nats_errors("snapshot progress"):
                        entry = await kv.get(tkey)
                except nats.js.errors.KeyNotFoundError:
                    continue
                tables.append(snap.TableProgress.from_json(entry.value or b"{}"))
            progress.draw(tables)
            if tables and all(p.finished for p in tables):
                break
            await asyncio.sleep(0.5)
        failed = [p for p in tables if p.state != snap.DONE]
        if failed:
            raise SnapshotFailed("; ".join(f"{p.name}: {p.state} ({p.error})" for p in failed))
        out.write(f"snapshot done: {len(tables)} table(s), {sum(p.rows for p in tables):,} rows\n")
        return 0
    finally:
        await nc.close()


def main() -> None:
    ap = argparse.ArgumentParser(prog="binlake snapshot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("patterns", nargs="+", metavar="db.table|regex",
                    help="tables to snapshot: a name, or a regular expression matched against db.table")
    ap.add_argument("--source", default="main")
    ap.add_argument("--prefix", default="binlake")
    ap.add_argument("--no-wait", action="store_true", help="file the request and return")
    ap.add_argument("--accept-timeout", type=float, default=30.0,
                    help="seconds to wait for the parser to take the request")
    args = ap.parse_args(sys.argv[1:])

    async def go() -> int:
        for p in args.patterns:
            try:
                compile_pattern(p)
            except PatternError as exc:
                raise ConfigError(f"not a table name or regular expression: {exc}") from None
        return await request(nats_url(), args.prefix, args.source, args.patterns, wait=not args.no_wait,
                             accept_timeout_s=args.accept_timeout, out=sys.stderr if not args.no_wait else sys.stdout)

    raise SystemExit(run("snapshot", go))

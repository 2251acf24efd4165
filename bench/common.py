"""What every benchmark shares: the command line and work directory, process and log helpers, percentiles.

Benchmarks run as modules from the repository root (`python3 -m bench.parser`), so they
import `services` and `shared` like any other code.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

ROOT = Path(__file__).resolve().parents[1]  # the repository: services run from here
POLL_S = 0.05


def arguments(doc: str | None, workdir_help: str | None = None) -> argparse.ArgumentParser:
    """The benchmark's argument parser: its docstring as help, and `--workdir` when it keeps files."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if workdir_help is not None:
        ap.add_argument("--workdir", type=Path, help=workdir_help)
    return ap


def run_in_workdir(run: Callable[[argparse.Namespace, Path], int], args: argparse.Namespace,
                   prefix: str) -> NoReturn:
    """Run in `args.workdir` (kept) or a temporary directory (removed); exit with run's code."""
    if args.workdir is not None:
        sys.exit(run(args, args.workdir.resolve()))
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        code = run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(code)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def proc_cpu(pid: int, *, reaped: bool = False) -> float:
    """utime+stime of a live process in seconds (0 if unreadable); with `reaped`, plus those of
    its children it has waited for (Spark's launcher JVM, gone before the driver JVM runs)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15 if reaped else 13]) / os.sysconf("SC_CLK_TCK")


def proc_peak_rss(pid: int) -> int:
    """The peak resident set (VmHWM) of a live process in bytes (0 if unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def log_summary(log: Path) -> list[str]:
    """Warning/error lines of a service log, grouped (JSON structlog lines and anything else)."""
    counts: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            counts[f"non-JSON: {line[:160]}"] += 1
            continue
        level = entry.get("level", "")
        if level not in ("info", "debug"):
            detail = entry.get("reason") or entry.get("error") or ""
            counts[f"{level}: {entry.get('event')} {detail}"[:300]] += 1
    return [f"{n}x {text}" for text, n in counts.most_common(15)]


async def connect_js(url: str) -> tuple[NATS, JetStreamContext]:
    """A plain nats-py connection for reading streams."""
    nc = await nats.connect(url, name="binlake-bench", max_reconnect_attempts=3)
    return nc, nc.jetstream()


@dataclass
class TableState:
    """Ids of one table: [live_lo, next_id) exist; updates walk a pointer through them."""

    next_id: int = 1
    live_lo: int = 1
    upd_ptr: int = 1

    def take(self, op: str, k: int) -> tuple[int, int]:
        """The id range an op of k rows touches (k may shrink for updates/deletes); advance state."""
        if op == "i":
            lo, self.next_id = self.next_id, self.next_id + k
            return lo, lo + k - 1
        if op == "u":
            lo = max(self.upd_ptr, self.live_lo)
            if lo + k > self.next_id:
                lo = self.live_lo
            hi = min(lo + k, self.next_id) - 1
            self.upd_ptr = hi + 1
            return lo, hi
        lo = self.live_lo
        hi = min(lo + k, self.next_id) - 1
        self.live_lo = hi + 1
        return lo, hi

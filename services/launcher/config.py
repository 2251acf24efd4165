"""LauncherConfig: what `binlake up` runs and where it keeps its data."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from shared import config
from shared.errors import ConfigError


@dataclass(frozen=True)
class LauncherConfig:
    data_dir: str = ".binlake"  # everything binlake up keeps: NATS, the private source, logins, the lake
    source_url: str = ""  # the source (mysql://...); empty: a private server (`private_source`) with the right settings
    private_source: str = "mariadb"  # the private server's kind: mariadb, or mysql (`binlake setup mysql` first)
    source: str = "main"  # the source's name (BINLAKE_SOURCE of the services)
    nats_port: int = 4222  # taken when free, else a free port (remembered in the data dir)
    mariadb_port: int = 3306  # the private source's port, taken when free, else a free one
    prefix: str = "binlake"  # names of every stream, bucket and subject start with it
    sinks: int = 2  # sink workers to run
    nats_cluster: int = 1  # NATS nodes; 3 (or more) runs a JetStream cluster on loopback with R3 streams
    spark_workers: int = 0  # 0: the loader runs Spark in local mode; N: a standalone master and N workers
    demo: bool = False  # also run a sample workload and print the lake table as it changes
    snapshot_tables: str = ""  # regex over db.table: the parser snapshots matching tables on first sight
    log_level: str = "info"  # the services' log level: debug, info, warning or error
    # JetStream's storage limit per NATS node, e.g. 20G (K, M, G, T: powers of 1024); empty: three
    # quarters of what the data directory's disk has for it (free space plus what JetStream holds)
    nats_max_store: str = ""
    # JetStream's sync_interval, how often nats-server fsyncs what it acknowledged: always (before
    # every acknowledgement: a machine crash loses nothing acknowledged), or a duration such as 1s or
    # 2m (nats-server's own default); docs/operations.md#durability
    nats_sync: str = "always"

    def __post_init__(self) -> None:
        if not 1 <= self.nats_cluster <= 5:
            raise ConfigError(f"--nats-cluster must be 1..5 nodes (3 for a cluster that survives a node), "
                              f"got {self.nats_cluster}")
        if self.private_source not in ("mariadb", "mysql"):
            raise ConfigError(f"--source (BINLAKE_PRIVATE_SOURCE) must be mariadb or mysql, "
                              f"got {self.private_source!r}")
        if self.nats_max_store and self.max_store_bytes is None:
            raise ConfigError(f"BINLAKE_NATS_MAX_STORE must be a size like 20G or 512M (bytes: K, M, G, T), "
                              f"got {self.nats_max_store!r}")
        if not re.fullmatch(r"always|[1-9][0-9]{0,5}(ms|s|m|h)", self.nats_sync, re.ASCII):
            raise ConfigError(f"BINLAKE_NATS_SYNC must be always or a duration like 1s, 500ms or 2m, "
                              f"got {self.nats_sync!r}")
        if self.spark_workers < 0:
            raise ConfigError(f"--spark-workers (BINLAKE_SPARK_WORKERS) must be >= 0, got {self.spark_workers}")

    @property
    def max_store_bytes(self) -> int | None:
        """BINLAKE_NATS_MAX_STORE in bytes; None when unset or not a size."""
        m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)i?B?\s*", self.nats_max_store, re.IGNORECASE)
        if m is None or int(m.group(1)) == 0:
            return None
        return int(m.group(1)) * int(1024 ** " KMGT".index(m.group(2).upper() or " "))

    @property
    def replicas(self) -> int:
        """Copies of every stream and bucket: 3 on a cluster of 3 or more, else 1."""
        return 3 if self.nats_cluster >= 3 else 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LauncherConfig:
        return config.load(cls, "up", env)

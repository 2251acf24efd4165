"""LauncherConfig: what `binlake up` runs and where it keeps its data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared import config


@dataclass(frozen=True)
class LauncherConfig:
    data_dir: str = ".binlake"
    source_url: str = ""  # empty: run a private MariaDB with the right binlog settings
    source: str = "main"
    nats_port: int = 4222  # taken when free, else a free port (remembered in the data dir)
    mariadb_port: int = 3306
    prefix: str = "binlake"
    sinks: int = 2
    demo: bool = False  # also run a sample workload and print the lake table as it changes
    snapshot_tables: str = ""  # regex over db.table: the parser snapshots matching tables on first sight
    log_level: str = "info"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LauncherConfig:
        return config.load(cls, "up", env)

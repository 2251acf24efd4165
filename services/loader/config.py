"""LoaderConfig: Spark master and catalog, lake location, batch size and flush interval."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shared import config
from shared.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class LoaderConfig(config.ServiceConfig):
    client: str = "loader"  # the store client name (its cursor is the loader's position)
    filter: str = ".*"  # db.table regex of the tables to load
    master: str = "local[*]"
    data_dir: str = ".binlake"
    warehouse: str = ""  # lake root; default <data_dir>/warehouse (any Hadoop URI works)
    lake_db: str = ""  # Spark database; default binlake_<source>
    batch_rows: int = 50_000
    flush_s: float = 5.0
    spark_conf: dict[str, str] = field(default_factory=dict)  # extra Spark settings
    lease_ttl_s: float = 15.0
    metrics_port: int = 9105
    restart_window_s: float = 300.0
    restart_base_delay_s: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_rows < 1:
            raise ConfigError(f"BINLAKE_BATCH_ROWS must be >= 1, got {self.batch_rows}")
        if self.flush_s <= 0:
            raise ConfigError(f"BINLAKE_FLUSH_S must be > 0, got {self.flush_s}")

    @property
    def root(self) -> str:
        return self.warehouse or str(Path(self.data_dir).resolve() / "warehouse")

    @property
    def database(self) -> str:
        return self.lake_db or f"binlake_{self.source}"


    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LoaderConfig:
        return config.load(cls, "loader", env)

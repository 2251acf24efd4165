"""MetaConfig: backend choice and connection."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared import config
from shared.actor import RestartPolicy
from shared.errors import ConfigError


@dataclass(frozen=True)
class MetaConfig:
    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = "binlake"
    source: str = "main"
    backend: str = "kv"  # kv | mysql
    meta_mysql_url: str = ""  # mysql://user:password@host:3306/database, for backend=mysql
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9104
    max_restarts: int = 8
    restart_window_s: float = 120.0
    restart_base_delay_s: float = 0.5
    log_level: str = "info"

    def __post_init__(self) -> None:
        if self.backend not in ("kv", "mysql"):
            raise ConfigError(f"BINLAKE_BACKEND must be 'kv' or 'mysql', got {self.backend!r}")
        if self.backend == "mysql" and not self.meta_mysql_url:
            raise ConfigError("backend mysql needs BINLAKE_META_MYSQL_URL=mysql://user:password@host:3306/database")

    @property
    def restart(self) -> RestartPolicy:
        return RestartPolicy(max_restarts=self.max_restarts, window_s=self.restart_window_s,
                             base_delay_s=self.restart_base_delay_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MetaConfig:
        return config.load(cls, "meta", env)

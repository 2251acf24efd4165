"""MetaConfig: backend choice and connection."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared import config
from shared.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class MetaConfig(config.ServiceConfig):
    backend: str = "kv"  # kv | mysql
    meta_mysql_url: str = ""  # mysql://user:password@host:3306/database, for backend=mysql
    metrics_port: int = 9104

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in ("kv", "mysql"):
            raise ConfigError(f"BINLAKE_BACKEND must be 'kv' or 'mysql', got {self.backend!r}")
        if self.backend == "mysql" and not self.meta_mysql_url:
            raise ConfigError("backend mysql needs BINLAKE_META_MYSQL_URL=mysql://user:password@host:3306/database")


    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MetaConfig:
        return config.load(cls, "meta", env)

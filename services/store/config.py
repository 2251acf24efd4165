"""StoreConfig: batch protocol limits (BINLAKE_CDC's retention is a setting of every service, `shared.config`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared import config
from shared.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class StoreConfig(config.ServiceConfig):
    max_batch_rows: int = 1_000_000  # rows a batch holds at most (a client asking for more gets this many)
    max_batch_bytes: int = 64 * 1024 * 1024  # a batch ends once its events hold this many bytes
    prefetch_bytes: int = 16 * 1024 * 1024  # what the store reads ahead per client, in bytes
    meta_timeout_s: float = 5.0  # deadline of one request to meta
    metrics_port: int = 9103

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_batch_rows", "max_batch_bytes", "prefetch_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{config.env_name(name)} must be at least 1, got {getattr(self, name)}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StoreConfig:
        return config.load(cls, "store", env)

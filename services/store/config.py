"""StoreConfig: BINLAKE_CDC retention and batch protocol limits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared import config


@dataclass(frozen=True)
class StoreConfig:
    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = "binlake"
    source: str = "main"
    cdc_max_age_s: float = 7 * 86400.0  # 0 = keep forever
    cdc_max_bytes: int = -1  # -1 = unlimited
    max_batch_rows: int = 100_000
    meta_timeout_s: float = 5.0
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9103
    log_level: str = "info"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StoreConfig:
        return config.load(cls, "store", env)

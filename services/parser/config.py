"""ParserConfig: everything the parser reads from the environment / TOML, checked at start."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared import config
from shared.errors import ConfigError
from shared.subjects import fnv1a32


@dataclass(frozen=True, kw_only=True)
class ParserConfig(config.ServiceConfig):
    source_url: str
    partitions: int = 16
    server_id: int = 0  # 0: derived from the source name
    start: str = "current"  # where a parser with an empty stream begins: current | earliest
    heartbeat_s: float = 5.0
    lease_ttl_s: float = 6.0
    publish_window: int = 4000
    ack_timeout_s: float = 15.0
    report_interval_s: float = 1.0
    metrics_port: int = 9101

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.start not in ("current", "earliest"):
            raise ConfigError(f"BINLAKE_START must be 'current' or 'earliest', got {self.start!r}")
        if not 1 <= self.partitions <= 1024:
            raise ConfigError(f"BINLAKE_PARTITIONS must be 1..1024, got {self.partitions}")

    @property
    def replica_server_id(self) -> int:
        """The server_id this replica registers with; must differ from every real server's."""
        return self.server_id or 0x40000000 | (fnv1a32(self.source.encode()) & 0x3FFFFFFF)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ParserConfig:
        return config.load(cls, "parser", env)

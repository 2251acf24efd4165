"""ParserConfig: everything the parser reads from the environment / TOML, checked at start."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared import config
from shared.actor import RestartPolicy
from shared.errors import ConfigError


def _instance() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ParserConfig:
    source_url: str
    source: str = "main"
    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = "binlake"
    partitions: int = 16
    server_id: int = 0  # 0: derived from the source name
    start: str = "current"  # where a parser with an empty stream begins: current | earliest
    heartbeat_s: float = 5.0
    lease_ttl_s: float = 6.0
    publish_window: int = 4000
    ack_timeout_s: float = 15.0
    report_interval_s: float = 1.0
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9101  # 0 picks a free port; -1 disables
    max_restarts: int = 8
    restart_window_s: float = 120.0
    restart_base_delay_s: float = 0.5
    instance: str = field(default_factory=_instance)
    log_level: str = "info"

    def __post_init__(self) -> None:
        if self.start not in ("current", "earliest"):
            raise ConfigError(f"BINLAKE_START must be 'current' or 'earliest', got {self.start!r}")
        if not self.source:
            raise ConfigError("BINLAKE_SOURCE must not be empty")
        if not 1 <= self.partitions <= 1024:
            raise ConfigError(f"BINLAKE_PARTITIONS must be 1..1024, got {self.partitions}")

    @property
    def restart(self) -> RestartPolicy:
        return RestartPolicy(max_restarts=self.max_restarts, window_s=self.restart_window_s,
                             base_delay_s=self.restart_base_delay_s)

    @property
    def replica_server_id(self) -> int:
        """The server_id this replica registers with; must differ from every real server's."""
        if self.server_id:
            return self.server_id
        from shared.subjects import fnv1a32

        return 0x40000000 | (fnv1a32(self.source.encode()) & 0x3FFFFFFF)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ParserConfig:
        return config.load(cls, "parser", env)

"""SinkConfig: connection, scaling and the filter / column / mask rules of one source."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.sink.rules import Rules
from shared import config
from shared.actor import RestartPolicy


def _instance() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class SinkConfig:
    source: str = "main"
    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = "binlake"
    partitions: int = 16
    instance: str = field(default_factory=_instance)
    member_ttl_s: float = 6.0
    batch: int = 500
    cursor_interval_s: float = 1.0
    publish_timeout_s: float = 10.0
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    skip_ops: tuple[str, ...] = ()
    columns_include: dict[str, list[str]] = field(default_factory=dict)
    columns_exclude: dict[str, list[str]] = field(default_factory=dict)
    masks: dict[str, dict[str, str]] = field(default_factory=dict)
    mask_salt: str = ""
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9102
    max_restarts: int = 8
    restart_window_s: float = 120.0
    restart_base_delay_s: float = 0.5
    log_level: str = "info"

    def rules(self) -> Rules:
        return Rules.build(include=self.include, exclude=self.exclude, skip_ops=self.skip_ops,
                           columns_include=self.columns_include, columns_exclude=self.columns_exclude,
                           masks=self.masks, salt=self.mask_salt)

    @property
    def restart(self) -> RestartPolicy:
        return RestartPolicy(max_restarts=self.max_restarts, window_s=self.restart_window_s,
                             base_delay_s=self.restart_base_delay_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SinkConfig:
        cfg = config.load(cls, "sink", env)
        cfg.rules()  # fail at start-up on a bad regex or mask
        return cfg

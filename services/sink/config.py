"""SinkConfig: connection, scaling and the filter / column / mask rules of one source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.sink.rules import Rules
from shared import config


@dataclass(frozen=True, kw_only=True)
class SinkConfig(config.ServiceConfig):
    member_ttl_s: float = 15.0  # outlasts a JetStream leader election (a few seconds)
    rebalance_s: float = 30.0  # how often the tables per partition are counted again
    batch: int = 500
    fetch_bytes: int = 64 * 1024 * 1024  # raw messages a partition holds read ahead, in bytes
    cursor_interval_s: float = 1.0
    publish_timeout_s: float = 10.0
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    skip_ops: tuple[str, ...] = ()
    columns_include: dict[str, list[str]] = field(default_factory=dict)
    columns_exclude: dict[str, list[str]] = field(default_factory=dict)
    masks: dict[str, dict[str, str]] = field(default_factory=dict)
    mask_salt: str = ""
    # The source's @@lower_case_table_names: 0 matches database and table names by case, 1 and 2
    # ignore it. The sink has no connection to the source, so it is told; 1 is the default because
    # ignoring case can only apply a rule to more tables, never let a mask miss its table.
    lower_case_table_names: int = 1
    metrics_port: int = 9102

    def rules(self) -> Rules:
        return Rules.build(include=self.include, exclude=self.exclude, skip_ops=self.skip_ops,
                           columns_include=self.columns_include, columns_exclude=self.columns_exclude,
                           masks=self.masks, salt=self.mask_salt,
                           lower_case_table_names=self.lower_case_table_names)


    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SinkConfig:
        cfg = config.load(cls, "sink", env)
        cfg.rules()  # fail at start-up on a bad regex or mask
        return cfg

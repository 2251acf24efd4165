"""SinkConfig: connection, scaling and the filter / column / mask rules of one source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.sink.rules import Rules
from shared import config


@dataclass(frozen=True, kw_only=True)
class SinkConfig(config.ServiceConfig):
    member_ttl_s: float = 15.0  # a worker that stops is out of the split this long after (outlasts a leader election)
    rebalance_s: float = 30.0  # how often the tables per partition are counted again
    batch: int = 500  # raw messages per fetch, published as one atomic batch
    fetch_bytes: int = 64 * 1024 * 1024  # raw messages a partition holds read ahead, in bytes
    cursor_interval_s: float = 1.0  # how often a partition's cursor is written
    publish_timeout_s: float = 10.0  # deadline of one publish to BINLAKE_CDC
    include: tuple[str, ...] = ()  # regexes full-matching db.table: only these tables (Canal's filter.regex)
    exclude: tuple[str, ...] = ()  # regexes full-matching db.table: not these tables; wins over include
    skip_ops: tuple[str, ...] = ()  # row operations to drop: i, u, d, r
    # {"db.table glob": [columns]}: keep only these columns
    columns_include: dict[str, list[str]] = field(default_factory=dict)
    # {"db.table glob": [columns]}: drop these columns
    columns_exclude: dict[str, list[str]] = field(default_factory=dict)
    # {"db.table glob": {"column": "hash" | "truncate:N" | "replace:TEXT"}}: mask values
    masks: dict[str, dict[str, str]] = field(default_factory=dict)
    mask_salt: str = ""  # salt of the hash mask (sha256 hex); required with masks
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

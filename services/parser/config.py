"""ParserConfig: everything the parser reads from the environment / TOML, checked at start."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared import config
from shared.errors import ConfigError
from shared.patterns import PatternError, compile_pattern
from shared.subjects import fnv1a32


@dataclass(frozen=True, kw_only=True)
class ParserConfig(config.ServiceConfig):
    source_url: str  # mysql://user:password@host:3306 of the source (BINLAKE_SOURCE_URL_FILE for a file)
    server_id: int = 0  # the replica's server_id at the source (0: derived from the source name)
    start: str = "current"  # where a parser with an empty stream begins: current | earliest
    heartbeat_s: float = 5.0  # replication heartbeat the source sends while idle
    source_stall_s: float = 0.0  # nothing from the source this long: unhealthy, lease given up (0: auto)
    lease_ttl_s: float = 15.0  # a standby parser takes over this long after the active one stops
    publish_window: int = 4000  # publishes in flight to JetStream at most
    publish_window_bytes: int = 64 * 1024 * 1024  # bytes of publishes in flight at most
    buffer_bytes: int = 64 * 1024 * 1024  # messages the binlog thread may have ready, in bytes
    ack_timeout_s: float = 15.0  # deadline of one publish's ack
    report_interval_s: float = 1.0  # how often the position is written to the cursor bucket
    metrics_port: int = 9101
    watermark_table: str = "binlake.watermarks"  # where snapshots write their watermarks (DBLog)
    snapshot_tables: str = ""  # regex over db.table: snapshot such tables on first sight ("" = only on request)
    snapshot_chunk_rows: int = 4096  # rows per snapshot chunk (a keyless table's page)
    snapshot_chunk_bytes: int = 32 * 1024 * 1024  # a chunk (a keyless table's page) ends early at this many bytes
    snapshot_parallel: int = 2  # tables snapshotted at once
    snapshot_max_rows_s: float = 0.0  # rate limit over all tables; 0 = unlimited
    snapshot_poll_s: float = 1.0  # how often snapshot requests are looked for
    snapshot_scan_s: float = 10.0  # how often BINLAKE_SNAPSHOT_TABLES looks for new tables

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.source_stall_s and self.source_stall_s < 2 * self.heartbeat_s:
            raise ConfigError(f"BINLAKE_SOURCE_STALL_S ({self.source_stall_s:g}) must be at least twice "
                              f"BINLAKE_HEARTBEAT_S ({self.heartbeat_s:g}): an idle source only sends heartbeats")
        if self.start not in ("current", "earliest"):
            raise ConfigError(f"BINLAKE_START must be 'current' or 'earliest', got {self.start!r}")
        if self.snapshot_chunk_rows < 1:
            raise ConfigError(f"BINLAKE_SNAPSHOT_CHUNK_ROWS must be at least 1, got {self.snapshot_chunk_rows}")
        if self.snapshot_chunk_bytes < self.snapshot_chunk_rows:
            raise ConfigError(f"BINLAKE_SNAPSHOT_CHUNK_BYTES ({self.snapshot_chunk_bytes}) must be at least "
                              f"BINLAKE_SNAPSHOT_CHUNK_ROWS ({self.snapshot_chunk_rows})")
        for name in ("buffer_bytes", "publish_window_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{config.env_name(name)} must be at least 1, got {getattr(self, name)}")
        if not 1 <= self.snapshot_parallel <= 64:
            raise ConfigError(f"BINLAKE_SNAPSHOT_PARALLEL must be 1..64, got {self.snapshot_parallel}")
        if self.snapshot_poll_s <= 0 or self.snapshot_scan_s <= 0:
            raise ConfigError("BINLAKE_SNAPSHOT_POLL_S and BINLAKE_SNAPSHOT_SCAN_S must be > 0, got "
                              f"{self.snapshot_poll_s} and {self.snapshot_scan_s}")
        if self.snapshot_max_rows_s < 0:
            raise ConfigError(f"BINLAKE_SNAPSHOT_MAX_ROWS_S must be >= 0, got {self.snapshot_max_rows_s}")
        try:
            compile_pattern(self.snapshot_tables)
        except PatternError as exc:
            raise ConfigError(f"BINLAKE_SNAPSHOT_TABLES: {exc}") from None
        db, dot, table = self.watermark_table.partition(".")
        if not (db and dot and table):
            raise ConfigError(f"BINLAKE_WATERMARK_TABLE must be <db>.<table>, got {self.watermark_table!r}")

    @property
    def stall_s(self) -> float:
        """BINLAKE_SOURCE_STALL_S, or by default 30 s and at least three heartbeats."""
        return self.source_stall_s or max(30.0, 3 * self.heartbeat_s)

    @property
    def watermark(self) -> tuple[str, str]:
        db, _, table = self.watermark_table.partition(".")
        return db, table

    @property
    def replica_server_id(self) -> int:
        """The server_id this replica registers with; must differ from every real server's."""
        return self.server_id or 0x40000000 | (fnv1a32(self.source.encode()) & 0x3FFFFFFF)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ParserConfig:
        return config.load(cls, "parser", env)

"""LoaderConfig: Spark master, the lake's Iceberg catalog, batch size, merge and maintenance schedule."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from services.loader.spark import CatalogConfig
from shared import config
from shared.errors import ConfigError

MAX_BATCH_ROWS = 100_000_000  # beyond any store's batch (64 MiB of events): a typo, not a setting
MAX_WRITE_THREADS = 64  # each a py4j connection and a concurrent Iceberg commit


@dataclass(frozen=True, kw_only=True)
class LoaderConfig(config.ServiceConfig):
    client: str = "loader"  # the store client name (its cursor is the loader's position)
    filter: str = ".*"  # db.table regex of the tables to load
    master: str = "local[*]"  # Spark master: local[*], spark://host:7077, ...
    data_dir: str = ".binlake"  # where the lake lives unless BINLAKE_WAREHOUSE says otherwise
    warehouse: str = ""  # lake root; default <data_dir>/lake (any Hadoop URI works)
    catalog: str = "lake"  # the Iceberg catalog's name in Spark SQL: <catalog>.<db>.<table>
    catalog_type: str = "hadoop"  # hadoop | jdbc | rest | hive (Iceberg catalog types)
    catalog_uri: str = ""  # jdbc:mysql://..., http://..., thrift://...
    catalog_options: dict[str, str] = field(default_factory=dict)  # more spark.sql.catalog.<catalog>.* settings
    batch_rows: int = 50_000  # rows the loader asks the store for per batch
    # While behind (each batch full), the rows asked for double per batch up to this many: fewer,
    # larger lake commits in a catch-up. The store's BINLAKE_MAX_BATCH_ROWS bounds it too.
    catch_up_rows: int = 800_000
    batch_bytes: int = 64 * 1024 * 1024  # a batch from the store holds at most this many bytes of events
    flush_s: float = 5.0  # a batch waits at most this long for more rows
    write_threads: int = 4  # lake tables appended at once when a batch holds only row changes for them
    merge_rows: int = 1_000_000  # merge the changelog into the current table at this many rows, or at BINLAKE_MERGE_S
    merge_s: float = 300.0  # merge the changelog when its oldest change is this old (seconds; 4x while behind)
    maintenance_s: float = 3600.0  # compaction and snapshot expiry every so often (0: never)
    keep_snapshots_s: float = 7 * 86400.0  # time travel window (older snapshots expire)
    retry_held_s: float = 600.0  # a table set aside is tried again this often (and at every start)
    rename_wait_batches: int = 30  # reads ahead (of up to flush_s each) for the other half of a RENAME TABLE
    spark_conf: dict[str, str] = field(default_factory=dict)  # extra Spark settings
    # A Spark properties file the driver reads (spark-submit's --properties-file): settings kept
    # off command lines, e.g. a standalone cluster's spark.authenticate.secret.
    spark_properties: str = ""
    lease_ttl_s: float = 15.0  # one loader per client writes: a standby takes over this long after it stops
    metrics_port: int = 9105
    restart_window_s: float = 300.0
    restart_base_delay_s: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("batch_rows", "catch_up_rows", "merge_rows", "batch_bytes", "write_threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{config.env_name(name)} must be >= 1, got {getattr(self, name)}")
        for name, most in (("batch_rows", MAX_BATCH_ROWS), ("catch_up_rows", MAX_BATCH_ROWS),
                           ("write_threads", MAX_WRITE_THREADS)):
            if getattr(self, name) > most:
                raise ConfigError(f"{config.env_name(name)} must be at most {most:,}, got {getattr(self, name)}")
        for name in ("flush_s", "merge_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{config.env_name(name)} must be > 0, got {getattr(self, name)}")
        if self.flush_s > 60:
            raise ConfigError(f"BINLAKE_FLUSH_S must be at most 60 (the store's longest wait), got {self.flush_s}")
        if self.catalog_type != "hadoop" and not (self.catalog_uri or self.catalog_options):
            raise ConfigError(f"BINLAKE_CATALOG_TYPE={self.catalog_type} needs BINLAKE_CATALOG_URI "
                              "(or BINLAKE_CATALOG_OPTIONS)")

    @property
    def root(self) -> str:
        """The warehouse; a plain path made absolute, since executors resolve paths in their own directory."""
        if self.warehouse and urlsplit(self.warehouse).scheme:
            return self.warehouse
        return str(Path(self.warehouse).resolve() if self.warehouse else Path(self.data_dir).resolve() / "lake")

    @property
    def lake_catalog(self) -> CatalogConfig:
        return CatalogConfig(self.catalog, self.catalog_type, self.root, self.catalog_uri, dict(self.catalog_options))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LoaderConfig:
        return config.load(cls, "loader", env)

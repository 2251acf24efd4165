"""The Spark session: local by default, any cluster through `master` and `spark_conf`.

Local mode keeps the Hive metastore (embedded Derby) and the warehouse under the data
directory, so a restart finds its tables again. With a real metastore, set
`spark.hadoop.hive.metastore.uris` in `spark_conf`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession


def session(app: str, master: str, data_dir: str, warehouse: str, extra: Mapping[str, str] | None = None,
            hive: bool = True) -> SparkSession:
    meta = Path(data_dir).resolve() / "metastore"
    builder = (SparkSession.builder.appName(app).master(master)
               .config("spark.sql.warehouse.dir", warehouse)
               .config("spark.hadoop.javax.jdo.option.ConnectionURL",
                       f"jdbc:derby:;databaseName={meta / 'metastore_db'};create=true")
               .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={meta}")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.sources.partitionOverwriteMode", "static")
               # The Hive metastore's partition filter parser refuses names that start with '_'
               # (`_batch`, `_version`): prune partitions in Spark, or every view query fails.
               .config("spark.sql.hive.metastorePartitionPruning", "false")
               .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS"))
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    if hive:
        builder = builder.enableHiveSupport()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark

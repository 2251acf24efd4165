"""The private servers used by tests live with the launcher (`binlake up` starts the same ones)."""

from services.launcher.servers import (
    MariaDB,
    NatsServer,
    free_port,
    mariadb_binaries,
    nats_server_binary,
    start_mariadb,
    start_nats,
)

__all__ = ["MariaDB", "NatsServer", "free_port", "mariadb_binaries", "nats_server_binary", "start_mariadb",
           "start_nats"]

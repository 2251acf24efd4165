"""A Spark standalone cluster on this machine for `binlake up --spark-workers N`.

The master and N workers (1 core, 1 GiB each) are launcher children, restarted when they
die, started with `spark-class` from the pyspark installation on 127.0.0.1 and free ports.
Their logs and work directories live under `<data>/spark`. The loader reaches the master
through its `BINLAKE_MASTER` setting. Every connection to the master, the workers and the
driver authenticates with a shared secret and is encrypted (`auth.properties`, owner-only, read
by each JVM with `--properties-file`, so the secret is on no command line): whoever reaches the
master without it runs nothing. The web UIs listen on 127.0.0.1 (SPARK_LOCAL_IP). On several
machines, run Spark's own master and workers instead; the warehouse must then be shared storage
every worker sees.

In a container (deploy/docker-compose.cluster.yml) the secret comes as BINLAKE_SPARK_SECRET and
`secret_to_properties` turns it into the same kind of file at start, for `binlake spark
master|worker` and the loader alike. Not Spark's own `_SPARK_AUTH_SECRET` variable: a standalone
driver refuses to start without `spark.authenticate.secret` in its configuration, and
`spark.authenticate.secret.file` is for Kubernetes only (Spark 3.5 `SecurityManager`).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from services.launcher.children import Child
from services.launcher.servers import free_port, tcp_open
from shared.errors import ConfigError, SparkUnavailable

MASTER_START_TIMEOUT = 60.0
SECRET_ENV = "BINLAKE_SPARK_SECRET"  # the cluster's shared secret, as a container gets it (deploy/.env)
PROPERTIES_ENV = "BINLAKE_SPARK_PROPERTIES"  # a properties file for the driver (LoaderConfig) and the daemons


@dataclass(frozen=True)
class SparkCluster:
    """A standalone master and its workers as children; `master_url` is what the loader connects to."""

    master_port: int
    webui_port: int
    master: Child
    workers: list[Child]
    auth: Path  # the shared secret's properties file

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    @property
    def children(self) -> list[Child]:
        return [self.master, *self.workers]

    def client_env(self) -> dict[str, str]:
        """What the loader needs to run its driver against this cluster."""
        return {"BINLAKE_MASTER": self.master_url, "SPARK_LOCAL_IP": "127.0.0.1",
                PROPERTIES_ENV: str(self.auth)}

    async def wait_ready(self, timeout: float = MASTER_START_TIMEOUT) -> None:
        """Until the master listens: a driver that finds no master gives up after a long retry."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        while not await loop.run_in_executor(None, tcp_open, self.master_port):
            if time.monotonic() > deadline:
                raise SparkUnavailable(
                    f"the Spark master did not listen on 127.0.0.1:{self.master_port} within {timeout:.0f}s: "
                    "see its [spark-master] lines (is `java` 17 on PATH?)")
            await asyncio.sleep(0.5)


def spark_home() -> Path:
    """The pyspark package: a pip-installed pyspark is a whole Spark distribution."""
    try:
        import pyspark
    except ImportError:
        raise ConfigError("--spark-workers needs pyspark: pip install -e '.[spark]'") from None
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise ConfigError(f"{home} has no bin/spark-class: reinstall pyspark (pip install --force-reinstall pyspark)")
    return home


def spark_env(data: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The daemons' environment: loopback only, logs and work under `data`, Spark's INFO lines off,
    the class archive mapped (their class path is the driver's: Spark's jars)."""
    from services.loader import class_archive
    from services.loader.spark import quiet_log4j

    options = f"-Dlog4j.configurationFile=file:{quiet_log4j()} {class_archive.java_options()}"
    return {**env, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(data / "logs"), "SPARK_WORKER_DIR": str(data / "work"),
            "SPARK_DAEMON_JAVA_OPTS": options.strip()}


def auth_conf(secret: str) -> dict[str, str]:
    """What master, workers and driver share: the secret every connection authenticates with, RPC
    encryption, and a master UI that kills nothing (it answers without a login)."""
    return {"spark.authenticate": "true", "spark.authenticate.secret": secret,
            "spark.network.crypto.enabled": "true", "spark.ui.killEnabled": "false"}


def write_auth_properties(path: Path, secret: str) -> Path:
    """`auth_conf(secret)` as a new properties file only its owner reads."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.writelines(f"{key} {value}\n" for key, value in auth_conf(secret).items())
    return path


def auth_properties(data: Path) -> Path:
    """Spark's shared secret and RPC encryption, as a properties file only its owner reads (made once)."""
    path = data / "auth.properties"
    if not path.is_file():
        write_auth_properties(path, secrets.token_hex(32))
    return path


def secret_to_properties(env: MutableMapping[str, str]) -> str | None:
    """Move BINLAKE_SPARK_SECRET out of `env` into a properties file named by BINLAKE_SPARK_PROPERTIES.

    The file is new, 0600, in a fresh 0700 directory, removed when this process exits normally
    (a daemon that execs Spark leaves its few bytes in the container's /tmp). What starts from
    `env` afterwards (the JVM, and the executors a worker starts) does not inherit the secret; a
    worker hands its executors the secret in Spark's own way, `_SPARK_AUTH_SECRET`, not argv.
    Returns the file's path, or None without a secret."""
    secret = env.pop(SECRET_ENV, None)
    if secret is None:
        return None
    if not secret or any(c.isspace() or c == "\\" for c in secret):  # a properties file would read another
        raise ConfigError(f"{SECRET_ENV} must be non-empty, without spaces or backslashes "
                          "(deploy/make-env.sh writes a hex one into deploy/.env)")
    if env.get(PROPERTIES_ENV):
        raise ConfigError(f"{SECRET_ENV} and {PROPERTIES_ENV} are both set: give the secret one way")
    directory = tempfile.mkdtemp(prefix="binlake-spark-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    env[PROPERTIES_ENV] = str(write_auth_properties(Path(directory) / "auth.properties", secret))
    return env[PROPERTIES_ENV]


def spark_cluster(data: Path, workers: int, env: Mapping[str, str]) -> SparkCluster:
    """A master and `workers` workers under `data` (created), not started: run their children."""
    if workers < 1:
        raise ConfigError(f"--spark-workers must be >= 1 for a cluster, got {workers}")
    data = data.resolve()
    (data / "logs").mkdir(parents=True, exist_ok=True)
    os.chmod(data, 0o700)
    env = spark_env(data, env)
    auth = auth_properties(data)
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, webui = free_port(), free_port()
    master = Child("spark-master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                    "--port", str(port), "--webui-port", str(webui), "--properties-file", str(auth)],
                   env, color=2)
    url = f"spark://127.0.0.1:{port}"
    children = [Child(f"spark-worker-{i}", [spark_class, "org.apache.spark.deploy.worker.Worker", url,
                                            "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                                            "--webui-port", str(free_port()), "--work-dir", str(data / f"work-{i}"),
                                            "--properties-file", str(auth)],
                      env, color=2)
                for i in range(1, workers + 1)]
    return SparkCluster(port, webui, master, children, auth)

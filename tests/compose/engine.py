"""A private Docker engine for the compose test: its own dockerd, base image, stand-ins and compose v2.

Everything lives in one temporary directory (data root, sockets, CLI plugins, image
tarball); `stop` ends dockerd and removes the network state it leaves on the host (the
docker0 bridge and its iptables chains). No registry is reachable here, so (PITFALLS,
"Running the compose stack"):
- the Dockerfile's base image is a Debian bookworm root file system made by mmdebstrap,
  imported under the name the Dockerfile starts FROM;
- registry images of the compose file are built here and tagged with the very names the
  compose file uses, so the user's file runs unchanged: MySQL is the real server, MySQL 9.7 LTS
  from Debian sid's packages (the root `binlake setup mysql` prepares, imported as an image, with
  an entrypoint of the official image's contract: tests/compose/mysql); NATS and nats-box are
  stand-ins built from the base image (tests/compose/standins);
- compose v2 comes from Debian trixie's docker-compose and docker-buildx packages
  (bookworm's docker-compose 1.29 cannot read the file).

`compose` adds one file of its own to the user's: the tests' JVM options (tests/servers.py) for
the containers of the project's image, whose JVMs (the loader's, Spark's daemons) are the
stack's largest CPU cost.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml

from tests.servers import TEST_JVM_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parent / "standins"
MYSQL = Path(__file__).resolve().parent / "mysql"
MYSQL_ROOT_IMAGE = "binlake-mysql-root:local"  # the prepared root as it is; tests/compose/mysql builds FROM it
DEBIAN = "http://deb.debian.org/debian"
BOOKWORM_SOURCES = (f"deb {DEBIAN} bookworm main", f"deb {DEBIAN} bookworm-updates main",
                    "deb http://deb.debian.org/debian-security bookworm-security main")


def missing_tools() -> list[str]:
    """What this machine lacks to run the engine (empty: the test can run)."""
    out = [tool for tool in ("dockerd", "docker", "mmdebstrap", "apt-get", "dpkg", "iptables")
           if shutil.which(tool) is None]
    if os.geteuid() != 0:
        out.append("root")
    return out


def _services() -> dict[str, dict[str, object]]:
    return dict(yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())["services"])


def _default(image: str) -> str:
    """An image name as the compose file gives it, `${VAR:-default}` as its default."""
    return image.split(":-", 1)[1].rstrip("}") if image.startswith("${") else image


def compose_images() -> dict[str, str]:
    """The registry images the default stack runs, by service (with their defaults filled in); the
    services of an opt-in profile (monitoring) are not started, so no stand-in is built for them."""
    return {name: _default(image) for name, svc in _services().items()
            if "build" not in svc and not svc.get("profiles")
            and (image := str(svc.get("image", ""))) and "BINLAKE_IMAGE" not in image}


def project_image() -> str:
    """The one image the compose file builds (deploy/Dockerfile), with its default filled in."""
    images = {_default(str(svc["image"])) for svc in _services().values() if "build" in svc}
    assert len(images) == 1, f"one project image expected, the compose file builds {sorted(images)}"
    return images.pop()


def base_image() -> str:
    """The FROM of deploy/Dockerfile (its BASE_IMAGE default)."""
    for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines():
        if line.startswith("ARG BASE_IMAGE="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("deploy/Dockerfile has no ARG BASE_IMAGE=")


@dataclass
class Engine:
    home: Path
    log: list[str] = field(default_factory=list)
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def sock(self) -> Path:
        return self.home / "docker.sock"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.sock}", "DOCKER_CONFIG": str(self.home / "config"),
                "DOCKER_BUILDKIT": "1", "BUILDKIT_PROGRESS": "plain", "COMPOSE_PROGRESS": "plain"}

    # -- commands ------------------------------------------------------------------------------

    def run(self, *args: str | Path, timeout: float = 900, check: bool = True, cwd: Path | None = None,
            env: dict[str, str] | None = None, stdin: IO[bytes] | None = None) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        cmd = [str(a) for a in args]
        proc = subprocess.run(cmd, env={**self.env, **(env or {})}, cwd=cwd or ROOT, capture_output=True,
                              text=True, timeout=timeout, check=False, stdin=stdin)
        self.log.append(f"$ {' '.join(cmd)}  ({time.monotonic() - started:.0f}s, exit {proc.returncode})")
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed with exit {proc.returncode}:\n"
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
        return proc

    def docker(self, *args: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.run("docker", *args, **kw)  # type: ignore[arg-type]

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        (self.home / "config" / "cli-plugins").mkdir(parents=True, exist_ok=True)
        with (self.home / "dockerd.log").open("wb") as logfile:
            self._proc = subprocess.Popen(
                ["dockerd", "--data-root", str(self.home / "data"), "--exec-root", str(self.home / "exec"),
                 "--pidfile", str(self.home / "dockerd.pid"), "-H", f"unix://{self.sock}"],
                stdout=logfile, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while self.docker("info", check=False, timeout=30).returncode != 0:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"dockerd did not start:\n{self.dockerd_log()}")
            time.sleep(0.5)

    def dockerd_log(self) -> str:
        path = self.home / "dockerd.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None
        _remove_network_state()

    # -- what the compose file needs -----------------------------------------------------------

    def install_compose(self) -> None:
        """compose v2 and buildx as CLI plugins, from Debian trixie's packages."""
        apt = self.home / "apt"
        (apt / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (apt / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (apt / "sources.list").write_text(f"deb {DEBIAN} trixie main\n")
        opts = ["-o", f"Dir::Etc::SourceList={apt / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/dev/null",
                "-o", f"Dir::State::Lists={apt / 'lists'}", "-o", f"Dir::Cache={apt / 'cache'}",
                "-o", "APT::Sandbox::User=root", "-qq"]
        self.run("apt-get", *opts, "update")
        self.run("apt-get", *opts, "download", "docker-compose", "docker-buildx", cwd=apt)
        for deb in apt.glob("*.deb"):
            self.run("dpkg", "-x", deb, apt / "x")
        for plugin in ("docker-compose", "docker-buildx"):
            shutil.copy(apt / "x" / "usr" / "libexec" / "docker" / "cli-plugins" / plugin,
                        self.home / "config" / "cli-plugins" / plugin)
        self.docker("compose", "version")

    def build_base(self) -> None:
        """A Debian bookworm image with Python 3.11 and pip, tagged as deploy/Dockerfile's base."""
        tar = self.home / "base.tar"
        # The host's CA bundle goes in (package mirrors and PyPI may be reached through a proxy
        # with its own CA), also as a local CA so that update-ca-certificates keeps it.
        hook = ('cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"; '
                'cp /etc/ssl/certs/ca-certificates.crt "$1/usr/local/share/ca-certificates/host-bundle.crt"; '
                'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED')
        self.run("mmdebstrap", "--variant=minbase", "--mode=root", "--quiet",
                 "--include=ca-certificates,python3,python3-pip,python-is-python3,python3-venv",
                 f"--customize-hook={hook}", "bookworm", tar, *BOOKWORM_SOURCES, timeout=900)
        self.docker("import", "--change", 'CMD ["python3"]', tar, base_image(), timeout=600)
        tar.unlink()

    def import_root(self, root: Path, name: str) -> None:
        """A root file system directory as an image, streamed through tar into `docker import`."""
        # /dev, /proc and /sys are the container's own at run time.
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "--exclude=./dev/*",
                                "--exclude=./proc/*", "--exclude=./sys/*", "-c", "."], stdout=subprocess.PIPE)
        try:
            assert tar.stdout is not None
            self.docker("import", "-", name, stdin=tar.stdout, timeout=600)
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            rc = tar.wait(60)
        assert rc == 0, f"tar of {root} failed with exit {rc}"

    def build_server_images(self, nats_server: Path) -> None:
        """Images for the compose file's registry images, tagged with their names (the MySQL root
        imported as MYSQL_ROOT_IMAGE first)."""
        images = compose_images()
        assert set(images) == {"mysql", "nats", "nats-box"}, f"images for {sorted(images)} needed"
        self.docker("build", "--build-arg", f"BASE_IMAGE={MYSQL_ROOT_IMAGE}", "-t", images["mysql"], MYSQL)
        context = self.home / "nats-context"
        shutil.copytree(STANDINS / "nats", context)
        shutil.copy(nats_server, context / "nats-server")
        for service, directory in (("nats", context), ("nats-box", STANDINS / "nats-box")):
            self.docker("build", "--build-arg", f"BASE_IMAGE={base_image()}", "-t", images[service], directory)

    def prepare(self, nats_server: Path, mysql_root: Path) -> None:
        """Compose, the base image, the server images and the project's image, side by side where
        they do not depend on each other (most of it is waiting on package mirrors)."""
        with ThreadPoolExecutor(3) as pool:
            steps = [pool.submit(self.install_compose), pool.submit(self.build_base),
                     pool.submit(self.import_root, mysql_root, MYSQL_ROOT_IMAGE)]
            for step in steps:
                step.result()
            steps = [pool.submit(self.build_server_images, nats_server), pool.submit(self.build_project)]
            for step in steps:
                step.result()

    def build_project(self) -> None:
        """deploy/Dockerfile as the compose file builds it (`up --build` then finds its layers cached)."""
        self.docker("build", "-f", ROOT / "deploy" / "Dockerfile", "-t", project_image(), ROOT, timeout=1800)

    def compose(self, *args: str, env: dict[str, str] | None = None, timeout: float = 900,
                check: bool = True, file: str = "docker-compose.yml") -> subprocess.CompletedProcess[str]:
        return self.run("docker", "compose", "-f", ROOT / "deploy" / file, "-f", self.jvm_options(file), *args,
                        env=env, timeout=timeout, check=check)

    def jvm_options(self, file: str) -> Path:
        """A compose file that sets JAVA_TOOL_OPTIONS in every service of deploy/`file` that runs the project image."""
        services = yaml.safe_load((ROOT / "deploy" / file).read_text())["services"]
        names = [name for name, svc in services.items() if "BINLAKE_IMAGE" in str(svc.get("image", ""))]
        path = self.home / f"jvm-options.{file}"
        path.write_text(yaml.safe_dump({"services": {
            name: {"environment": {"JAVA_TOOL_OPTIONS": TEST_JVM_OPTIONS}} for name in names}}))
        return path


def _remove_network_state() -> None:
    """What dockerd leaves behind: the docker0 bridge and its iptables chains and rules."""
    subprocess.run(["ip", "link", "delete", "docker0"], capture_output=True, check=False)
    for table in ("filter", "nat"):
        rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True,
                               check=False).stdout.splitlines()
        for rule in rules:  # jumps into docker's chains first, then the chains themselves
            if rule.startswith("-A ") and ("DOCKER" in rule or "docker0" in rule) \
                    and not rule.split()[1].startswith("DOCKER"):
                subprocess.run(["iptables", "-t", table, *_delete(rule)], capture_output=True, check=False)
        chains = [r.split()[1] for r in rules if r.startswith("-N DOCKER")]
        for chain in chains:
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True, check=False)
        for chain in chains:
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True, check=False)


def _delete(rule: str) -> Sequence[str]:
    parts = rule.split()
    return ["-D", *parts[1:]]

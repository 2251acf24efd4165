"""binlake services as plain child processes, for tests and benchmarks (`binlake up` supervises
its own through children.py): `python -m services.<x>` with its output in a log file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without any BINLAKE_* variable, plus `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BINLAKE_")}
    env.update(settings)
    return env


def service_command(module: str) -> list[str]:
    """How a binlake service runs: `python -m <module>` with this interpreter."""
    return [sys.executable, "-m", module]


def spawn(module: str, env: Mapping[str, str], log: Path, *, command: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """Start `python -m <module>` (or `command`) from the project root, its output appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(list(command) or service_command(module), env=dict(env), cwd=ROOT,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def stop_all(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float = 20) -> None:
    """SIGTERM every process at once, then wait for each (SIGKILL after `timeout_s`)."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


class ServiceProcess:
    """A binlake service as a child process, its output captured in a file."""

    def __init__(self, module: str, env: Mapping[str, str], log_path: Path) -> None:
        self.module = module
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        self.proc = spawn(self.module, self.env, self.log_path)
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15) -> int | None:
        if self.proc is None:
            return None
        stop_all([self.proc], timeout)
        return self.proc.returncode

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def returncode(self) -> int | None:
        """The exit code (None while running or before the start)."""
        return None if self.proc is None else self.proc.poll()

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.module} was not started"
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

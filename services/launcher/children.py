"""Child service processes of `binlake up`: prefixed logs, restart with backoff, clean stop.

Each child is one actor-like task that owns its process: it spawns `python -m services.<x>`
(or any command, e.g. a Spark master or worker), copies every output line to our stdout
behind `[name]`, and restarts the child when it dies
(exit code != 0, e.g. kill -9) with exponential backoff, like an orchestrator would.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence

import structlog

from services.launcher.processes import service_command
from shared.actor import RestartPolicy

COLORS = ("36", "32", "35", "33", "34", "31")


class Child:
    def __init__(self, name: str, command: Sequence[str], env: Mapping[str, str], *, color: int = 0,
                 restart: RestartPolicy | None = None) -> None:
        self.name = name
        self.command = list(command)
        self.env = dict(env)
        self.restart = restart or RestartPolicy(max_restarts=1_000_000, window_s=60, base_delay_s=0.5,
                                                max_delay_s=10)
        self._prefix = f"\x1b[{COLORS[color % len(COLORS)]}m[{name}]\x1b[0m " if sys.stdout.isatty() else f"[{name}] "
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.log = structlog.get_logger().bind(actor=f"child.{name}")

    @classmethod
    def service(cls, name: str, module: str, env: Mapping[str, str], *, color: int = 0) -> Child:
        """A binlake service: `python -m <module>` with this interpreter."""
        return cls(name, service_command(module), env, color=color)

    async def run(self) -> None:
        """Keep the child running until cancelled; then stop it gracefully."""
        attempt = 0
        try:
            while True:
                code = await self._run_once()
                attempt = attempt + 1 if code != 0 else 0
                delay = self.restart.delay(max(attempt, 1))
                self.log.warning("child.exited", code=code, restart_in_s=delay)
                await asyncio.sleep(delay)
        finally:
            await self.stop()

    async def _run_once(self) -> int:
        self.starts += 1
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, env=self.env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        )
        assert self.proc.stdout is not None
        await copy_lines(self.proc.stdout, self._prefix)
        return await self.proc.wait()

    async def stop(self, grace_s: float = 15.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def copy_lines(stream: asyncio.StreamReader, prefix: str) -> None:
    """Copy a child's output to ours with `prefix` before every line, until it closes.

    Read in chunks, not lines: a line longer than the reader's buffer (a Java stack trace in
    one JSON log line) must neither stop the copy nor leave the child blocked on a full pipe.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    at_start = True
    while chunk := await stream.read(1 << 16):
        pieces = decoder.decode(chunk).split("\n")
        out = []
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            if last and not piece:
                break
            if at_start:
                out.append(prefix)
            out.append(piece if last else piece + "\n")
            at_start = not last
        sys.stdout.write("".join(out))
        sys.stdout.flush()

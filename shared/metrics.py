"""Prometheus text metrics and `/healthz`, served by a tiny asyncio HTTP server.

A service registers gauges and counters on one `Registry`; values are plain attributes
updated by the actor that owns them (one writer each), read only when `/metrics` is scraped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

Labels = tuple[tuple[str, str], ...]


@dataclass
class Metric:
    name: str
    help: str
    kind: str  # counter | gauge
    values: dict[Labels, float] = field(default_factory=dict)

    def set(self, value: float, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] = value

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def get(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)


class Registry:
    def __init__(self, namespace: str = "binlake") -> None:
        self.namespace = namespace
        self._metrics: dict[str, Metric] = {}

    def _add(self, name: str, help: str, kind: str) -> Metric:
        full = f"{self.namespace}_{name}"
        if full not in self._metrics:
            self._metrics[full] = Metric(full, help, kind)
        return self._metrics[full]

    def counter(self, name: str, help: str) -> Metric:
        return self._add(name, help, "counter")

    def gauge(self, name: str, help: str) -> Metric:
        return self._add(name, help, "gauge")

    def render(self) -> str:
        lines: list[str] = []
        for m in self._metrics.values():
            lines += [f"# HELP {m.name} {m.help}", f"# TYPE {m.name} {m.kind}"]
            for labels, value in sorted(m.values.items()):
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{m.name}{{{label_text}}} {value:g}" if label_text else f"{m.name} {value:g}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def serve(registry: Registry, host: str, port: int, problem: Callable[[], str | None]) -> asyncio.Server:
    """Serve GET /metrics and GET /healthz (200 "ok", or 503 with the reason `problem()` gives)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            path = request.split(b" ")[1].decode() if request.count(b" ") >= 2 else "/"
            if path.startswith("/metrics"):
                status, body = "200 OK", registry.render()
            elif path.startswith("/healthz"):
                reason = problem()
                status, body = ("200 OK", "ok\n") if reason is None else ("503 Service Unavailable", f"{reason}\n")
            else:
                status, body = "404 Not Found", "try /metrics or /healthz\n"
            data = body.encode()
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    structlog.get_logger().info("metrics.listening", host=host, port=server.sockets[0].getsockname()[1])
    return server

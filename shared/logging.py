"""structlog set-up: JSON lines in production, a readable console on a terminal.

`merge_contextvars` comes first so `bind_contextvars(service=...)` in `main` reaches every
task. `redact_secrets` makes sure no password or token is ever rendered, whichever key or
URL it hides in.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog
import structlog.tracebacks

from shared.errors import ConfigError

LOG_FORMAT_ENV = "BINLAKE_LOG_FORMAT"
"""`console`, `json` or `auto` (console on a terminal): `log_style`."""
LOG_COLOR_ENV = "BINLAKE_LOG_COLOR"
"""`1`: colour the console form also when standard error is not a terminal (`binlake up` sets it
for its children when its own output is a colour terminal)."""

_SECRET_KEYS = re.compile(r"pass(word)?|secret|token|credential|salt|nkey", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^/\s]*)@")
_URL_TOKEN = re.compile(r"(?P<scheme>(?:nats|tls|ws|wss)://)(?P<token>[^:/@\s]+)@")


def redact(value: str) -> str:
    """Hide the password of `scheme://user:password@host` (the host starts after the last `@`,
    as urlsplit reads it) and the token of `nats://token@host`."""
    value = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", value)
    return _URL_TOKEN.sub(lambda m: f"{m['scheme']}***@", value)


def redact_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Hide secrets in the event, also inside its rendered exception (a list of frames and values)."""
    for key, value in list(event.items()):
        event[key] = _redacted(key, value)
    return event


def _redacted(key: str, value: Any) -> Any:
    if _SECRET_KEYS.search(key) and value is not None:
        return "***"
    if isinstance(value, (bytes, bytearray)):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        return redact(value) if "@" in value else value
    if isinstance(value, dict):
        return {k: _redacted(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_redacted("", v) for v in value]
    return value


def log_style(env: Mapping[str, str] | None = None, tty: bool | None = None) -> tuple[bool, bool]:
    """(JSON?, colours?) from BINLAKE_LOG_FORMAT / BINLAKE_LOG_COLOR and whether stderr is a terminal."""
    env = os.environ if env is None else env
    tty = sys.stderr.isatty() if tty is None else tty
    style = env.get(LOG_FORMAT_ENV, "auto").strip().lower() or "auto"
    if style not in ("auto", "json", "console"):
        raise ConfigError(f"{LOG_FORMAT_ENV} must be console, json or auto (console on a terminal), got {style!r}")
    json = style == "json" or (style == "auto" and not tty)
    colors = not json and "NO_COLOR" not in env and (tty or env.get(LOG_COLOR_ENV) == "1")
    return json, colors


def _drop_service(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event.pop("service", None)
    return event


def configure(service: str, level: str = "info", json: bool | None = None) -> None:
    """Configure structlog once per process and bind `service`: JSON lines for machines, one
    compact line per event for people (`log_style`)."""
    colors = False
    if json is None:
        json, colors = log_style()
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True) if json else
        structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
        # The exception rendered before the secrets are hidden: its messages name URLs too. Never
        # with frame locals: they hold DSNs and passwords.
        structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False))
        if json else structlog.processors.format_exc_info,
        redact_secrets,
    ]
    if json:
        renderer: Any = structlog.processors.JSONRenderer()
    else:
        # Whoever reads a console knows the service (`binlake up` puts its name before each line).
        processors.append(_drop_service)
        renderer = structlog.dev.ConsoleRenderer(colors=colors, pad_event_to=0, pad_level=False,
                                                 exception_formatter=structlog.dev.plain_traceback)
    processors.append(renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)
    # The replication library logs through stdlib logging; keep its warnings, route to stderr.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")

"""structlog set-up: JSON lines in production, a readable console on a terminal.

`merge_contextvars` comes first so `bind_contextvars(service=...)` in `main` reaches every
task. `redact_secrets` makes sure no password or token is ever rendered, whichever key or
URL it hides in.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
import structlog.tracebacks

_SECRET_KEYS = re.compile(r"pass(word)?|secret|token|credential|salt|nkey", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^/\s]*)@")
_URL_TOKEN = re.compile(r"(?P<scheme>(?:nats|tls|ws|wss)://)(?P<token>[^:/@\s]+)@")


def redact(value: str) -> str:
    """Hide the password of `scheme://user:password@host` (the host starts after the last `@`,
    as urlsplit reads it) and the token of `nats://token@host`."""
    value = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", value)
    return _URL_TOKEN.sub(lambda m: f"{m['scheme']}***@", value)


def redact_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event.items()):
        if _SECRET_KEYS.search(key) and value is not None:
            event[key] = "***"
        elif isinstance(value, str) and "@" in value:
            event[key] = redact(value)
    return event


def configure(service: str, level: str = "info", json: bool | None = None) -> None:
    """Configure structlog once per process and bind `service`."""
    if json is None:
        json = not sys.stderr.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]
    if json:
        # Never render frame locals: they hold DSNs and passwords.
        processors.append(structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)))
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

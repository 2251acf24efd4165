"""What every operator command needs: where NATS is, and one clear line when it is not there."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from services.launcher import login
from shared.config import NatsSettings, check_replicas
from shared.errors import BinlakeError, ConfigError

T = TypeVar("T")


def _url_given(settings: NatsSettings) -> bool:
    """Whether the URL was set (environment, file or BINLAKE_CONFIG), not the default."""
    return "BINLAKE_NATS_URL" in os.environ or settings.nats_url != NatsSettings.nats_url


def nats_url() -> str:
    """The NATS URL set (BINLAKE_NATS_URL, its _FILE or BINLAKE_CONFIG), else the NATS of a local
    `binlake up` (its data dir), else the default."""
    settings = NatsSettings.from_env()
    if _url_given(settings):
        return settings.nats_url
    ports = Path(os.environ.get("BINLAKE_DATA_DIR", ".binlake")) / "ports.json"
    try:
        return f"nats://127.0.0.1:{json.loads(ports.read_text())['nats']}"
    except (OSError, ValueError, KeyError):
        return "nats://127.0.0.1:4222"


def nats_auth() -> NatsSettings:
    """BINLAKE_NATS_* login settings, else, with the URL of a local `binlake up`, its login."""
    settings = NatsSettings.from_env()
    if _url_given(settings) or settings.nats_user or settings.nats_token or settings.nats_creds \
            or settings.nats_nkey_seed:
        return settings
    secret = login.password_file(Path(os.environ.get("BINLAKE_DATA_DIR", ".binlake")))
    if not secret.is_file():
        return settings
    return dataclasses.replace(settings, nats_user=login.ADMIN, nats_password=secret.read_text().strip())


def replicas() -> int:
    """BINLAKE_REPLICAS (1): copies of a bucket a command has to create, as the services would."""
    raw = os.environ.get("BINLAKE_REPLICAS", "1")
    try:
        return check_replicas(int(raw))
    except ValueError:
        raise ConfigError(f"BINLAKE_REPLICAS must be a number, got {raw!r}") from None


def run(command: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    import asyncio

    from shared.logging import configure

    configure("cli", level="warning", json=False)
    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BinlakeError as exc:
        print(f"binlake {command}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None

"""`binlake up` runs NATS with a user per role (`shared.permissions`), passwords generated into the data directory.

Each password is a 0600 file `<data>/nats-users/<role>`, kept across runs; the server's
configuration is 0600 too. Every child gets its role's user, inbox and the file's path
(`BINLAKE_NATS_PASSWORD_FILE`), never the password itself; `binlake status`, `tail`,
`snapshot` and `rewind` log in as `admin` through the data directory, like they find the ports,
and the `nats` CLI through the context file `<data>/nats-context.json` (`nats --context <file>`).
`write_private` and `secret` are the data directory's one way to write a secret (the private
source's passwords too, `source.py`).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from shared import permissions
from shared.config import NatsSettings
from shared.errors import ConfigError
from shared.subjects import Names

ADMIN = "admin"


def password_file(data: Path, role: str = ADMIN) -> Path:
    return data / "nats-users" / role


def write_private(path: Path, text: str) -> None:
    """Write `text` to a file only its owner may read (also when it existed with a wider mode)."""
    if path.is_symlink():  # planted: the secret would land where it points
        raise ConfigError(f"{path} is a symbolic link, not binlake's file: remove it (and find out who made it)")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)


def secret(path: Path) -> str:
    """A random secret kept in an owner-only file in an owner-only directory, made on first use.

    URL-safe characters only: it goes unquoted into URLs, option files and configurations."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    if not path.exists() and not path.is_symlink():
        write_private(path, secrets.token_urlsafe(24) + "\n")
    if path.is_symlink():  # planted: it would hand us a known password, or take ours elsewhere
        raise ConfigError(f"{path} is a symbolic link, not binlake's secret: remove it (and find out who made it)")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as file:
        return file.read().strip()


def password(data: Path, role: str = ADMIN) -> str:
    """A role's NATS password, made on first use."""
    return secret(password_file(data, role))


def route_password(data: Path) -> str:
    """What the routes of a `--nats-cluster` log in with: no rogue server joins as a route."""
    return secret(data / "nats-route")


def server_config(data: Path, names: Names, *, max_store: int | None = None, sync: str = "") -> Path:
    """A nats-server configuration (`-c`) with every role's user: no connection without a login;
    with `max_store`, JetStream's storage limit in bytes; with `sync`, JetStream's `sync_interval`
    (`always`: an fsync before every ack; docs/operations.md#durability)."""
    path = data / "nats-login.conf"
    passwords = {role: '"' + password(data, role) + '"' for role in permissions.ROLES}
    js = ([f"  max_file_store: {max_store}"] if max_store is not None else []) + (
        [f'  sync_interval: "{sync}"'] if sync else [])  # quoted: nats-server reads a bare 2m as 2 million
    block = "jetstream {\n" + "\n".join(js) + "\n}\n" if js else ""
    write_private(path, block + permissions.server_config(names, passwords))
    return path


def settings(data: Path, role: str) -> NatsSettings:
    """A role's login."""
    return NatsSettings(nats_user=role, nats_password=password(data, role), nats_inbox=permissions.inbox(role),
                        nats_api_prefix=permissions.api_prefix(role))


def admin(data: Path) -> NatsSettings:
    """The admin's login (`binlake init`, the operator's commands)."""
    return settings(data, ADMIN)


def client_env(data: Path, role: str) -> dict[str, str]:
    """The BINLAKE_NATS_* settings a child of `role` logs in with."""
    password(data, role)
    return {**permissions.login_env(role), "BINLAKE_NATS_PASSWORD_FILE": str(password_file(data, role))}


def context_file(data: Path) -> Path:
    return data / "nats-context.json"


def write_context(data: Path, url: str) -> Path:
    """A `nats` CLI context logging in as admin: `nats --context <file>` (or NATS_CONTEXT=<file>)
    loads a path ending in `.json` as the context (natscli 0.0.34 and later), so the password is
    on no command line. The password is in the file itself: only jsm.go's unreleased main resolves
    a `file://` reference there, the released CLI would send the reference as the password."""
    path = context_file(data)
    write_private(path, json.dumps({"description": "binlake up: the admin", "url": url, "user": ADMIN,
                                    "password": password(data, ADMIN)}, indent=2) + "\n")
    return path

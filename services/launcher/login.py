"""`binlake up` runs NATS with a login: one user, its password generated into the data directory.

The password file and the server's configuration are 0600 and stay across runs. Every child
gets the user and the file's path (`BINLAKE_NATS_PASSWORD_FILE`), never the password itself;
`binlake status`, `tail`, `snapshot` and `rewind` find them through the data directory, like
the ports.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

USER = "binlake"


def password_file(data: Path) -> Path:
    return data / "nats-password"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)


def password(data: Path) -> str:
    """The data directory's NATS password, made on first use."""
    path = password_file(data)
    if not path.is_file():
        _write_private(path, secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()


def server_config(data: Path) -> Path:
    """A nats-server configuration (`-c`) that refuses every connection without the login."""
    path = data / "nats-login.conf"
    _write_private(path, f'authorization {{\n  user: "{USER}"\n  password: "{password(data)}"\n}}\n')
    return path


def client_env(data: Path) -> dict[str, str]:
    return {"BINLAKE_NATS_USER": USER, "BINLAKE_NATS_PASSWORD_FILE": str(password_file(data))}

"""Typed settings from environment variables and an optional TOML file.

Each service declares a frozen dataclass. `load(Cls, section)` fills every field from, in
order of precedence: `BINLAKE_<FIELD>` in the environment, the contents of the file named by
`BINLAKE_<FIELD>_FILE` (a secret then stays out of env dumps and `ps`; one trailing newline is
dropped), `[section]`, then (for the NATS settings) `[nats]`, then the top level of the TOML file
named by `BINLAKE_CONFIG`, then the field default. A field without default that is missing, or a
value of the wrong type, fails at start-up with a ConfigError naming it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shared.actor import RestartPolicy
from shared.errors import ConfigError
from shared.jetstream import CDC_LIMITS, DLQ_LIMITS, DUPLICATE_WINDOW_S, RAW_LIMITS, Limits
from shared.subjects import DEFAULT_PARTITIONS, INBOX_PREFIX, STREAMS

C = TypeVar("C")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(name: str, raw: Any, kind: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if raw is None or raw == "":
            return None
        return _convert(name, raw, args[0])
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError(raw)
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            return int(raw)
        if kind is float:
            return float(raw)
        if kind is str:
            if not isinstance(raw, str):  # from TOML: a number or a list where text belongs is a mistake
                raise ValueError(raw)
            return raw
        if origin is dict or kind is dict:
            value = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(value, dict):
                raise ValueError(raw)
            return value
        if origin in (tuple, list):
            items = raw if isinstance(raw, (list, tuple)) else [p.strip() for p in str(raw).split(",") if p.strip()]
            (inner, *_) = typing.get_args(kind) or (str,)
            return tuple(_convert(name, i, inner) for i in items)
    except (TypeError, ValueError):  # json.JSONDecodeError is a ValueError
        raise ConfigError(f"{name} must be {getattr(kind, '__name__', kind)}, got {raw!r}") from None
    return raw


def read_toml(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist (BINLAKE_CONFIG)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None


def env_name(field_name: str) -> str:
    """The environment variable of a config field."""
    return f"BINLAKE_{field_name.upper()}"


def load(cls: type[C], section: str, env: Mapping[str, str] | None = None) -> C:
    """Build `cls` from the environment and the TOML file (see module docstring)."""
    env = os.environ if env is None else env
    doc = read_toml(env.get("BINLAKE_CONFIG"))
    scoped = doc.get(section, {}) if isinstance(doc.get(section), dict) else {}
    # How to reach NATS is the same for every service and command: `[nats]` holds it for all.
    shared_nats = doc.get("nats", {})
    if not isinstance(shared_nats, dict):
        raise ConfigError(f"`nats` in BINLAKE_CONFIG must be a table ([nats]), got {shared_nats!r}")
    nats_fields = {f.name for f in dataclasses.fields(NatsSettings)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        env_key = env_name(f.name)
        if env_key in env:
            raw: Any = env[env_key]
        elif f"{env_key}_FILE" in env:
            raw = read_secret(f"{env_key}_FILE", env[f"{env_key}_FILE"])
        elif f.name in scoped:
            raw = scoped[f.name]
        elif f.name in nats_fields and f.name in shared_nats:
            raw = shared_nats[f.name]
        elif f.name in doc and not isinstance(doc[f.name], dict):
            raw = doc[f.name]
        else:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{env_key} is not set (or `{f.name}` in [{section}] of BINLAKE_CONFIG)")
            continue
        values[f.name] = _convert(env_key, raw, hints[f.name])
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid {section} configuration: {exc}") from None


def read_secret(key: str, path: str) -> str:
    """A setting's value from the file `key` names (one trailing newline dropped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"{key}={path!r} cannot be read: {exc}") from None
    return text[:-1] if text.endswith("\n") else text


def default_instance() -> str:
    """`<hostname>-<pid>`: unique per running process (lease and membership owner name)."""
    return f"{socket.gethostname()}-{os.getpid()}"


SOURCE_NAME = re.compile(r"[A-Za-z0-9_-]+")  # BINLAKE_SOURCE and BINLAKE_PREFIX


def check_replicas(replicas: int) -> int:
    """JetStream keeps 1 to 5 copies of a stream; a cluster needs at least that many servers."""
    if not 1 <= replicas <= 5:
        raise ConfigError(f"BINLAKE_REPLICAS must be 1..5 (3 on a three-node JetStream cluster), got {replicas}")
    return replicas


_INBOX = re.compile(INBOX_PREFIX)
_API_PREFIX = re.compile(r"[^.*>\s]+(?:\.[^.*>\s]+)*")


@dataclass(frozen=True, kw_only=True)
class NatsSettings:
    """How to reach and log in to NATS: the same variables for every service and command.

    One login method at most: user and password, a token, a creds file (JWT and nkey seed, as
    `nsc` writes it) or an nkey seed file. TLS: a `tls://` URL, or any of the TLS settings; the
    server is verified against `nats_tls_ca` (else the system's CAs), and a client certificate
    is presented to servers that ask for one. Secrets can come from files (`*_FILE`).
    """

    nats_url: str = "nats://127.0.0.1:4222"  # nats:// or tls:// URL(s) of the NATS servers, comma-separated
    nats_user: str = ""  # NATS user name (with BINLAKE_NATS_PASSWORD)
    nats_password: str = ""  # NATS password (BINLAKE_NATS_PASSWORD_FILE keeps it out of the environment)
    nats_token: str = ""  # NATS token login
    nats_creds: str = ""  # a creds file (JWT and nkey seed, as nsc writes it)
    nats_nkey_seed: str = ""  # a file holding an nkey seed
    nats_tls_ca: str = ""  # CA file the servers are verified against (else the system's CAs)
    nats_tls_cert: str = ""  # client certificate file, for servers that ask for one (with BINLAKE_NATS_TLS_KEY)
    nats_tls_key: str = ""  # the client certificate's key file
    # Replies come to `<nats_inbox>.<id>`: a user confined to its own inbox prefix cannot read
    # the replies of another (deploy/nats/permissions.conf gives each user `_INBOX_<user>`).
    nats_inbox: str = "_INBOX"
    # The JetStream API's subjects as this user's account names them: `$JS.binlake.API` for
    # binlake's role accounts (shared.permissions), which reach the streams' API by imports.
    nats_api_prefix: str = "$JS.API"

    def __post_init__(self) -> None:
        if not _INBOX.fullmatch(self.nats_inbox):
            raise ConfigError(f"BINLAKE_NATS_INBOX={self.nats_inbox!r} must be _INBOX or _INBOX_<user> "
                              "(letters, digits, _, - or %), e.g. _INBOX_loader: services answer only inboxes")
        if not _API_PREFIX.fullmatch(self.nats_api_prefix):
            raise ConfigError(f"BINLAKE_NATS_API_PREFIX={self.nats_api_prefix!r} must be a subject without "
                              "wildcards, e.g. $JS.API (the default) or $JS.binlake.API (binlake's role accounts)")
        methods = [name for name, on in (("BINLAKE_NATS_USER/_PASSWORD", self.nats_user or self.nats_password),
                                         ("BINLAKE_NATS_TOKEN", self.nats_token),
                                         ("BINLAKE_NATS_CREDS", self.nats_creds),
                                         ("BINLAKE_NATS_NKEY_SEED", self.nats_nkey_seed)) if on]
        if len(methods) > 1:
            raise ConfigError(f"NATS takes one login method, got {' and '.join(methods)}: keep one")
        if bool(self.nats_user) != bool(self.nats_password):
            raise ConfigError("BINLAKE_NATS_USER and BINLAKE_NATS_PASSWORD go together: set both")
        if bool(self.nats_tls_cert) != bool(self.nats_tls_key):
            raise ConfigError("BINLAKE_NATS_TLS_CERT and BINLAKE_NATS_TLS_KEY go together: set both")
        for key, path in (("BINLAKE_NATS_CREDS", self.nats_creds), ("BINLAKE_NATS_NKEY_SEED", self.nats_nkey_seed),
                          ("BINLAKE_NATS_TLS_CA", self.nats_tls_ca), ("BINLAKE_NATS_TLS_CERT", self.nats_tls_cert),
                          ("BINLAKE_NATS_TLS_KEY", self.nats_tls_key)):
            if path and not Path(path).is_file():
                raise ConfigError(f"{key}={path!r} is not a readable file")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NatsSettings:
        """What the commands (`binlake status`, `tail`, ...) connect with."""
        return load(cls, "nats", env)


@dataclass(frozen=True, kw_only=True)
class ServiceConfig(NatsSettings):
    """Settings every service has; each service's config extends it."""

    prefix: str = "binlake"  # names of every stream, bucket and subject start with it (letters, digits, _ and -)
    source: str = "main"  # the source's name: in subjects, cursors and the envelope (letters, digits, _ and -)
    partitions: int = DEFAULT_PARTITIONS  # partitions of BINLAKE_RAW: fixed when the stream is created
    replicas: int = 1  # copies of every stream and bucket binlake creates (3 on a JetStream cluster)
    # this process's name in leases and membership; unique per running process
    instance: str = field(default_factory=default_instance)
    # where /metrics and /healthz listen: this machine only; 0.0.0.0 to be scraped from elsewhere
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # port of /metrics and /healthz: 0 picks a free one; -1: none
    max_restarts: int = 8  # transient failures tolerated within BINLAKE_RESTART_WINDOW_S before the process exits
    restart_window_s: float = 120.0  # the window BINLAKE_MAX_RESTARTS counts in, in seconds
    restart_base_delay_s: float = 0.5  # first pause before an actor restarts; doubles per failure
    log_level: str = "info"  # debug, info, warning or error
    # What BINLAKE_RAW, BINLAKE_CDC and BINLAKE_DLQ keep: age in seconds (0 = no limit) and bytes
    # (-1 = no limit); the oldest messages go first. Applied by `binlake init`; a service that
    # creates a stream creates it with them. A message removed before the sink or a reader got
    # to it is reported as a gap, never skipped in silence.
    raw_max_age_s: float = RAW_LIMITS[0]
    raw_max_bytes: int = RAW_LIMITS[1]  # BINLAKE_RAW's size limit in bytes (-1: none)
    cdc_max_age_s: float = CDC_LIMITS[0]  # BINLAKE_CDC's age limit in seconds (0: none)
    cdc_max_bytes: int = CDC_LIMITS[1]  # BINLAKE_CDC's size limit in bytes (-1: none)
    dlq_max_age_s: float = DLQ_LIMITS[0]  # BINLAKE_DLQ's age limit in seconds (0: none: dead letters wait for a person)
    dlq_max_bytes: int = DLQ_LIMITS[1]  # BINLAKE_DLQ's size limit in bytes (-1: none)

    def __post_init__(self) -> None:
        super().__post_init__()
        for stream in STREAMS:
            age, size = self.stream_limits(stream)
            if age < 0 or 0 < age < DUPLICATE_WINDOW_S:
                raise ConfigError(f"BINLAKE_{stream.upper()}_MAX_AGE_S must be 0 (no limit) or at least "
                                  f"{DUPLICATE_WINDOW_S:.0f} (the streams' duplicate window), got {age}")
            if size != -1 and size < 1:
                raise ConfigError(f"BINLAKE_{stream.upper()}_MAX_BYTES must be -1 (no limit) or more than 0, "
                                  f"got {size}")
        if not SOURCE_NAME.fullmatch(self.source):
            raise ConfigError(f"BINLAKE_SOURCE must be letters, digits, '_' or '-', got {self.source!r}")
        if not SOURCE_NAME.fullmatch(self.prefix):
            raise ConfigError(f"BINLAKE_PREFIX must be letters, digits, '_' or '-', got {self.prefix!r}")
        if not 1 <= self.partitions <= 1024:
            raise ConfigError(f"BINLAKE_PARTITIONS must be 1..1024, got {self.partitions}")
        check_replicas(self.replicas)

    def stream_limits(self, stream: str) -> Limits:
        """(max age in seconds, max bytes) of the stream `raw`, `cdc` or `dlq`."""
        return float(getattr(self, f"{stream}_max_age_s")), int(getattr(self, f"{stream}_max_bytes"))

    @property
    def limits(self) -> dict[str, Limits]:
        """Every stream's limits, for `jetstream.ensure_streams`."""
        return {stream: self.stream_limits(stream) for stream in STREAMS}

    @property
    def restart(self) -> RestartPolicy:
        return RestartPolicy(max_restarts=self.max_restarts, window_s=self.restart_window_s,
                             base_delay_s=self.restart_base_delay_s)

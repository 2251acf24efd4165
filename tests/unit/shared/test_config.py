"""config.load: env > [section] > TOML top level > default, with clear ConfigErrors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from services.parser.config import ParserConfig
from shared.config import load
from shared.errors import ConfigError
from shared.subjects import fnv1a32


@dataclass(frozen=True)
class Demo:
    url: str
    port: int = 80
    debug: bool = False
    ratio: float = 0.5
    name: str | None = None
    tags: tuple[str, ...] = ()
    ports: tuple[int, ...] = (1,)


@pytest.fixture
def toml(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "binlake.toml"
        path.write_text(text)
        return str(path)

    return write


def test_defaults_and_required():
    assert load(Demo, "demo", {"BINLAKE_URL": "u"}) == Demo(url="u")


def test_missing_required_names_the_variable():
    with pytest.raises(ConfigError, match=r"BINLAKE_URL is not set.*\[demo\]"):
        load(Demo, "demo", {})


@pytest.mark.parametrize(
    ("env_port", "section", "top", "expected"),
    [
        ("3", "port = 2", "port = 1", 3),
        (None, "port = 2", "port = 1", 2),
        (None, "", "port = 1", 1),
        (None, "", "", 80),
        ("3", "", "", 3),
    ],
)
def test_precedence(toml, env_port, section, top, expected):
    path = toml(f'url = "top"\n{top}\n[other]\nport = 99\n[demo]\n{section}\n')
    env = {"BINLAKE_CONFIG": path}
    if env_port is not None:
        env["BINLAKE_PORT"] = env_port
    cfg = load(Demo, "demo", env)
    assert cfg.port == expected
    assert cfg.url == "top"


def test_section_beats_top_level_for_every_field(toml):
    path = toml('url = "a"\ndebug = false\n[demo]\nurl = "b"\ndebug = true\nratio = 2\ntags = ["x", "y"]\n')
    assert load(Demo, "demo", {"BINLAKE_CONFIG": path}) == Demo(url="b", debug=True, ratio=2.0, tags=("x", "y"))


def test_a_table_at_top_level_is_not_a_value(toml):
    path = toml('[url]\nx = 1\n[demo]\nport = 5\n')
    with pytest.raises(ConfigError, match="BINLAKE_URL is not set"):
        load(Demo, "demo", {"BINLAKE_CONFIG": path})


@pytest.mark.parametrize(
    ("key", "raw", "field", "expected"),
    [
        ("BINLAKE_PORT", " 8080 ", "port", 8080),
        ("BINLAKE_RATIO", "2.5", "ratio", 2.5),
        ("BINLAKE_NAME", "n", "name", "n"),
        ("BINLAKE_NAME", "", "name", None),
        ("BINLAKE_TAGS", "a, b,,c ", "tags", ("a", "b", "c")),
        ("BINLAKE_TAGS", "", "tags", ()),
        ("BINLAKE_PORTS", "1,2, 3", "ports", (1, 2, 3)),
    ],
)
def test_env_conversion(key, raw, field, expected):
    assert getattr(load(Demo, "demo", {"BINLAKE_URL": "u", key: raw}), field) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("False", False), ("no", False),
     ("off", False)],
)
def test_bool_words(raw, expected):
    assert load(Demo, "demo", {"BINLAKE_URL": "u", "BINLAKE_DEBUG": raw}).debug is expected


@pytest.mark.parametrize(
    ("key", "raw", "message"),
    [
        ("BINLAKE_PORT", "abc", "BINLAKE_PORT must be int, got 'abc'"),
        ("BINLAKE_PORT", "1.5", "BINLAKE_PORT must be int"),
        ("BINLAKE_DEBUG", "maybe", "BINLAKE_DEBUG must be bool, got 'maybe'"),
        ("BINLAKE_RATIO", "half", "BINLAKE_RATIO must be float"),
        ("BINLAKE_PORTS", "1,x", "BINLAKE_PORTS must be int, got 'x'"),
    ],
)
def test_bad_values(key, raw, message):
    with pytest.raises(ConfigError) as info:
        load(Demo, "demo", {"BINLAKE_URL": "u", key: raw})
    assert message in str(info.value)


@pytest.mark.parametrize(("text", "message"), [('[demo]\nport = "x"\n', "BINLAKE_PORT must be int"),
                                               ('[demo]\ndebug = "perhaps"\n', "BINLAKE_DEBUG must be bool")])
def test_bad_values_from_toml(toml, text, message):
    with pytest.raises(ConfigError, match=message):
        load(Demo, "demo", {"BINLAKE_URL": "u", "BINLAKE_CONFIG": toml(text)})


@pytest.mark.parametrize("value", ["2.5", "true"])
def test_wrong_toml_type_for_int_is_an_error(toml, value):
    with pytest.raises(ConfigError, match="BINLAKE_PORT must be int"):
        load(Demo, "demo", {"BINLAKE_URL": "u", "BINLAKE_CONFIG": toml(f"[demo]\nport = {value}\n")})


def test_missing_toml_file(tmp_path):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match=r"nope\.toml does not exist \(BINLAKE_CONFIG\)"):
        load(Demo, "demo", {"BINLAKE_URL": "u", "BINLAKE_CONFIG": missing})


def test_invalid_toml_file(toml):
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load(Demo, "demo", {"BINLAKE_URL": "u", "BINLAKE_CONFIG": toml("port = = 1\n")})


def test_empty_config_variable_means_no_file():
    assert load(Demo, "demo", {"BINLAKE_URL": "u", "BINLAKE_CONFIG": ""}) == Demo(url="u")


# -- ParserConfig ---------------------------------------------------------------------------------

URL = {"BINLAKE_SOURCE_URL": "mysql://repl:pw@db:3306"}


def test_parser_config_defaults():
    cfg = ParserConfig.from_env(URL)
    assert (cfg.source_url, cfg.source, cfg.start, cfg.partitions, cfg.heartbeat_s) == (
        "mysql://repl:pw@db:3306", "main", "current", 16, 5.0,
    )
    assert cfg.instance
    assert cfg.restart.max_restarts == 8


def test_parser_config_from_env_and_toml(toml):
    path = toml('partitions = 4\n[parser]\nsource = "east"\nstart = "earliest"\n[sink]\nsource = "no"\n')
    cfg = ParserConfig.from_env(URL | {"BINLAKE_CONFIG": path, "BINLAKE_HEARTBEAT_S": "0.5"})
    assert (cfg.source, cfg.start, cfg.partitions, cfg.heartbeat_s) == ("east", "earliest", 4, 0.5)


def test_parser_config_requires_source_url():
    with pytest.raises(ConfigError, match="BINLAKE_SOURCE_URL is not set"):
        ParserConfig.from_env({})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BINLAKE_START": "latest"}, "BINLAKE_START must be 'current' or 'earliest', got 'latest'"),
        ({"BINLAKE_SOURCE": ""}, "BINLAKE_SOURCE must be letters, digits"),
        ({"BINLAKE_PARTITIONS": "0"}, "BINLAKE_PARTITIONS must be 1..1024"),
        ({"BINLAKE_PARTITIONS": "1025"}, "BINLAKE_PARTITIONS must be 1..1024"),
        ({"BINLAKE_REPLICAS": "0"}, "BINLAKE_REPLICAS must be 1..5"),
        ({"BINLAKE_REPLICAS": "7"}, "BINLAKE_REPLICAS must be 1..5"),
        ({"BINLAKE_METRICS_PORT": "x"}, "BINLAKE_METRICS_PORT must be int"),
        ({"BINLAKE_ACK_TIMEOUT_S": "soon"}, "BINLAKE_ACK_TIMEOUT_S must be float"),
    ],
)
def test_parser_config_rejects_bad_values(env, message):
    with pytest.raises(ConfigError) as info:
        ParserConfig.from_env(URL | env)
    assert message in str(info.value)


def test_replica_server_id():
    assert ParserConfig.from_env(URL | {"BINLAKE_SERVER_ID": "7"}).replica_server_id == 7
    derived = ParserConfig.from_env(URL | {"BINLAKE_SOURCE": "east"}).replica_server_id
    assert derived == 0x40000000 | (fnv1a32(b"east") & 0x3FFFFFFF)
    assert 0x40000000 <= derived < 0x80000000


def test_replicas_default_to_one_and_are_read_like_every_setting():
    assert ParserConfig.from_env(URL).replicas == 1
    assert ParserConfig.from_env(URL | {"BINLAKE_REPLICAS": "3"}).replicas == 3


def test_a_setting_can_come_from_a_file_named_by_its_FILE_variable(tmp_path, toml):
    secret = tmp_path / "url"
    secret.write_text("mysql://u:S3cret@db:3306\n")
    assert load(Demo, "demo", {"BINLAKE_URL_FILE": str(secret)}).url == "mysql://u:S3cret@db:3306"
    # The variable itself still wins, and the file wins over the TOML file.
    assert load(Demo, "demo", {"BINLAKE_URL": "direct", "BINLAKE_URL_FILE": str(secret)}).url == "direct"
    cfg = toml('url = "from-toml"\n')
    assert load(Demo, "demo", {"BINLAKE_CONFIG": cfg, "BINLAKE_URL_FILE": str(secret)}).url.startswith("mysql://")
    with pytest.raises(ConfigError, match=r"BINLAKE_URL_FILE='/nope' cannot be read"):
        load(Demo, "demo", {"BINLAKE_URL_FILE": "/nope"})


def test_nats_settings_take_one_login_method_and_whole_pairs(tmp_path):
    from shared.config import NatsSettings

    seed = tmp_path / "seed"
    seed.write_text("SUA...")
    assert NatsSettings.from_env({}).nats_url == "nats://127.0.0.1:4222"
    assert NatsSettings.from_env({"BINLAKE_NATS_NKEY_SEED": str(seed)}).nats_nkey_seed == str(seed)
    with pytest.raises(ConfigError, match="one login method, got BINLAKE_NATS_USER/_PASSWORD and BINLAKE_NATS_TOKEN"):
        NatsSettings.from_env({"BINLAKE_NATS_USER": "u", "BINLAKE_NATS_PASSWORD": "p", "BINLAKE_NATS_TOKEN": "t"})
    with pytest.raises(ConfigError, match="BINLAKE_NATS_USER and BINLAKE_NATS_PASSWORD go together"):
        NatsSettings.from_env({"BINLAKE_NATS_USER": "u"})
    with pytest.raises(ConfigError, match=r"BINLAKE_NATS_CREDS='/no/such\.creds' is not a readable file"):
        NatsSettings.from_env({"BINLAKE_NATS_CREDS": "/no/such.creds"})
    with pytest.raises(ConfigError, match="BINLAKE_NATS_TLS_CERT and BINLAKE_NATS_TLS_KEY go together"):
        NatsSettings.from_env({"BINLAKE_NATS_TLS_CERT": str(seed)})
    # every service reads them too
    cfg = ParserConfig.from_env({"BINLAKE_SOURCE_URL": "mysql://root@h:3306", "BINLAKE_NATS_TOKEN": "t"})
    assert cfg.nats_token == "t"


@pytest.mark.parametrize(("key", "raw", "message"), [
    ("BINLAKE_RAW_MAX_AGE_S", "-1", "BINLAKE_RAW_MAX_AGE_S must be 0 (no limit) or at least 300"),
    ("BINLAKE_DLQ_MAX_AGE_S", "60", "BINLAKE_DLQ_MAX_AGE_S must be 0 (no limit) or at least 300"),
    ("BINLAKE_CDC_MAX_BYTES", "0", "BINLAKE_CDC_MAX_BYTES must be -1 (no limit) or more than 0"),
    ("BINLAKE_DLQ_MAX_BYTES", "-5", "BINLAKE_DLQ_MAX_BYTES must be -1"),
])
def test_stream_limits_are_checked(key, raw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ParserConfig.from_env({"BINLAKE_SOURCE_URL": "mysql://u@h/", key: raw})


def test_every_streams_limits_are_settings():
    cfg = ParserConfig.from_env({"BINLAKE_SOURCE_URL": "mysql://u@h/", "BINLAKE_RAW_MAX_BYTES": "1048576",
                                 "BINLAKE_DLQ_MAX_AGE_S": "86400"})
    assert cfg.limits == {"raw": (7 * 86400.0, 1048576), "cdc": (7 * 86400.0, -1), "dlq": (86400.0, -1)}


def test_the_nats_section_reaches_every_service_and_a_services_own_section_wins(tmp_path: Path) -> None:
    from services.store.config import StoreConfig

    toml = tmp_path / "binlake.toml"
    toml.write_text('[nats]\nnats_url = "nats://bus:4222"\nnats_user = "u"\nnats_password = "p"\n'
                    '[store]\nnats_user = "store"\n')
    cfg = load(StoreConfig, "store", {"BINLAKE_CONFIG": str(toml)})
    assert (cfg.nats_url, cfg.nats_user, cfg.nats_password) == ("nats://bus:4222", "store", "p")


@pytest.mark.parametrize(("text", "error"), [('nats = "x"\n', "`nats` in BINLAKE_CONFIG must be a table"),
                                             ("[nats]\nnats_url = 5\n", "BINLAKE_NATS_URL must be str, got 5")])
def test_a_nats_section_of_the_wrong_shape_stops_the_service(tmp_path: Path, text: str, error: str) -> None:
    from services.store.config import StoreConfig

    toml = tmp_path / "binlake.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load(StoreConfig, "store", {"BINLAKE_CONFIG": str(toml)})

"""services.sink.config.SinkConfig.from_env: env (JSON dicts, comma lists) and TOML [sink], checked at load."""

from __future__ import annotations

import hashlib
import json

import pytest

from services.sink.config import SinkConfig
from shared.errors import ConfigError


@pytest.fixture
def toml(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "binlake.toml"
        path.write_text(text)
        return str(path)

    return write


def test_defaults_forward_everything():
    cfg = SinkConfig.from_env({})
    assert cfg.include == () and cfg.exclude == () and cfg.skip_ops == ()
    assert cfg.columns_include == {} and cfg.columns_exclude == {} and cfg.masks == {} and cfg.mask_salt == ""
    rules = cfg.rules()
    assert rules.table_allowed("any", "table")
    assert not rules.for_table("any", "table").rewrites


def test_env_json_dicts_and_comma_lists():
    cfg = SinkConfig.from_env({
        "BINLAKE_INCLUDE": r"shop\..*, crm\.leads",
        "BINLAKE_EXCLUDE": r"shop\.audit",
        "BINLAKE_SKIP_OPS": "d, r",
        "BINLAKE_MASKS": '{"shop.users": {"email": "hash", "ssn": "replace:***:x"}}',
        "BINLAKE_MASK_SALT": "s3cret",
        "BINLAKE_COLUMNS_EXCLUDE": '{"shop.*": ["notes", "internal"]}',
        "BINLAKE_COLUMNS_INCLUDE": '{"crm.leads": ["name"]}',
    })
    assert cfg.include == (r"shop\..*", r"crm\.leads")
    assert cfg.exclude == (r"shop\.audit",)
    assert cfg.skip_ops == ("d", "r")
    assert cfg.masks == {"shop.users": {"email": "hash", "ssn": "replace:***:x"}}
    assert cfg.columns_exclude == {"shop.*": ["notes", "internal"]}
    assert cfg.columns_include == {"crm.leads": ["name"]}
    rules = cfg.rules()
    assert rules.table_allowed("shop", "users") and rules.table_allowed("crm", "leads")
    assert not rules.table_allowed("shop", "audit") and not rules.table_allowed("crm", "other")
    assert rules.skip_ops == frozenset({"d", "r"})
    users = rules.for_table("shop", "users")
    assert users.exclude == frozenset({"notes", "internal"})
    assert users.masks["ssn"].arg == "***:x"
    env = {"op": "i", "pk": ["id"], "rows": [{"after": {"id": 1, "email": "a@b.c", "notes": "n"}}]}
    out = rules.apply(env, users)
    assert out is not None
    assert out["rows"] == [{"after": {"id": 1, "email": hashlib.sha256(b"s3cret" + b"a@b.c").hexdigest()}}]
    assert rules.for_table("crm", "leads").include == frozenset({"name"})


def test_toml_sink_section_with_nested_tables(toml):
    path = toml(r'''
nats_url = "nats://top:4222"
mask_salt = "ignored-at-top-level-when-the-section-sets-it"

[parser]
include = ["nope"]

[sink]
include = ['shop\..*', 'crm\.leads']
exclude = 'shop\.audit, shop\.tmp_.*'
skip_ops = ["d"]
mask_salt = "toml-salt"

[sink.masks."shop.users"]
email = "hash"
card = "truncate:4"
motto = "replace:a:b"

[sink.masks."crm.*"]
phone = "replace:XXX"

[sink.columns_exclude]
"shop.*" = ["notes"]

[sink.columns_include]
"crm.leads" = ["name", "phone"]
''')
    cfg = SinkConfig.from_env({"BINLAKE_CONFIG": path})
    assert cfg.nats_url == "nats://top:4222"
    assert cfg.include == (r"shop\..*", r"crm\.leads")
    assert cfg.exclude == (r"shop\.audit", r"shop\.tmp_.*")  # a TOML string is a comma list too
    assert cfg.skip_ops == ("d",)
    assert cfg.mask_salt == "toml-salt"
    assert cfg.masks == {"shop.users": {"email": "hash", "card": "truncate:4", "motto": "replace:a:b"},
                         "crm.*": {"phone": "replace:XXX"}}
    assert cfg.columns_exclude == {"shop.*": ["notes"]}
    assert cfg.columns_include == {"crm.leads": ["name", "phone"]}
    rules = cfg.rules()
    assert not rules.table_allowed("shop", "tmp_1") and not rules.table_allowed("shop", "audit")
    assert rules.table_allowed("shop", "users")
    assert set(rules.for_table("crm", "leads").masks) == {"phone"}
    assert rules.for_table("crm", "leads").include == frozenset({"name", "phone"})


def test_env_overrides_toml(toml):
    path = toml('[sink]\nmask_salt = "t"\n[sink.masks."shop.users"]\nemail = "hash"\n')
    cfg = SinkConfig.from_env({"BINLAKE_CONFIG": path, "BINLAKE_MASKS": '{"shop.orders": {"card": "truncate:2"}}'})
    assert cfg.masks == {"shop.orders": {"card": "truncate:2"}}
    assert cfg.mask_salt == "t"


@pytest.mark.parametrize(("key", "value"), [
    ("BINLAKE_MASKS", "{not json"),
    ("BINLAKE_MASKS", '["shop.users"]'),
    ("BINLAKE_MASKS", '"hash"'),
    ("BINLAKE_COLUMNS_EXCLUDE", "shop.users=ssn"),
    ("BINLAKE_COLUMNS_INCLUDE", '{"a": '),
])
def test_bad_json_is_a_config_error_naming_the_variable(key, value):
    with pytest.raises(ConfigError, match=key):
        SinkConfig.from_env({key: value, "BINLAKE_MASK_SALT": "s"})


@pytest.mark.parametrize(("key", "value"), [("BINLAKE_INCLUDE", r"shop\.(users"),
                                            ("BINLAKE_EXCLUDE", r"ok\.t, [bad")])
def test_bad_regex_fails_at_load_time(key, value):
    with pytest.raises(ConfigError, match="regex"):
        SinkConfig.from_env({key: value})


def test_bad_regex_in_toml_fails_at_load_time(toml):
    with pytest.raises(ConfigError, match="regex"):
        SinkConfig.from_env({"BINLAKE_CONFIG": toml("[sink]\ninclude = ['(']\n")})


@pytest.mark.parametrize("env", [
    {"BINLAKE_MASKS": json.dumps({"shop.users": {"email": "hash"}})},  # no salt
    {"BINLAKE_MASKS": json.dumps({"shop.users": {"email": "sha1"}}), "BINLAKE_MASK_SALT": "s"},
    {"BINLAKE_MASKS": json.dumps({"shop.users": {"email": "truncate:x"}}), "BINLAKE_MASK_SALT": "s"},
    {"BINLAKE_SKIP_OPS": "ddl"},
    {"BINLAKE_SKIP_OPS": "i,hb"},
])
def test_bad_rules_fail_at_load_time(env):
    with pytest.raises(ConfigError):
        SinkConfig.from_env(env)


def test_bad_toml_and_missing_file(toml, tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        SinkConfig.from_env({"BINLAKE_CONFIG": toml("[sink\n")})
    with pytest.raises(ConfigError, match="does not exist"):
        SinkConfig.from_env({"BINLAKE_CONFIG": str(tmp_path / "missing.toml")})


def test_masks_with_a_string_table_entry_is_a_config_error():
    with pytest.raises(ConfigError):
        SinkConfig.from_env({"BINLAKE_MASKS": '{"shop.users": "hash"}', "BINLAKE_MASK_SALT": "s"})


def test_lower_case_table_names_from_env_and_toml(toml):
    assert SinkConfig.from_env({}).lower_case_table_names == 1
    assert SinkConfig.from_env({}).rules().table_allowed("any", "table")
    sensitive = SinkConfig.from_env({"BINLAKE_LOWER_CASE_TABLE_NAMES": "0", "BINLAKE_INCLUDE": r"Shop\.Orders"})
    assert sensitive.lower_case_table_names == 0
    assert sensitive.rules().table_allowed("Shop", "Orders") and not sensitive.rules().table_allowed("shop", "orders")
    path = toml("[sink]\nlower_case_table_names = 2\ninclude = ['Shop\\.Orders']\n")
    cfg = SinkConfig.from_env({"BINLAKE_CONFIG": path})
    assert cfg.lower_case_table_names == 2 and cfg.rules().table_allowed("shop", "orders")


@pytest.mark.parametrize("value", ["3", "-1", "yes", "1.5", ""])
def test_bad_lower_case_table_names_fails_at_load_time(value):
    with pytest.raises(ConfigError, match="BINLAKE_LOWER_CASE_TABLE_NAMES"):
        SinkConfig.from_env({"BINLAKE_LOWER_CASE_TABLE_NAMES": value})

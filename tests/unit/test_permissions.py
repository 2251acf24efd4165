"""The role grants, checked as NATS would match them: who may read RAW, write CDC, define streams."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from shared import keys, permissions
from shared.subjects import Names, subject_matches

ROOT = Path(__file__).resolve().parents[2]
NAMES = Names()


matches = subject_matches  # NATS's own subject matching


def may_publish(role: str, subject: str) -> bool:
    return any(matches(p, subject) for p in permissions.grants(NAMES)[role].publish)


def test_only_parser_sink_and_admin_read_raw() -> None:
    readers = {role for role in permissions.ROLES
               if may_publish(role, f"$JS.API.CONSUMER.CREATE.{NAMES.raw_stream}.c1.binlake.raw.>")
               or may_publish(role, f"$JS.API.DIRECT.GET.{NAMES.raw_stream}")
               or may_publish(role, f"$JS.API.STREAM.MSG.GET.{NAMES.raw_stream}")}
    assert readers == {"parser", "sink", "admin"}
    subscribers = {role for role in permissions.ROLES
                   if any(matches(p, "binlake.raw.main.3.shop.t") for p in permissions.grants(NAMES)[role].subscribe)}
    assert subscribers == {"admin"}


def test_who_writes_what() -> None:
    assert {r for r in permissions.ROLES if may_publish(r, "binlake.raw.main.shop.t")} == {"parser", "admin"}
    assert {r for r in permissions.ROLES if may_publish(r, "binlake.cdc.main.shop.t")} == {"sink", "admin"}
    assert {r for r in permissions.ROLES if may_publish(r, "$KV.binlake_cursors.sink.main.p14")} == \
        {"sink", "meta", "admin"}
    assert {r for r in permissions.ROLES if may_publish(r, "$KV.binlake_cursors.client.main.loader")} == \
        {"meta", "admin"}
    # Whoever may define a stream can add a source, subject or republish to it: the admin only.
    for stream in ("COPY", NAMES.raw_stream, NAMES.cdc_stream, NAMES.dlq_stream, "KV_binlake_cursors",
                   "KV_binlake_leases", "KV_binlake_members", "KV_binlake_schema"):
        for verb in ("CREATE", "UPDATE", "DELETE", "PURGE"):
            assert {r for r in permissions.ROLES if may_publish(r, f"$JS.API.STREAM.{verb}.{stream}")} == {"admin"}


def test_the_loader_files_snapshot_requests_but_reads_no_cursor() -> None:
    assert may_publish("loader", "$KV.binlake_cursors.snapshot.main.request.abc")
    assert not may_publish("loader", "$KV.binlake_cursors.snapshot.main.table.shop.t")
    assert may_publish("loader", f"$KV.binlake_cursors.{keys.loader_held('main', 'loader')}")  # binlake status
    for api in ("$JS.API.DIRECT.GET.KV_binlake_cursors", "$JS.API.CONSUMER.CREATE.KV_binlake_cursors.c.x",
                "$JS.API.STREAM.MSG.GET.KV_binlake_cursors"):
        assert not may_publish("loader", api), api


def test_each_service_replies_only_into_its_own_inbox() -> None:
    grants = permissions.grants(NAMES)
    for role in ("parser", "sink", "store", "meta", "loader"):
        assert grants[role].subscribe[0] == f"{permissions.inbox(role)}.>"
        assert not any(matches(p, "_INBOX.x") or matches(p, f"{permissions.inbox('other')}.x")
                       for p in grants[role].subscribe), role


def test_a_client_acts_only_as_itself() -> None:
    grant = permissions.client_grant(NAMES, "my app/ü")
    assert any(matches(p, NAMES.store_client_rpc("main", "ack", "my app/ü")) for p in grant.publish)
    assert not any(matches(p, NAMES.store_client_rpc("main", "ack", "other")) for p in grant.publish)
    assert not any(matches(p, NAMES.store_rpc("main", "ack")) for p in grant.publish)
    assert grant.subscribe == [f"{permissions.inbox('my app/ü')}.>"]


def test_the_shipped_file_is_generated() -> None:
    assert (ROOT / "deploy" / "nats" / "permissions.conf").read_text() == permissions.shipped()


def test_make_env_writes_private_random_passwords_once(tmp_path: Path) -> None:
    script = tmp_path / "make-env.sh"
    script.write_bytes((ROOT / "deploy" / "make-env.sh").read_bytes())
    subprocess.run(["sh", str(script)], check=True, capture_output=True)
    env = tmp_path / ".env"
    assert env.stat().st_mode & 0o777 == 0o600
    values = dict(line.split("=", 1) for line in env.read_text().splitlines())
    assert set(values) == {"MYSQL_ROOT_PASSWORD", "BINLAKE_SOURCE_PASSWORD", "BINLAKE_ROUTE_PASSWORD",
                           "BINLAKE_SPARK_SECRET", "BINLAKE_GRAFANA_PASSWORD",
                           *(f"BINLAKE_{r.upper()}_PASSWORD" for r in permissions.ROLES)}
    assert all(len(v) == 32 and int(v, 16) >= 0 for v in values.values()) and len(set(values.values())) == 11
    before = env.read_text()
    again = subprocess.run(["sh", str(script)], check=True, capture_output=True, text=True)
    assert env.read_text() == before and "kept" in again.stderr
    # A file from an older binlake: what it has is kept, what it lacks is added.
    env.write_text("".join(line + "\n" for line in before.splitlines() if "SPARK" not in line))
    upgraded = subprocess.run(["sh", str(script)], check=True, capture_output=True, text=True)
    assert "added BINLAKE_SPARK_SECRET" in upgraded.stderr
    now = dict(line.split("=", 1) for line in env.read_text().splitlines())
    assert now.keys() == values.keys() and all(now[k] == v for k, v in values.items() if k != "BINLAKE_SPARK_SECRET")
    assert env.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("inbox", ["", "_INBOX.", "a b", "_INBOX.>"])
def test_a_bad_inbox_prefix_is_refused(inbox: str) -> None:
    from shared.config import NatsSettings
    from shared.errors import ConfigError

    with pytest.raises(ConfigError, match="BINLAKE_NATS_INBOX"):
        NatsSettings(nats_inbox=inbox)


def _account(conf: str, name: str) -> str:
    start = conf.index(f'  "{name}": {{\n')
    return conf[start:conf.index("\n  }\n", start)]


def test_the_streams_live_in_an_account_without_users_or_imports() -> None:
    conf = permissions.server_config(NAMES, {r: '"pw"' for r in permissions.ROLES}, {"app1": '"pw"'})
    data = _account(conf, permissions.DATA)
    assert "jetstream: enabled" in data and "users:" not in data and "imports:" not in data
    for role in permissions.ROLES:
        block = _account(conf, permissions.account(role))
        assert "jetstream" not in block and block.count("user: ") == 1, role
    # Only the admin's inboxes hear what the streams' account delivers (push consumers).
    assert [line.strip() for line in data.splitlines() if "{ stream:" in line] == [
        '{ stream: "_INBOX.>" }', '{ stream: "_INBOX_admin.>" }']


def test_a_role_imports_its_grant_and_calls_the_api_under_its_own_prefix() -> None:
    conf = permissions.server_config(NAMES, {r: '"pw"' for r in permissions.ROLES})
    parser = _account(conf, "PARSER")
    assert ('{ service: { account: "BINLAKE", subject: "$JS.API.DIRECT.GET.BINLAKE_RAW" }, '
            'to: "$JS.binlake.API.DIRECT.GET.BINLAKE_RAW" }') in parser
    assert '{ service: { account: "META", subject: "binlake.meta.schema.add" } }' in parser
    imported = parser.count("{ service: { account:")
    assert imported == len(dict.fromkeys(permissions.grants(NAMES)["parser"].publish))
    assert "STREAM.PURGE.BINLAKE" not in parser and "$JS.API.>" not in parser
    admin = _account(conf, "ADMIN")
    assert '{ service: { account: "BINLAKE", subject: "$JS.API.>" } }' in admin  # the CLI's usual names


def test_login_settings_of_a_role_and_of_the_admin() -> None:
    assert permissions.login_env("sink") == {"BINLAKE_NATS_USER": "sink", "BINLAKE_NATS_INBOX": "_INBOX_sink",
                                             "BINLAKE_NATS_API_PREFIX": "$JS.binlake.API"}
    assert "BINLAKE_NATS_API_PREFIX" not in permissions.login_env("admin")

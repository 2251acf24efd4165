"""Secrets never reach the log output."""

from __future__ import annotations

import json
from typing import Any

import pytest
import structlog

from shared.errors import ConfigError
from shared.logging import configure, log_style, redact, redact_secrets


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mysql://u:secret@h/db", "mysql://u:***@h/db"),
        ("mysql://u:secret@h:3306", "mysql://u:***@h:3306"),
        ("cannot reach mysql://repl:pa%40ss@db:3306 (timeout)", "cannot reach mysql://repl:***@db:3306 (timeout)"),
        ("a mysql://u:s1@h and nats://v:s2@k:4222", "a mysql://u:***@h and nats://v:***@k:4222"),
        ("mysql://:only@h", "mysql://:***@h"),
        ("mysql://root@h:3306", "mysql://root@h:3306"),
        ("no url here", "no url here"),
        ("user@example.com", "user@example.com"),
    ],
)
def test_redact(text, expected):
    assert redact(text) == expected


def test_redact_password_containing_at_sign():
    assert redact("mysql://u:p@ss@h/db") == "mysql://u:***@h/db"


def test_redact_nats_token():
    assert "s3cr3t" not in redact("nats://s3cr3t@nats:4222")


@pytest.mark.parametrize(
    "key",
    ["password", "passwd", "db_pass", "Password", "token", "auth_token", "secret", "client_secret", "credentials",
     "salt", "nkey", "nkey_seed"],
)
def test_redact_secrets_masks_secret_keys(key):
    event = {"event": "x", key: "hunter2", "user": "alice"}
    assert redact_secrets(None, "info", event) == {"event": "x", key: "***", "user": "alice"}


def test_redact_secrets_leaves_none_and_redacts_urls_in_values():
    event = {"event": "x", "password": None, "url": "mysql://u:pw@h", "n": 3, "email": "a@b.c"}
    assert redact_secrets(None, "info", event) == {
        "event": "x", "password": None, "url": "mysql://u:***@h", "n": 3, "email": "a@b.c",
    }


@pytest.fixture
def json_logging(capsys):
    """Configure JSON logging inside the test (capsys swaps stderr per phase); returns a reader of the lines."""

    def read() -> list[dict[str, Any]]:
        return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]

    def start():
        configure("unit", json=True)
        return read

    try:
        yield start
    finally:
        structlog.reset_defaults()
        structlog.contextvars.clear_contextvars()


def test_configured_pipeline_redacts(json_logging):
    read = json_logging()
    structlog.get_logger().info("source.connect", source_url="mysql://u:hunter2@h", token="t0k")
    (line,) = read()
    assert (line["event"], line["service"], line["level"]) == ("source.connect", "unit", "info")
    assert line["source_url"] == "mysql://u:***@h" and line["token"] == "***"


def _connect(url: str) -> None:
    password = "hunter2-local"
    raise ConnectionError(f"refused ({len(password)})")


def test_tracebacks_do_not_render_secret_locals(json_logging):
    read = json_logging()
    try:
        _connect("mysql://u:hunter2-url@h")
    except ConnectionError:
        structlog.get_logger().exception("source.failed")
    text = json.dumps(read())
    assert "source.failed" in text
    assert "hunter2" not in text


@pytest.mark.parametrize(
    ("env", "tty", "style"),
    [
        ({}, True, (False, True)),
        ({}, False, (True, False)),
        ({"BINLAKE_LOG_FORMAT": "json"}, True, (True, False)),
        ({"BINLAKE_LOG_FORMAT": "console"}, False, (False, False)),
        ({"BINLAKE_LOG_FORMAT": "console", "BINLAKE_LOG_COLOR": "1"}, False, (False, True)),  # under `binlake up`
        ({"NO_COLOR": ""}, True, (False, False)),
    ],
)
def test_log_style(env: dict[str, str], tty: bool, style: tuple[bool, bool]) -> None:
    assert log_style(env, tty) == style


def test_an_unknown_log_format_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="BINLAKE_LOG_FORMAT must be console, json or auto"):
        log_style({"BINLAKE_LOG_FORMAT": "xml"}, False)


def test_the_console_form_is_one_line_per_event_without_the_service(capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_LOG_FORMAT", "console")
    configure("sink")
    try:
        structlog.get_logger().info("sink.rebalance", owned=[1, 2], password="hunter2")
        line = capsys.readouterr().err
    finally:
        structlog.reset_defaults()
        structlog.contextvars.clear_contextvars()
    assert line.count("\n") == 1 and "sink.rebalance" in line and "owned=[1, 2]" in line, line
    assert "service" not in line and "hunter2" not in line and not line.startswith("{"), line


@pytest.mark.parametrize("style", ["json", "console"])
def test_an_exceptions_message_is_redacted_in_either_form(style: str, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BINLAKE_LOG_FORMAT", style)
    configure("parser")
    try:
        try:
            raise ValueError("cannot reach mysql://binlake:hunter2@db:3306")
        except ValueError:
            structlog.get_logger().exception("source.failed")
        out = capsys.readouterr().err
    finally:
        structlog.reset_defaults()
        structlog.contextvars.clear_contextvars()
    assert "source.failed" in out and "mysql://binlake:***@db:3306" in out, out
    assert "hunter2" not in out, out


def test_secrets_in_bytes_and_sets_are_redacted() -> None:
    event = redact_secrets(None, "info", {"dsn": b"mysql://root:hunter2@db", "urls": {"nats://u:hunter2@n:4222"}})
    assert "hunter2" not in str(event), event

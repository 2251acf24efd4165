"""BINLAKE_NATS_URL names one server or a whole cluster."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.jetstream import server_urls


def test_one_url_or_several() -> None:
    assert server_urls("nats://127.0.0.1:4222") == ["nats://127.0.0.1:4222"]
    assert server_urls(" nats://a:4222, nats://b:4222 ,nats://c:4222,") == \
        ["nats://a:4222", "nats://b:4222", "nats://c:4222"]


def test_an_empty_url_says_what_to_set() -> None:
    with pytest.raises(ConfigError, match="BINLAKE_NATS_URL is empty"):
        server_urls(" , ")

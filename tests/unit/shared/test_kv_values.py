"""shared.kv_values: binlake's own KV values pass, a NATS server reply relayed into a key never does."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from shared import kv_values
from shared import snapshots as snap
from shared.clients import ClientState
from shared.errors import FatalError, ForeignValue

KEY, BUCKET = "sink.main.p3", "binlake_cursors"

PUB_ACK = b'{"stream":"KV_binlake_leases","seq":6}'
PUB_ACK_DUPLICATE = b'{"stream":"KV_binlake_leases","domain":"hub","seq":6,"duplicate":true}'
API_RESPONSE = (b'{"type":"io.nats.jetstream.api.v1.account_info_response","memory":0,"storage":1024,'
                b'"streams":7,"consumers":3,"limits":{"max_memory":-1,"max_storage":-1}}')
API_ERROR = (b'{"type":"io.nats.jetstream.api.v1.stream_info_response","error":{"code":404,"err_code":10059,'
             b'"description":"stream not found"}}')
PUB_ERROR = b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}'


@pytest.mark.parametrize("value", [PUB_ACK, PUB_ACK_DUPLICATE, API_RESPONSE, API_ERROR, PUB_ERROR],
                         ids=["pub-ack", "pub-ack-duplicate", "api-response", "api-error", "pub-error"])
def test_a_server_reply_is_refused_naming_the_key_and_what_to_do(value: bytes) -> None:
    with pytest.raises(ForeignValue) as err:
        kv_values.load_json(value, KEY, BUCKET)
    message = str(err.value)
    assert KEY in message and "binlake did not write" in message
    assert value[:kv_values.SHOWN].decode() in message  # what is there, at most 80 bytes of it
    assert f"nats kv history {BUCKET} {KEY}" in message and f"nats kv del {BUCKET} {KEY}" in message
    assert f"$KV.{BUCKET}.{KEY}" in message  # the reply subject that wrote it
    assert not err.value.retriable and isinstance(err.value, FatalError)


def test_a_long_value_is_shown_cut() -> None:
    with pytest.raises(ForeignValue) as err:
        kv_values.load_json(API_RESPONSE, KEY)
    assert repr(API_RESPONSE[:80]) + "..." in str(err.value)
    assert "<bucket>" in str(err.value)  # the reader did not know the bucket's name


@pytest.mark.parametrize(("value", "reason"), [
    (b"[1, 2]", "a JSON list"), (b'"x"', "a JSON str"), (b"7", "a JSON int"), (b"null", "a JSON null"),
    (b"", "empty"), (None, "empty"), (b"not json", "not JSON"), (b"\xff\xfe", "not JSON"),
    (b"\x82\xa3seq\x06", "not JSON"),  # msgpack, e.g. an envelope a consumer delivered to the key
])
def test_what_is_no_json_object_is_refused(value: bytes | None, reason: str) -> None:
    with pytest.raises(ForeignValue, match=reason):
        kv_values.load_json(value, KEY, BUCKET)


@pytest.mark.parametrize("value", [
    {"seq": 12, "seen": 40, "updated_ms": 1},  # a sink partition cursor
    {"seq": 12, "updated_ms": 1},  # ... from before `seen`
    {"seq": 3},  # the schema recorder's (and meta's old) cursor
    {"source": "main", "file": "mysql-bin.000001", "offset": 4, "gtid": None, "scn": 1, "ts": 2, "lag_ms": 0,
     "updated_ms": 3},  # the parser's position
    ClientState("app", batches=(4, 9)).to_dict(),
    {"instance": "sink.main.a", "since_ms": 1},  # a sink member
    {"type": "orders"},  # a `type` that is no NATS one
])
def test_binlakes_own_values_pass(value: dict[str, Any]) -> None:
    assert kv_values.load_json(json.dumps(value).encode(), KEY, BUCKET) == value
    assert kv_values.checked(value, KEY) is value


def test_a_snapshot_request_with_its_error_text_passes() -> None:
    failed = snap.SnapshotRequest(id="r1", patterns=["shop.x"], created_ms=1, state="failed", error="no table matches")
    assert kv_values.load_json(failed.to_json(), "snapshot.main.request.r1")["error"] == "no table matches"
    assert snap.SnapshotRequest.from_json(failed.to_json()) == failed
    progress = snap.TableProgress(db="shop", table="x", run="r1", state=snap.FAILED, error="boom")
    assert snap.TableProgress.from_json(progress.to_json()) == progress


@pytest.mark.parametrize("value", [PUB_ACK, API_ERROR])
def test_snapshot_records_refuse_a_server_reply(value: bytes) -> None:
    with pytest.raises(ForeignValue, match=re.escape("snapshot.main.table.shop.x")):
        snap.TableProgress.from_json(value, "snapshot.main.table.shop.x", BUCKET)
    with pytest.raises(ForeignValue, match=re.escape("snapshot.main.request.r1")):
        snap.SnapshotRequest.from_json(value, "snapshot.main.request.r1", BUCKET)


def test_an_already_decoded_value_is_checked_and_shown_as_json() -> None:
    with pytest.raises(ForeignValue, match=r'\{"stream": "KV_binlake_leases", "seq": 6\}'):
        kv_values.checked({"stream": "KV_binlake_leases", "seq": 6}, "client.main.app")
    with pytest.raises(ForeignValue, match="a JSON list"):
        kv_values.checked([1], "client.main.app")


def test_json_nested_too_deep_is_foreign_not_a_crash() -> None:
    with pytest.raises(ForeignValue):
        kv_values.load_json(b"[" * 100_000, "snapshot.main.request.x")

"""update_of: a member's renewal carries its key in a header; a server reply relayed into the bucket does not."""

from __future__ import annotations

import json

from services.sink.membership import MEMBER_HEADER, Update, update_of
from shared import keys
from shared.subjects import Names, kv_subject

BUCKET = Names().members_bucket
PREFIX = kv_subject(BUCKET, "")
KEY = keys.member("main", "a")


def test_a_renewal_with_its_own_key_in_the_header_is_a_member() -> None:
    assert update_of(PREFIX, kv_subject(BUCKET, KEY), {MEMBER_HEADER: KEY, "Nats-Msg-Size": "40"}) == \
        Update(KEY, gone=False, member=True)


def test_an_entry_without_the_header_or_with_another_keys_is_not() -> None:
    ghost = keys.member("main", "ghost")
    # what a relayed publish ack looks like on a headers-only watch: no headers but the size
    assert update_of(PREFIX, kv_subject(BUCKET, ghost), {"Nats-Msg-Size": "40"}) == Update(ghost, False, False)
    assert update_of(PREFIX, kv_subject(BUCKET, ghost), {}) == Update(ghost, False, False)
    # a member's message copied to another key (a consumer delivering into the bucket)
    assert update_of(PREFIX, kv_subject(BUCKET, ghost), {MEMBER_HEADER: KEY}) == Update(ghost, False, False)


def test_deletes_purges_and_server_removals_are_departures() -> None:
    subject = kv_subject(BUCKET, KEY)
    for headers in ({"KV-Operation": "DEL"}, {"KV-Operation": "PURGE"}, {"Nats-Marker-Reason": "MaxAge"},
                    {"Nats-Marker-Reason": "Remove"}, {"Nats-Marker-Reason": "Purge"}):
        assert update_of(PREFIX, subject, headers) == Update(KEY, gone=True, member=False)
    assert update_of(PREFIX, subject, {"Nats-Marker-Reason": "SomethingNew"}) is None


def test_a_worker_from_before_the_header_counts_when_its_value_names_its_key() -> None:
    subject = kv_subject(BUCKET, KEY)
    legacy = json.dumps({"instance": KEY, "since_ms": 1}).encode()
    assert update_of(PREFIX, subject, {}, legacy) == Update(KEY, gone=False, member=True)
    # a server reply, another member's value copied here, or garbage: no member
    for data in (b'{"stream":"KV_binlake_members","seq":6}', json.dumps({"instance": KEY + "x"}).encode(),
                 b"\xff", b"[]", b""):
        assert update_of(PREFIX, subject, {}, data) == Update(KEY, gone=False, member=False), data

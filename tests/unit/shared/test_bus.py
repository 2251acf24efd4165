"""shared.bus is the one table of streams and buckets: every name binlake has is in it, and the
NATS grants reach exactly the streams and buckets it names for each role."""

from __future__ import annotations

import re

import pytest

from shared import bus, permissions
from shared.objects import object_stream
from shared.subjects import Names, kv_stream

NAMES = Names("acme")
SERVICES = ("parser", "sink", "store", "meta", "loader")
API_VERBS = "|".join(verb.replace(".", r"\.") for verb in (
    "STREAM.INFO", "STREAM.MSG.GET", "STREAM.PURGE", "CONSUMER.CREATE", "CONSUMER.DURABLE.CREATE", "CONSUMER.INFO",
    "CONSUMER.DELETE", "CONSUMER.MSG.NEXT", "DIRECT.GET"))


def test_every_stream_and_bucket_binlake_names_is_in_the_table() -> None:
    named = {getattr(NAMES, attr) for attr in dir(Names)
             if attr.endswith(("_stream", "_bucket")) and isinstance(getattr(Names, attr), property)}
    assert set(bus.names_of(NAMES)) == named
    assert len(bus.names_of(NAMES)) == len(named), "each once"


def _streams(grant: permissions.Grant) -> set[str]:
    """The JetStream streams a grant reaches: by API, acks, stream subjects, KV keys or objects."""
    reached: set[str] = set()
    subjects = {s.subjects(NAMES): s.name(NAMES) for s in bus.STREAMS}
    for subject in grant.publish:
        if m := re.fullmatch(rf"\$JS\.(?:API\.(?:{API_VERBS})|ACK)\.([^.*>]+)(?:\.[*>])?", subject):
            reached.add(m.group(1))
        elif m := re.fullmatch(r"\$KV\.([^.]+)\..+", subject):
            reached.add(kv_stream(m.group(1)))
        elif m := re.fullmatch(r"\$O\.([^.]+)\..+", subject):
            reached.add(object_stream(m.group(1)))
        elif subject in subjects:
            reached.add(subjects[subject])
        else:  # nothing of JetStream's is left unread
            assert not subject.startswith("$") or subject == "$JS.API.INFO", subject
    return reached


def _table(role: str) -> set[str]:
    """The streams (a bucket's: its stream) the table lets `role` use in any way."""
    out = {s.name(NAMES) for s in bus.STREAMS if role in (*s.reads, *s.writes, *s.finds)}
    out |= {kv_stream(b.name(NAMES)) for b in bus.BUCKETS if role in (*b.reads, *b.writes, *b.finds)}
    out |= {object_stream(b.name(NAMES)) for b in bus.OBJECT_BUCKETS if role in (*b.reads, *b.writes, *b.finds)}
    return out


@pytest.mark.parametrize("role", SERVICES)
def test_a_roles_grant_reaches_exactly_what_the_table_names(role: str) -> None:
    grant = permissions.grants(NAMES)[role]
    expected = _table(role) | (_table(bus.CLIENT) if role == "loader" else set())
    assert _streams(grant) == expected


def test_a_store_client_reaches_only_what_the_table_gives_every_client() -> None:
    assert _streams(permissions.client_grant(NAMES, "app1")) == _table(bus.CLIENT)


def test_every_role_the_table_names_exists() -> None:
    named = {role for s in (*bus.STREAMS, *bus.BUCKETS, *bus.OBJECT_BUCKETS)
             for role in (*s.reads, *s.writes, *s.finds)}
    assert named <= {*SERVICES, bus.CLIENT}
    assert {o.follows for o in bus.OBJECT_BUCKETS} <= {s.key for s in bus.STREAMS}

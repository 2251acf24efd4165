"""shared.objects: reference envelopes and their checks (the object round trip is in the integration tests)."""

from __future__ import annotations

import hashlib

import pytest

from shared import envelope, objects

ENV = {"v": 1, "source": "main", "db": "d", "table": "t", "op": "i", "ts": 1, "pos": {}, "scn": 7, "chunk": 0,
       "txn": {"id": "x", "i": 0, "last": True}, "rows": [{"after": {"id": 1}}], "schema": {"id": "s"}}


def test_a_reference_names_the_bytes_and_keeps_the_envelope_fields_but_rows_and_schema():
    data = envelope.encode(ENV)
    ref_env = objects.reference(ENV, data, "b", "main:7")
    assert ref_env["rows"] == [] and "schema" not in ref_env and ref_env["scn"] == 7
    ref = objects.Ref.of(ref_env)
    digest = hashlib.sha256(data).hexdigest()
    assert ref == objects.Ref("b", f"main:7.{digest[:16]}", len(data), digest)  # other bytes, another name
    assert objects.Ref.of(ENV) is None and ref_env["v"] == envelope.REF_VERSION
    with pytest.raises(envelope.EnvelopeError, match="expected c"):
        objects.Ref.of(ref_env, "c")  # a reference into another bucket than the reader's
    with pytest.raises(envelope.EnvelopeError, match="without an object reference"):
        objects.Ref.of({**ENV, "v": envelope.REF_VERSION})


@pytest.mark.parametrize("bad", [
    "text", {"bucket": "b", "name": "n", "size": 1}, {"bucket": "b", "name": "n", "size": -1, "sha256": "0" * 64},
    {"bucket": 1, "name": "n", "size": 1, "sha256": "0" * 64}, {"bucket": "b", "name": "n", "size": 1, "sha256": "0"},
])
def test_a_malformed_reference_is_an_envelope_error(bad):
    with pytest.raises(envelope.EnvelopeError, match="malformed object reference"):
        objects.Ref.of({**ENV, "v": envelope.REF_VERSION, "rows": [], "ref": bad})


def test_a_reference_that_also_carries_rows_is_refused():
    ref_env = objects.reference(ENV, b"x", "b", "n")
    with pytest.raises(envelope.EnvelopeError):
        objects.Ref.of({**ref_env, "rows": [{"after": {}}]})


def test_objects_outlive_their_stream_by_a_day_and_forever_with_it():
    assert objects.object_ttl(3600.0) == 3600.0 + 86_400.0
    assert objects.object_ttl(0.0) is None and objects.object_ttl(None) is None


def test_a_reference_is_small_whatever_made_its_envelope_large():
    huge = {**ENV, "op": "ddl", "rows": [], "ddl": "ALTER TABLE t COMMENT '" + "x" * 2_000_000 + "'",
            "alter": {"comment": "y" * 100_000}}
    ref_env = objects.reference(huge, envelope.encode(huge), "b", "n")
    assert len(envelope.encode(ref_env)) < 1000 and "ddl" not in ref_env and "alter" not in ref_env


def test_an_old_reader_refuses_a_reference_instead_of_reading_no_rows():
    ref_env = objects.reference(ENV, envelope.encode(ENV), "b", "n")
    assert envelope.decode(envelope.encode(ref_env))["v"] == envelope.REF_VERSION  # this binlake reads it
    with pytest.raises(envelope.EnvelopeError, match="version 2"):
        envelope.decode(envelope.encode({k: v for k, v in ref_env.items() if k != "ref"}))
    assert objects.maybe_reference(envelope.encode(ref_env)) and not objects.maybe_reference(envelope.encode(ENV))


def test_a_reference_counts_by_the_size_of_its_object_and_anything_else_by_its_own():
    big = {**ENV, "rows": [{"after": {"id": 1, "b": b"x" * 3_000_000}}]}
    data = envelope.encode(big)
    ref_data = envelope.encode(objects.reference(big, data, "b", "main:7"))
    assert objects.resolved_size(ref_data) == len(data) and len(ref_data) < 1000
    plain = envelope.encode(ENV)
    assert objects.resolved_size(plain) == len(plain)
    bad = b"\xa3ref not msgpack"
    assert objects.resolved_size(bad) == len(bad)  # a malformed one: its reader refuses it

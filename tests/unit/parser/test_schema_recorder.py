"""services.parser.schema_recorder: what it sends to meta, and how it reads its cursor (pure parts)."""

from __future__ import annotations

from typing import Any

import pytest

from services.parser.schema_recorder import _record_of, _seq
from shared import envelope, keys
from shared.errors import ForeignValue

SCHEMA = {"id": "s1", "columns": [{"name": "id", "type": "int"}]}


def env(**fields: Any) -> dict[str, Any]:
    return {"db": "shop", "table": "t", "scn": 4_294_967_396, "ts": 1_700_000_000_000, **fields}


def test_rows_give_their_schema_and_a_ddl_its_statement_only() -> None:
    assert _record_of(env(op="i", schema=SCHEMA), "i") == {
        "db": "shop", "table": "t", "scn": 4_294_967_396, "schema": SCHEMA, "ddl": None, "ts": 1_700_000_000_000}
    # A DDL message may carry the table's schema too: the history takes the statement, the
    # rows after it say what the table became.
    ddl = _record_of(env(op="ddl", ddl="ALTER TABLE t ADD c INT", schema=SCHEMA), "ddl")
    assert ddl["ddl"] == "ALTER TABLE t ADD c INT" and ddl["schema"] is None
    # a statement naming no table
    nameless = _record_of(env(op="ddl", ddl="CREATE USER u", db=None, table=None), "ddl")
    assert (nameless["db"], nameless["table"]) == ("", "")


@pytest.mark.parametrize(("fields", "op"), [
    ({"scn": "1"}, "i"), ({"scn": None}, "i"), ({"ts": True}, "i"), ({"scn": -3}, "i"),
    ({"schema": ["x"]}, "i"), ({"schema": None}, "i"), ({"ddl": 5}, "ddl"), ({}, "ddl"),
    ({"table": 7}, "i"),
])
def test_an_envelope_without_what_the_history_needs_is_undecodable(fields: dict[str, Any], op: str) -> None:
    e = env(op=op, schema=SCHEMA) if op != "ddl" else env(op=op)
    e.update(fields)
    with pytest.raises(envelope.EnvelopeError):
        _record_of(e, op)


@pytest.mark.parametrize(("stored", "seq"), [
    (b'{"seq": 42}', 42), (b'{"seq": 0}', 0), (b'{"seq": "42"}', 0), (b'{"seq": -1}', 0), (b'{"seq": true}', 0),
    (b"{}", 0),
])
def test_a_cursor_without_a_usable_seq_means_record_again_from_the_start(stored: bytes, seq: int) -> None:
    assert _seq(stored, "parser.main.schema", "binlake_cursors") == seq


@pytest.mark.parametrize("stored", [
    b'{"stream": "KV_binlake_leases", "seq": 6}',  # a publish ack relayed into the key: would skip records
    b'{"type": "io.nats.jetstream.api.v1.account_info_response", "seq": 3}',
    b"", None, b"not json", b"[1]",
])
def test_a_value_binlake_did_not_write_halts_the_recorder(stored: bytes | None) -> None:
    with pytest.raises(ForeignValue, match=r"parser\.main\.schema"):
        _seq(stored, "parser.main.schema", "binlake_cursors")


def test_its_cursor_key_is_the_parsers_own_and_no_other_sources() -> None:
    assert keys.schema_recorder("main") == "parser.main.schema"
    assert keys.legacy_schema_recorder("main") == "meta.schema.main"
    # a source has no dot: no source's position key is another source's recorder key
    assert keys.schema_recorder("main") != keys.parser_cursor("main")
    assert keys.schema_recorder("main").split(".")[1] == "main"

"""services.meta.server: what a `schema.add` request must look like (the parser's recorder sends them)."""

from __future__ import annotations

from typing import Any

import pytest

from services.meta.backend import SchemaRecord
from services.meta.server import _schema_record
from shared.rpc import BadRequest

SCHEMA = {"id": "s1", "columns": [{"name": "id", "type": "int"}]}
GOOD: dict[str, Any] = {"source": "main", "db": "shop", "table": "t", "scn": (3 << 32) | 120, "schema": SCHEMA,
                        "ddl": None, "ts": 1_700_000_000_000}


def test_a_rows_schema_and_a_ddl_become_records() -> None:
    assert _schema_record(GOOD) == SchemaRecord("main", "shop", "t", (3 << 32) | 120, schema=SCHEMA, ddl=None,
                                                ts=1_700_000_000_000)
    ddl = {**GOOD, "schema": None, "ddl": "ALTER TABLE t ADD c INT"}
    assert _schema_record(ddl).ddl == "ALTER TABLE t ADD c INT" and _schema_record(ddl).schema is None
    # a statement naming no table (the `$binlake.ddl` subject) has empty names
    assert _schema_record({**ddl, "db": "", "table": ""}).table == ""
    # nil may also be left out
    assert _schema_record({k: v for k, v in ddl.items() if k != "schema"}).schema is None


@pytest.mark.parametrize(("change", "message"), [
    ({"source": None}, "missing field 'source'"),
    ({"db": None}, "missing field 'db'"),
    ({"table": None}, "missing field 'table'"),
    ({"scn": None}, "missing field 'scn'"),
    ({"ts": None}, "missing field 'ts'"),
    ({"source": 7}, "field 'source' must be str, got int"),
    ({"source": ""}, "field 'source' must be 1..64 letters, digits, '_' or '-', got ''"),
    ({"source": "a.b"}, "field 'source' must be 1..64 letters"),
    ({"source": "s" * 65}, "field 'source' must be 1..64 letters"),
    ({"db": "d" * 3000}, "field 'db' has 3000 characters; MySQL names have at most 64"),
    ({"table": "t" * 65}, "field 'table' has 65 characters"),
    ({"db": b"shop"}, "field 'db' must be str, got bytes"),
    ({"table": ["t"]}, "field 'table' must be str, got list"),
    ({"scn": "12884902008"}, "field 'scn' must be int, got str"),
    ({"scn": True}, "field 'scn' must be int, got bool"),
    ({"scn": 1.5}, "field 'scn' must be int, got float"),
    ({"scn": -1}, "fields 'scn' and 'ts' must not be negative, got scn=-1"),
    ({"ts": "now"}, "field 'ts' must be int, got str"),
    ({"ts": -5}, "must not be negative, got scn=12884902008 ts=-5"),
    ({"schema": [SCHEMA]}, "field 'schema' must be dict or nil, got list"),
    ({"schema": "s1"}, "field 'schema' must be dict or nil, got str"),
    ({"ddl": 42}, "field 'ddl' must be str or nil, got int"),
    ({"schema": None, "ddl": None}, "give 'schema' (a table's columns) or 'ddl' (a statement), or both"),
])
def test_a_malformed_request_is_refused_with_the_field_named(change: dict[str, Any], message: str) -> None:
    req = {k: v for k, v in {**GOOD, **change}.items() if not (v is None and k not in ("schema", "ddl"))}
    with pytest.raises(BadRequest) as info:
        _schema_record(req)
    assert info.value.code == "bad_request"
    assert message in str(info.value)

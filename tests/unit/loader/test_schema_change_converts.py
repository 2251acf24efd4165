"""Which MODIFYs keeping the lake type change the source's stored values (schema_change.converts)."""

from __future__ import annotations

import pytest

from services.loader.schema_change import converts

DT6 = {"name": "d", "type": "datetime", "nullable": True, "fsp": 6}
VC20 = {"name": "v", "type": "varchar", "nullable": True, "length": 80, "charset": "utf8mb4"}
ENUM = {"name": "e", "type": "enum", "nullable": True, "values": ["a", "b"], "charset": "utf8mb4"}


@pytest.mark.parametrize(("before", "after"), [
    (DT6, {**DT6, "fsp": 0}),
    (VC20, {**VC20, "length": 40}),
    (VC20, {**VC20, "charset": "latin1", "length": 20}),
    (ENUM, {**ENUM, "values": ["a", "c"]}),
    (DT6, {**DT6, "nullable": False}),
    (None, DT6),
])
def test_a_changed_precision_length_member_charset_or_null_rule_converts(before, after):
    assert converts(before, after)


@pytest.mark.parametrize(("before", "after"), [
    (DT6, dict(DT6)),
    (VC20, {**VC20, "name": "w"}),  # CHANGE v w with the same definition: a rename
    (ENUM, {**ENUM, "nullable": False} | {"nullable": True}),
    ({**DT6, "nullable": False}, DT6),  # NULL allowed now: no value changes
])
def test_the_same_definition_converts_nothing(before, after):
    assert not converts(before, after)

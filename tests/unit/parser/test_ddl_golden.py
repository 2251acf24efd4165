"""The parser's DDL descriptions against golden files: `tests/golden/ddl/<case>.sql` is the statement
as the binlog carries it, `<case>.json` the `alter` structure its DDL envelope must carry.

A new case is two files. `BINLAKE_GOLDEN_UPDATE=1 pytest tests/unit/parser/test_ddl_golden.py`
writes the .json of every case from what the parser says now (review the diff before committing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from services.parser.alter import describe

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "ddl"
CASES = sorted(GOLDEN.glob("*.sql"))


def render(case: dict[str, Any]) -> str:
    """A case as JSON, one op or column per line (diffs show what changed)."""
    d = json.dumps
    alter = case["alter"]
    parts = []
    for key, value in alter.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = ",\n".join(f"    {d(x, ensure_ascii=False)}" for x in value)
            parts.append(f'  {d(key)}: [\n{items}]')
        else:
            parts.append(f"  {d(key)}: {d(value, ensure_ascii=False)}")
    head = ", ".join(f"{d(k)}: {d(v)}" for k, v in case.items() if k != "alter")
    return "{" + head + ', "alter": {\n' + ",\n".join(parts) + "}}\n"


def test_there_are_cases():
    assert len(CASES) >= 60


@pytest.mark.parametrize("sql_file", CASES, ids=[c.stem for c in CASES])
def test_ddl_description_equals_the_golden_file(sql_file: Path) -> None:
    expected_file = sql_file.with_suffix(".json")
    case = json.loads(expected_file.read_text()) if expected_file.exists() else {"schema": "s", "flavour": "mariadb"}
    sql = sql_file.read_text()
    got = describe(sql, case["schema"], mariadb=case["flavour"] == "mariadb")
    if os.environ.get("BINLAKE_GOLDEN_UPDATE"):
        expected_file.write_text(render({**case, "alter": got}))
        return
    assert expected_file.exists(), f"{expected_file.name} is missing: run with BINLAKE_GOLDEN_UPDATE=1 and review it"
    assert got == case["alter"], f"{sql_file.name}: {sql!r}"

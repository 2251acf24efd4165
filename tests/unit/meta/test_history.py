"""services.meta.history.schema_at: the schema of a table at a position, from DDL and rows records (pure)."""

from __future__ import annotations

import random

import pytest

from services.meta.backend import SchemaRecord
from services.meta.history import schema_at


def cols(*names: str) -> dict[str, object]:
    return {"id": "-".join(names), "columns": [{"name": n, "type": "int"} for n in names]}


def ddl(scn: int, text: str) -> SchemaRecord:
    return SchemaRecord("main", "s", "t", scn, ddl=text)


def rows(scn: int, schema: dict[str, object]) -> SchemaRecord:
    return SchemaRecord("main", "s", "t", scn, schema=schema)


CREATE = "CREATE TABLE t (id INT PRIMARY KEY, a INT, b INT)"
ADD = "ALTER TABLE t ADD COLUMN c INT"
DROP = "ALTER TABLE t DROP COLUMN a"
RENAME = "ALTER TABLE t RENAME COLUMN b TO name"

S1 = cols("id", "a", "b")
S2 = cols("id", "a", "b", "c")
S3 = cols("id", "b", "c")
S4 = cols("id", "name", "c")

# CREATE@100, rows@200, ADD@300, rows@400, DROP@500, rows@600, RENAME@700, rows@800
HISTORY = [ddl(100, CREATE), rows(200, S1), ddl(300, ADD), rows(400, S2), ddl(500, DROP), rows(600, S3),
           ddl(700, RENAME), rows(800, S4)]


def answer(schema: dict[str, object] | None, scn: int | None, ddl_text: str | None,
           ddl_scn: int | None) -> dict[str, object]:
    return {"schema": schema, "scn": scn, "ddl": ddl_text, "ddl_scn": ddl_scn}


@pytest.mark.parametrize(("scn", "expected"), [
    (0, answer(None, None, None, None)),
    (99, answer(None, None, None, None)),
    # at or after a DDL and before the first rows after it: the schema those rows have
    (100, answer(S1, 200, CREATE, 100)),
    (150, answer(S1, 200, CREATE, 100)),
    (199, answer(S1, 200, CREATE, 100)),
    (200, answer(S1, 200, CREATE, 100)),
    (299, answer(S1, 200, CREATE, 100)),
    (300, answer(S2, 400, ADD, 300)),
    (399, answer(S2, 400, ADD, 300)),
    (400, answer(S2, 400, ADD, 300)),
    (499, answer(S2, 400, ADD, 300)),
    (500, answer(S3, 600, DROP, 500)),
    (501, answer(S3, 600, DROP, 500)),
    (600, answer(S3, 600, DROP, 500)),
    (699, answer(S3, 600, DROP, 500)),
    (700, answer(S4, 800, RENAME, 700)),
    (800, answer(S4, 800, RENAME, 700)),
    (10**12, answer(S4, 800, RENAME, 700)),
])
def test_schema_at_before_at_and_after_each_ddl(scn, expected):
    assert schema_at(HISTORY, scn) == expected


def test_the_order_of_the_records_does_not_matter():
    shuffled = list(HISTORY)
    random.Random(7).shuffle(shuffled)
    for scn in (0, 100, 250, 300, 450, 500, 650, 700, 900):
        assert schema_at(shuffled, scn) == schema_at(HISTORY, scn)


def test_no_records_at_all():
    assert schema_at([], 123) == answer(None, None, None, None)


def test_a_ddl_with_no_rows_after_it_yet_is_pending():
    history = HISTORY[:7]  # ... rows@600, RENAME@700, nothing after
    assert schema_at(history, 650) == answer(S3, 600, DROP, 500)
    for scn in (700, 701, 10**9):
        assert schema_at(history, scn) == answer(None, None, RENAME, 700)


def test_only_a_create_so_far_is_pending():
    assert schema_at([ddl(100, CREATE)], 100) == answer(None, None, CREATE, 100)
    assert schema_at([ddl(100, CREATE)], 99) == answer(None, None, None, None)


def test_two_ddls_in_a_row_the_first_is_pending_until_the_second():
    history = [ddl(100, CREATE), rows(200, S1), ddl(300, ADD), ddl(350, DROP), rows(400, S3)]
    # between the two DDLs the columns are unknown (no rows were written with them)
    assert schema_at(history, 300) == answer(None, None, ADD, 300)
    assert schema_at(history, 349) == answer(None, None, ADD, 300)
    assert schema_at(history, 350) == answer(S3, 400, DROP, 350)
    assert schema_at(history, 500) == answer(S3, 400, DROP, 350)
    assert schema_at(history, 299) == answer(S1, 200, CREATE, 100)


def test_rows_without_any_recorded_ddl():
    """A table captured after its CREATE: only rows schemas are known."""
    history = [rows(200, S1), rows(400, S2)]
    assert schema_at(history, 100) == answer(None, None, None, None)
    assert schema_at(history, 200) == answer(S1, 200, None, None)
    assert schema_at(history, 399) == answer(S1, 200, None, None)
    assert schema_at(history, 400) == answer(S2, 400, None, None)


def test_a_new_schema_without_a_ddl_replaces_the_old_one():
    history = [ddl(100, CREATE), rows(200, S1), rows(300, S2)]
    assert schema_at(history, 250) == answer(S1, 200, CREATE, 100)
    assert schema_at(history, 300) == answer(S2, 300, CREATE, 100)


def test_ddl_after_a_ddl_only_history():
    history = [ddl(100, CREATE), ddl(300, ADD)]
    assert schema_at(history, 200) == answer(None, None, CREATE, 100)
    assert schema_at(history, 300) == answer(None, None, ADD, 300)


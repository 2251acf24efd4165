"""Pure: the schema of a table at a binlog position, from its recorded history.

Rows carry the schema they were written with, DDL carries only its statement. After an
ALTER at position d, the table's columns are those of the first rows event after d (until
then they are unknown: the answer says which DDL is pending).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.meta.backend import SchemaRecord


def schema_at(records: Sequence[SchemaRecord], scn: int) -> dict[str, Any]:
    """`{"schema": ..., "scn": <position of that schema>, "ddl": <last DDL at or before scn>}`."""
    ordered = sorted(records, key=lambda r: r.scn)
    last_ddl = next((r for r in reversed(ordered) if r.ddl is not None and r.scn <= scn), None)
    last_schema = next((r for r in reversed(ordered) if r.schema is not None and r.scn <= scn), None)
    answer: dict[str, Any] = {"schema": None, "scn": None, "ddl": last_ddl.ddl if last_ddl else None,
                              "ddl_scn": last_ddl.scn if last_ddl else None}
    if last_schema is not None and (last_ddl is None or last_schema.scn > last_ddl.scn):
        answer.update(schema=last_schema.schema, scn=last_schema.scn)
        return answer
    if last_ddl is not None:
        # The DDL changed the table after the last schema we saw before it: its result is the
        # schema of the next rows event, unless another DDL comes first.
        for r in ordered:
            if r.scn <= last_ddl.scn:
                continue
            if r.ddl is not None:
                break
            if r.schema is not None:
                answer.update(schema=r.schema, scn=r.scn)
                break
    return answer

"""Pure: the body of a rows event -> the envelope's `rows` list.

The body is what follows the rows-event header: the columns-present bitmap(s) were already
read by mysql-replication, the rest is a sequence of row images, each a NULL bitmap followed
by the packed values of the non-NULL columns.
"""

from __future__ import annotations

import struct
from typing import Any

from services.parser.columns import TableSchema
from shared.errors import DecodeError, SourceMisconfigured


def check_full_image(table: TableSchema, *bitmaps: bytes) -> None:
    """Refuse partial row images: binlake needs every column of every row (binlog_row_image=FULL)."""
    n = len(table.columns)
    full = (1 << n) - 1
    for bm in bitmaps:
        if int.from_bytes(bm, "little") & full != full:
            raise SourceMisconfigured(
                f"rows of {table.db}.{table.table} are logged without all columns; "
                "set binlog_row_image=FULL on the source"
            )


def _image(table: TableSchema, buf: bytes, pos: int) -> tuple[dict[str, Any], int]:
    names, decoders = table.names, table.decoders
    nbytes = (len(names) + 7) >> 3
    nulls = int.from_bytes(buf[pos : pos + nbytes], "little")
    pos += nbytes
    row: dict[str, Any] = {}
    for i, name in enumerate(names):
        if nulls >> i & 1:
            row[name] = None
        else:
            row[name], pos = decoders[i](buf, pos)
    return row, pos


def decode_rows(table: TableSchema, op: str, body: bytes) -> list[dict[str, Any]]:
    """Decode every row image of one rows event. `op` is `i`, `u` or `d`."""
    rows: list[dict[str, Any]] = []
    pos, end = 0, len(body)
    try:
        if op == "u":
            while pos < end:
                before, pos = _image(table, body, pos)
                after, pos = _image(table, body, pos)
                rows.append({"before": before, "after": after})
        else:
            key = "after" if op == "i" else "before"
            while pos < end:
                image, pos = _image(table, body, pos)
                rows.append({key: image})
    except DecodeError as exc:
        raise DecodeError(f"{table.db}.{table.table}: {exc}") from None
    except (IndexError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise DecodeError(
            f"cannot decode a row of {table.db}.{table.table} with its TableMap schema: {exc}"
        ) from exc
    if pos != end:
        raise DecodeError(f"rows event of {table.db}.{table.table} has {pos - end} bytes beyond its end")
    return rows

"""Pure: the body of a rows event -> the envelope's `rows` list.

The body is what follows the rows-event header: the columns-present bitmap(s) were already
read by mysql-replication, the rest is a sequence of row images, each a NULL bitmap followed
by the packed values of the non-NULL columns.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from services.parser.values import Decoder
from shared.errors import DecodeError, SourceMisconfigured

if TYPE_CHECKING:
    from services.parser.columns import TableSchema


def check_full_image(table: TableSchema, where: str, *bitmaps: bytes) -> None:
    """Refuse partial row images: binlake needs every column of every row (binlog_row_image=FULL)."""
    n = len(table.columns)
    full = (1 << n) - 1
    for bm in bitmaps:
        if int.from_bytes(bm, "little") & full != full:
            raise SourceMisconfigured(
                f"rows of {table.db}.{table.table} at {where} are logged without all columns (a session with "
                "binlog_row_image=MINIMAL or NOBLOB wrote them); set binlog_row_image=FULL on the source (globally, "
                "and in sessions that override it); binlake cannot carry that transaction exactly: to go on past it, "
                "reset the parser to the current position and take a new snapshot of the tables"
            )


Image = Callable[[bytes, int], tuple[dict[str, Any], int]]


def image_decoder(names: Sequence[str], decoders: Sequence[Decoder]) -> Image:
    """The decoder of one row image of a table: its NULL bitmap, then each non-NULL value.

    Generated for the column list, one statement per column (like the snapshot's
    `row_decoder`): the per-row loop is the binlog path's hot spot.
    """
    scope: dict[str, Any] = {}
    nbytes = (len(names) + 7) >> 3
    lines = ["def image(buf, pos):", f"    nulls = int.from_bytes(buf[pos : pos + {nbytes}], 'little')",
             f"    pos += {nbytes}"]
    for i, (name, decoder) in enumerate(zip(names, decoders, strict=True)):
        scope[f"d{i}"], scope[f"k{i}"] = decoder, name
        lines += [f"    if nulls & {1 << i}:", f"        v{i} = None", "    else:",
                  f"        v{i}, pos = d{i}(buf, pos)"]
    lines.append(f"    return {{{', '.join(f'k{i}: v{i}' for i in range(len(names)))}}}, pos")
    exec("\n".join(lines), scope)
    image: Image = scope["image"]
    return image


def decode_rows(table: TableSchema, op: str, body: bytes) -> list[dict[str, Any]]:
    """Decode every row image of one rows event. `op` is `i`, `u` or `d`."""
    rows: list[dict[str, Any]] = []
    pos, end, image = 0, len(body), table.image
    try:
        if op == "u":
            while pos < end:
                before, pos = image(body, pos)
                after, pos = image(body, pos)
                rows.append({"before": before, "after": after})
        else:
            key = "after" if op == "i" else "before"
            while pos < end:
                values, pos = image(body, pos)
                rows.append({key: values})
    except DecodeError as exc:
        raise DecodeError(f"{table.db}.{table.table}: {exc}") from None
    except (IndexError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise DecodeError(
            f"cannot decode a row of {table.db}.{table.table} with its TableMap schema: {exc}"
        ) from exc
    if pos != end:
        raise DecodeError(f"rows event of {table.db}.{table.table} has {pos - end} bytes beyond its end")
    return rows

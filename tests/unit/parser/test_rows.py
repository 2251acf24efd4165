"""Row images of rows-event bodies -> the envelope's `rows` list."""

from __future__ import annotations

import struct

import pytest

from services.parser import values as v
from services.parser.columns import Column, TableSchema
from services.parser.rows import check_full_image, decode_rows
from services.parser.values import ColumnType
from shared.errors import DecodeError, SourceMisconfigured


def table(*columns: tuple[str, ColumnType], pk: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(
        db="shop", table="orders", columns=tuple(Column(n, "t", True, ct) for n, ct in columns), pk=pk
    )


INT = ColumnType(v.LONG)
TEXT = ColumnType(v.VARCHAR, length=80, encoding="utf-8")
DEC = ColumnType(v.NEWDECIMAL, precision=10, scale=2)
T = table(("id", INT), ("name", TEXT), ("amount", ColumnType(v.TINY)))


def image(nulls: int, *values: bytes, nbytes: int = 1) -> bytes:
    return nulls.to_bytes(nbytes, "little") + b"".join(values)


def i32(x: int) -> bytes:
    return struct.pack("<i", x)


def s(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw)]) + raw


def test_insert_rows_with_nulls():
    body = image(0, i32(1), s("a\u00e9"), b"\x07") + image(0b110, i32(2)) + image(0b010, i32(-3), b"\xff")
    assert decode_rows(T, "i", body) == [
        {"after": {"id": 1, "name": "a\u00e9", "amount": 7}},
        {"after": {"id": 2, "name": None, "amount": None}},
        {"after": {"id": -3, "name": None, "amount": -1}},
    ]


def test_update_rows_pair_before_and_after():
    body = image(0, i32(1), s("old"), b"\x01") + image(0b100, i32(1), s("new"))
    body += image(0b010, i32(2), b"\x02") + image(0, i32(2), s(""), b"\x03")
    assert decode_rows(T, "u", body) == [
        {"before": {"id": 1, "name": "old", "amount": 1}, "after": {"id": 1, "name": "new", "amount": None}},
        {"before": {"id": 2, "name": None, "amount": 2}, "after": {"id": 2, "name": "", "amount": 3}},
    ]


def test_delete_rows():
    body = image(0b110, i32(9)) + image(0, i32(10), s("x"), b"\x00")
    assert decode_rows(T, "d", body) == [
        {"before": {"id": 9, "name": None, "amount": None}},
        {"before": {"id": 10, "name": "x", "amount": 0}},
    ]


def test_empty_body_is_no_rows():
    assert decode_rows(T, "i", b"") == []


def test_null_bitmap_spans_two_bytes():
    wide = table(*((f"c{i}", ColumnType(v.TINY)) for i in range(9)), pk=("c0",))
    row = image(0b1_0000_0001, *(bytes([i]) for i in range(1, 8)), nbytes=2)
    expected = {f"c{i}": i for i in range(1, 8)} | {"c0": None, "c8": None}
    assert decode_rows(wide, "i", row) == [{"after": expected}]


@pytest.mark.parametrize(
    "bitmaps",
    [(b"\x07",), (b"\xff",), (b"\x07", b"\x07"), (b"\xff\xff",)],
)
def test_full_image_accepted(bitmaps):
    check_full_image(T, "f:1", *bitmaps)


@pytest.mark.parametrize("bitmaps", [(b"\x03",), (b"\x05",), (b"\x07", b"\x06"), (b"\x01", b"\x07"), (b"",)])
def test_partial_image_is_refused(bitmaps):
    with pytest.raises(SourceMisconfigured, match=r"shop\.orders.*binlog_row_image=FULL"):
        check_full_image(T, "f:1", *bitmaps)


def test_full_image_with_more_than_eight_columns():
    wide = table(*((f"c{i}", ColumnType(v.TINY)) for i in range(10)), pk=())
    check_full_image(wide, "f:1", b"\xff\x03")
    with pytest.raises(SourceMisconfigured):
        check_full_image(wide, "f:1", b"\xff\x01")


@pytest.mark.parametrize(
    ("schema", "body"),
    [
        # A VARCHAR whose length prefix runs past the end of the body.
        (table(("id", INT), ("name", TEXT)), image(0, i32(1), bytes([10]) + b"abc")),
        # A trailing NULL bitmap byte followed by nothing, for a VARCHAR.
        (table(("name", TEXT), pk=()), image(0, s("ok")) + b"\x00"),
        # A DECIMAL cut short.
        (table(("amount", DEC), pk=()), image(0, b"\x80\x00")),
    ],
)
def test_truncated_or_trailing_bytes_are_decode_errors(schema, body):
    with pytest.raises(DecodeError, match=r"shop\.orders"):
        decode_rows(schema, "i", body)


@pytest.mark.parametrize(
    "body",
    [
        image(0, i32(1), s("x"), b"\x01") + b"\x00",  # trailing garbage: a bitmap saying `id` is not NULL
        image(0, b"\x01\x00"),  # INT cut short
    ],
)
def test_truncated_fixed_size_value_is_decode_error(body):
    with pytest.raises(DecodeError, match=r"shop\.orders"):
        decode_rows(T, "i", body)


def test_update_with_missing_after_image_is_decode_error():
    with pytest.raises(DecodeError):
        decode_rows(table(("name", TEXT), pk=()), "u", image(0, s("before only")))


def test_value_error_names_the_table():
    enum = table(("e", ColumnType(v.ENUM, length=1, values=("a",))), pk=())
    with pytest.raises(DecodeError, match=r"^shop\.orders: ENUM index 2"):
        decode_rows(enum, "i", image(0, b"\x02"))

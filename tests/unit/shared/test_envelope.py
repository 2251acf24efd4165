"""The msgpack change envelope: schema splice, validation errors, order keys, ids and headers."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from shared import envelope
from shared.envelope import EnvelopeError

SCHEMA = {"id": "abc123", "columns": [{"name": "id", "type": "int", "nullable": False}]}


def fields(**extra: Any) -> dict[str, Any]:
    base = {
        "v": envelope.VERSION, "source": "src", "db": "shop", "table": "orders", "op": "i", "ts": 1700000000000,
        "pos": {"file": "mysql-bin.000002", "offset": 120, "gtid": "0-1-5"}, "scn": (2 << 32) | 120,
        "chunk": 0, "txn": {"id": "0-1-5", "i": 0, "last": True}, "pk": ["id"],
        "rows": [{"after": {"id": 1, "b": b"\x00\x01", "big": 2**64 - 1, "f": 1.5, "n": None}}],
    }
    return base | extra


def packb(obj: Any) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


@pytest.mark.parametrize("n_extra", [0, 1, 2, 3, 4, 20])  # 12..16 keys: fixmap splice and its limit
def test_encode_with_packed_schema_equals_packing_the_merged_dict(n_extra):
    f = fields(**{f"x{k}": k for k in range(n_extra)})
    data = envelope.encode(f, envelope.pack_schema(SCHEMA))
    assert data == packb({**f, "schema": SCHEMA})
    assert envelope.decode(data) == {**f, "schema": SCHEMA}


def test_encode_without_schema():
    f = fields()
    assert envelope.encode(f) == packb(f)
    assert envelope.decode(envelope.encode(f)) == f


def test_decode_keeps_bytes_and_uint64():
    row = envelope.decode(envelope.encode(fields()))["rows"][0]["after"]
    assert row == {"id": 1, "b": b"\x00\x01", "big": 2**64 - 1, "f": 1.5, "n": None}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xc1", "not msgpack"),
        (b"\x92\x01", "not msgpack"),  # truncated array
        (packb(fields()) + b"\x00", "not msgpack"),  # trailing bytes
        (packb([1, 2]), "envelope is a list, expected a map"),
        (packb("text"), "envelope is a str, expected a map"),
        (packb({"v": 1}), "envelope lacks source, op, ts, pos, scn, txn"),
        (packb({k: x for k, x in fields().items() if k != "scn"}), "envelope lacks scn"),
        (packb(fields(v=2)), "envelope version 2 is not supported"),
        (packb(fields(v="1")), "envelope version '1' is not supported"),
        (packb(fields(op="x")), "unknown op 'x'"),
        (packb(fields(op=None)), "unknown op None"),
    ],
)
def test_decode_errors(data, message):
    with pytest.raises(EnvelopeError) as info:
        envelope.decode(data)
    assert message in str(info.value)


def test_envelope_error_is_a_value_error():
    assert issubclass(EnvelopeError, ValueError)


@pytest.mark.parametrize("op", sorted(envelope.OPS))
def test_every_op_decodes(op):
    assert envelope.decode(packb(fields(op=op)))["op"] == op


@pytest.mark.parametrize(
    ("file", "offset", "expected"),
    [("mysql-bin.000001", 4, (1 << 32) | 4), ("binlog.000042", 0xFFFFFFFF, (42 << 32) | 0xFFFFFFFF),
     ("a.b.c.999999", 1, (999999 << 32) | 1)],
)
def test_scn(file, offset, expected):
    assert envelope.scn(file, offset) == expected
    assert envelope.binlog_number(file) == expected >> 32


def test_scn_orders_files_before_offsets():
    assert envelope.scn("mysql-bin.000001", 10**9) < envelope.scn("mysql-bin.000002", 4)


@pytest.mark.parametrize("file", ["mysql-bin", "mysql-bin.", "mysql-bin.00x1"])
def test_scn_needs_a_numbered_file(file):
    with pytest.raises(EnvelopeError, match="binlog file name without a number"):
        envelope.scn(file, 4)


@pytest.mark.parametrize(("chunk", "expected"), [(0, "src:77"), (1, "src:77:1"), (12, "src:77:12")])
def test_msg_id(chunk, expected):
    assert envelope.msg_id("src", 77, chunk) == expected


def test_msg_id_default_chunk():
    assert envelope.msg_id("src", 77) == "src:77"


def test_headers():
    assert envelope.headers(fields(), "src:1") == {
        "Nats-Msg-Id": "src:1",
        "Binlake-Op": "i",
        "Binlake-Table": "shop.orders",
        "Binlake-Pos": "mysql-bin.000002:120 0-1-5",
        "Binlake-Rows": "1",
        "Binlake-Scn": str(fields()["scn"]),
        "Binlake-Ts": str(fields()["ts"]),
        "Binlake-Txn": "0 1 0-1-5",
    }
    assert envelope.txn_tag(envelope.headers(fields(), "src:1")) == ("0-1-5", 0, True)
    assert envelope.txn_tag({}) is None and envelope.txn_tag({"Binlake-Txn": "junk"}) is None


def test_headers_without_table_gtid_or_rows():
    f = fields(op="hb", db=None, table=None, pos={"file": "f.000001", "offset": 4, "gtid": None})
    del f["rows"]
    h = envelope.headers(f, "src:9:hb1")
    assert (h["Binlake-Table"], h["Binlake-Pos"], h["Binlake-Rows"], h["Binlake-Op"]) == ("", "f.000001:4", "0", "hb")


# -- Decoder: a schema decoded before is not decoded again ---------------------------------------------


def _decoded_alike(decoder: envelope.Decoder, data: bytes, key: str = "k") -> Any:
    """What the decoder gives, checked against a whole decode (or the same error)."""
    try:
        want: Any = envelope.decode(data)
    except EnvelopeError as exc:
        with pytest.raises(EnvelopeError) as got:
            decoder.decode(data, key)
        assert str(got.value) == str(exc)
        return None
    got_env = decoder.decode(data, key)
    assert got_env == want
    return got_env


def test_decoder_reuses_the_schema_of_the_last_message_under_the_same_key() -> None:
    d = envelope.Decoder()
    packed = envelope.pack_schema(SCHEMA)
    first = _decoded_alike(d, envelope.encode(fields(), packed))
    second = _decoded_alike(d, envelope.encode(fields(rows=[{"after": {"id": 2}}]), packed))
    assert second["schema"] is first["schema"]  # decoded once
    other = _decoded_alike(d, envelope.encode(fields(), envelope.pack_schema({**SCHEMA, "id": "x"})))
    assert other["schema"]["id"] == "x"  # another schema under the key: decoded whole, remembered
    assert _decoded_alike(d, envelope.encode(fields(), packed), key="other")["schema"] == SCHEMA


@pytest.mark.parametrize("case", ["schema-first", "no-schema", "schema-in-a-row", "two-schemas", "truncated",
                                  "trailing", "map16", "not-a-map", "schema-only", "row-ends-like-schema"])
def test_decoder_equals_a_whole_decode_on_odd_and_hostile_messages(case: str) -> None:
    d = envelope.Decoder()
    packed = envelope.pack_schema(SCHEMA)
    entry = msgpack.packb("schema") + packed
    _decoded_alike(d, envelope.encode(fields(), packed))  # remembered: the next ones end like it, or nearly
    data = {
        "schema-first": packb({"schema": SCHEMA, **fields()}),
        "no-schema": envelope.encode(fields()),
        "schema-in-a-row": envelope.encode(fields(rows=[{"after": {"schema": SCHEMA}}])),
        "two-schemas": envelope.encode({"schema": {"id": "first"}, **fields()}, packed),
        "truncated": envelope.encode(fields(), packed)[:-1],
        "trailing": envelope.encode(fields(), packed) + b"\x00",
        "map16": packb({**fields(), **{f"x{i}": i for i in range(8)}, "schema": SCHEMA}),
        "not-a-map": packb([1, 2]) + entry,
        "schema-only": bytes((0x81,)) + entry,
        # A row value whose bytes end like the schema entry: the rest does not decode as a map
        # of one entry less, so the message is decoded whole.
        "row-ends-like-schema": packb({**fields(rows=[{"after": {"blob": b"x" * 3 + entry}}])}),
    }[case]
    _decoded_alike(d, data)
    _decoded_alike(d, envelope.encode(fields(), packed))


def test_decoder_forgets_keys_past_its_limit() -> None:
    d = envelope.Decoder(keys=2)
    packed = envelope.pack_schema(SCHEMA)
    for key in ("a", "b", "c", "a"):
        assert d.decode(envelope.encode(fields(), packed), key)["schema"] == SCHEMA

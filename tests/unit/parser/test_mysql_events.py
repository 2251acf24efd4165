"""services.parser.mysql_events: compressed transactions and events, tagged GTID events, from their bytes."""

from __future__ import annotations

import struct
import zlib

import pytest
import zstandard

from services.parser.mysql_events import (
    NONE,
    Payload,
    inner_events,
    mariadb_uncompressed,
    parse_payload,
    parse_tagged_gtid,
)
from shared.errors import DecodeError

# The body of a real MySQL 9.7 GTID_TAGGED_LOG event (`SET gtid_next='AUTOMATIC:tag1'`).
TAGGED = bytes.fromhex("02740000000291039d0338c102a903c822c503d502550204f10300000002040406087461673108080a140c7fc9"
                       "d16ae441610610a1041283120b")


def event(kind: int, body: bytes) -> bytes:
    return struct.pack("<IBIIIH", 1700000000, kind, 1, 19 + len(body), 0, 0) + body


def payload_body(events: list[bytes], compress: bool = True, size: int | None = None) -> bytes:
    raw = b"".join(events)
    data = zstandard.ZstdCompressor().compress(raw) if compress else raw
    def field(kind: int, value: int) -> bytes:
        enc = bytes([value]) if value < 251 else b"\xfc" + value.to_bytes(2, "little") if value < 65536 \
            else b"\xfd" + value.to_bytes(3, "little")
        return bytes([kind, len(enc)]) + enc
    header = field(2, 0 if compress else NONE) + field(3, len(raw) if size is None else size) + field(1, len(data))
    return header + b"\x00" + data


def test_tagged_gtid_event():
    gtid = parse_tagged_gtid(TAGGED)
    assert str(gtid) == "e4e71cb0-ea64-11f1-b595-02fc00000001:tag1:1"


def test_truncated_tagged_gtid_is_a_decode_error():
    with pytest.raises(DecodeError):
        parse_tagged_gtid(TAGGED[:20])


@pytest.mark.parametrize("compress", [True, False])
def test_inner_events_come_out_in_order_and_whole(compress):
    events = [event(0x02, b"BEGIN" * 3), event(0x13, b"m" * 300), event(0x1E, b"r" * 70_000), event(0x10, b"x" * 8)]
    got = list(inner_events(parse_payload(payload_body(events, compress))))
    assert got == events


def test_a_payload_whose_events_do_not_add_up_is_a_decode_error():
    events = [event(0x02, b"BEGIN"), event(0x10, b"x" * 8)]
    with pytest.raises(DecodeError, match="says"):
        list(inner_events(parse_payload(payload_body(events, size=999))))
    with pytest.raises(DecodeError, match="ends inside"):
        list(inner_events(Payload(NONE, -1, events[0] + events[1][:-2])))
    with pytest.raises(DecodeError):
        list(inner_events(Payload(0, -1, b"not zstd at all")))


def test_unknown_compression_is_refused():
    body = payload_body([event(0x10, b"x")])
    with pytest.raises(DecodeError, match="algorithm 7"):
        parse_payload(bytes([2, 1, 7]) + body[3:])


def mariadb_compressed(data: bytes) -> bytes:
    width = 1 if len(data) < 256 else 2
    return bytes([0x80 | width]) + len(data).to_bytes(width, "big") + zlib.compress(data)


def test_mariadb_compressed_query_becomes_the_plain_query():
    status, db, sql = b"\x00\x01\x02", b"shop", b"ALTER TABLE t ADD COLUMN c INT" * 20
    post = struct.pack("<IIBHH", 7, 0, len(db), 0, len(status))
    plain = mariadb_uncompressed(event(0xA5, post + status + db + b"\x00" + mariadb_compressed(sql)))
    assert plain == event(0x02, post + status + db + b"\x00" + sql)


@pytest.mark.parametrize(("kind", "plain_kind", "extra"), [(0xA6, 0x17, b""), (0xA7, 0x18, b""),
                                                           (0xA9, 0x1E, b"\x04\x00ab"), (0xAA, 0x1F, b"\x02\x00")])
def test_mariadb_compressed_rows_become_the_plain_rows_event(kind, plain_kind, extra):
    head = b"\x2a\x00\x00\x00\x00\x00" + b"\x01\x00" + extra  # table id, flags, (V2) extra data
    bitmaps = b"\x03" + b"\xff" * (2 if plain_kind in (0x18, 0x1F) else 1)  # 3 columns
    rows = b"row images " * 40
    plain = mariadb_uncompressed(event(kind, head + bitmaps + mariadb_compressed(rows)))
    assert plain == event(plain_kind, head + bitmaps + rows)


def test_a_mariadb_compressed_event_that_lies_is_a_decode_error():
    head = b"\x2a\x00\x00\x00\x00\x00\x01\x00\x03\xff"
    with pytest.raises(DecodeError, match="header says"):
        mariadb_uncompressed(event(0xA6, head + b"\x81\x10" + zlib.compress(b"short")))
    with pytest.raises(DecodeError, match="compression header"):
        mariadb_uncompressed(event(0xA6, head + b"\x00plain"))

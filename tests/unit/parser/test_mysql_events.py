"""services.parser.mysql_events: compressed transactions and tagged GTID events, from their bytes."""

from __future__ import annotations

import struct

import pytest
import zstandard

from services.parser.mysql_events import NONE, Payload, inner_events, parse_payload, parse_tagged_gtid
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

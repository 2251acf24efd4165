"""Pure: the MySQL binlog events mysql-replication cannot read, decoded from their bytes.

- TRANSACTION_PAYLOAD (0x28): a whole transaction compressed with zstd
  (`binlog_transaction_compression`, global or per session). `inner_events` yields the events
  inside one at a time (each a 19-byte header and its body, no checksum), so a large
  transaction never sits decompressed in memory.
- GTID_TAGGED_LOG (0x2a): the GTID event of MySQL 8.3+ in its `mysql::serialization` form,
  written for tagged GTIDs (`uuid:tag:n`).
- PREVIOUS_GTIDS (0x23): the library cannot read the tagged form; `shared.gtid` can.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import zstandard

from shared.errors import DecodeError

TRANSACTION_PAYLOAD: Final = 0x28
GTID_TAGGED: Final = 0x2A
PREVIOUS_GTIDS: Final = 0x23
HEADER: Final = 19  # common header of a binlog event

_END, _SIZE, _COMPRESSION, _UNCOMPRESSED = 0, 1, 2, 3  # payload header field types
ZSTD: Final = 0
NONE: Final = 255


@dataclass(frozen=True)
class Payload:
    compression: int
    uncompressed_size: int
    data: bytes  # the compressed events


def net_length(buf: bytes, pos: int) -> tuple[int, int]:
    """MySQL's length-encoded integer at `pos` -> (value, next position)."""
    first = buf[pos]
    if first < 251:
        return first, pos + 1
    width = {252: 2, 253: 3, 254: 8}.get(first)
    if width is None:
        raise DecodeError(f"bad length-encoded integer prefix {first:#x}")
    return int.from_bytes(buf[pos + 1:pos + 1 + width], "little"), pos + 1 + width


def parse_payload(body: bytes) -> Payload:
    """The body of a TRANSACTION_PAYLOAD event (after the common header, without checksum)."""
    fields: dict[int, int] = {}
    pos = 0
    try:
        while True:
            kind, pos = net_length(body, pos)
            if kind == _END:
                break
            length, pos = net_length(body, pos)
            if kind in (_SIZE, _COMPRESSION, _UNCOMPRESSED):
                fields[kind], end = net_length(body, pos)
                if end - pos != length:
                    raise DecodeError(f"payload header field {kind} is {end - pos} bytes, says {length}")
            pos += length  # fields this version does not know are skipped by their length
    except IndexError:
        raise DecodeError("transaction payload header ends early") from None
    data = body[pos:]
    if _SIZE in fields and fields[_SIZE] != len(data):
        raise DecodeError(f"transaction payload holds {len(data)} bytes, its header says {fields[_SIZE]}")
    compression = fields.get(_COMPRESSION, ZSTD)
    if compression not in (ZSTD, NONE):
        raise DecodeError(f"transaction payload compressed with algorithm {compression}; binlake reads zstd only")
    return Payload(compression, fields.get(_UNCOMPRESSED, -1), data)


def _read_exactly(reader: zstandard.ZstdDecompressionReader, size: int) -> bytes:
    parts, left = [], size
    while left:
        chunk = reader.read(left)
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def inner_events(payload: Payload) -> Iterator[bytes]:
    """Each event of the transaction in order: its 19-byte header and body (inner events carry no checksum)."""
    if payload.compression == NONE:
        source: zstandard.ZstdDecompressionReader | None = None
        plain = memoryview(payload.data)
    else:
        source = zstandard.ZstdDecompressor().stream_reader(payload.data, read_across_frames=True)
    seen, pos = 0, 0
    try:
        while True:
            header = bytes(plain[pos:pos + HEADER]) if source is None else _read_exactly(source, HEADER)
            if not header:
                break
            if len(header) < HEADER:
                raise DecodeError("compressed transaction ends inside an event header")
            size = struct.unpack_from("<I", header, 9)[0]
            if size < HEADER:
                raise DecodeError(f"event of {size} bytes inside a compressed transaction")
            if source is None:
                body = bytes(plain[pos + HEADER:pos + size])
                pos += size
            else:
                body = _read_exactly(source, size - HEADER)
            if len(body) != size - HEADER:
                raise DecodeError("compressed transaction ends inside an event")
            seen += size
            yield header + body
    except zstandard.ZstdError as exc:
        raise DecodeError(f"cannot decompress a transaction payload: {exc}") from None
    finally:
        if source is not None:
            source.close()  # type: ignore[no-untyped-call]
    if payload.uncompressed_size >= 0 and seen != payload.uncompressed_size:
        raise DecodeError(f"compressed transaction holds {seen} bytes of events, its header says "
                          f"{payload.uncompressed_size}")


# -- mysql::serialization (tagged GTID events) -------------------------------------------


def _varlen(buf: bytes, pos: int) -> tuple[int, int]:
    """An unsigned integer of `mysql::serialization`: 1 + (trailing one bits of the first byte) bytes."""
    first = buf[pos]
    width = 1
    while width < 9 and first & (1 << (width - 1)):
        width += 1
    if len(buf) < pos + width:
        raise IndexError("varlen integer ends early")
    if width == 9:
        return int.from_bytes(buf[pos + 1:pos + 9], "little"), pos + 9
    return int.from_bytes(buf[pos:pos + width], "little") >> width, pos + width


def _signed(value: int) -> int:
    return ~(value >> 1) if value & 1 else value >> 1


@dataclass(frozen=True)
class TaggedGtid:
    uuid: str
    tag: str
    gno: int

    def __str__(self) -> str:
        return f"{self.uuid}:{self.tag}:{self.gno}" if self.tag else f"{self.uuid}:{self.gno}"


def parse_tagged_gtid(body: bytes) -> TaggedGtid:
    """A GTID_TAGGED_LOG event's body: format version, size, last non-ignorable field, then fields
    by id (0 flags, 1 uuid as 16 integers, 2 gno, 3 tag, ...); only the GTID is needed here."""
    try:
        _, pos = _varlen(body, 0)  # format version
        size, pos = _varlen(body, pos)
        _, pos = _varlen(body, pos)  # last non-ignorable field id
        end = min(size, len(body))
        sid: bytes | None = None
        gno: int | None = None
        tag = ""
        while pos < end:
            field, pos = _varlen(body, pos)
            if field == 0:
                _, pos = _varlen(body, pos)
            elif field == 1:
                raw = bytearray()
                for _ in range(16):
                    byte, pos = _varlen(body, pos)
                    raw.append(byte)
                sid = bytes(raw)
            elif field == 2:
                value, pos = _varlen(body, pos)
                gno = _signed(value)
            elif field == 3:
                length, pos = _varlen(body, pos)
                tag = bytes(body[pos:pos + length]).decode()
                pos += length
                break  # the GTID is complete; commit timestamps and lengths follow
            else:
                break  # an untagged event of this form: no tag field
    except (IndexError, UnicodeDecodeError, ValueError) as exc:
        raise DecodeError(f"cannot decode a tagged GTID event ({exc}): {bytes(body[:64]).hex()}") from None
    if sid is None or gno is None or gno < 1:
        raise DecodeError(f"tagged GTID event without uuid or number: {bytes(body[:64]).hex()}")
    return TaggedGtid(str(uuid.UUID(bytes=sid)), tag, gno)

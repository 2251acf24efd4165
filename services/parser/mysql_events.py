"""Pure: the MySQL binlog events mysql-replication cannot read, decoded from their bytes.

- TRANSACTION_PAYLOAD (0x28): a whole transaction compressed with zstd
  (`binlog_transaction_compression`, global or per session). `inner_events` yields the events
  inside one at a time (each a 19-byte header and its body, no checksum), so a large
  transaction never sits decompressed in memory.
- GTID_TAGGED_LOG (0x2a): the GTID event of MySQL 8.3+ in its `mysql::serialization` form,
  written for tagged GTIDs (`uuid:tag:n`).
- PREVIOUS_GTIDS (0x23): the library cannot read the tagged form; `shared.gtid` can.
- MariaDB's compressed QUERY and rows events (`log_bin_compress`): `mariadb_uncompressed`
  turns one into the plain event it stands for (zlib).
"""

from __future__ import annotations

import struct
import uuid
import zlib
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
# What a transaction payload may hold: QUERY (BEGIN), TABLE_MAP, rows events (v1, v2, partial JSON),
# XID, ROWS_QUERY, INTVAR, RAND, USER_VAR. A GTID, rotate or Previous_gtids inside one is a lie.
INNER_EVENTS: Final = frozenset({0x02, 0x13, 0x17, 0x18, 0x19, 0x1E, 0x1F, 0x20, 0x27, 0x10, 0x1D, 0x05, 0x0D, 0x0E})
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
    # In pieces: a read allocates what it asks for, and a stated size may be a lie.
    parts, left = [], size
    while left:
        chunk = reader.read(min(left, 1 << 20))
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
            if size < HEADER or 0 <= payload.uncompressed_size < seen + size:
                raise DecodeError(f"event of {size} bytes at byte {seen} of a compressed transaction of "
                                  f"{payload.uncompressed_size} bytes")
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


# -- MariaDB's compressed events (log_bin_compress) ------------------------------------------

MARIADB_QUERY_COMPRESSED: Final = 0xA5
# compressed rows event type -> the rows event it stands for (V1: 0xA6-0xA8, V2: 0xA9-0xAB)
MARIADB_ROWS_COMPRESSED: Final = {0xA6: 0x17, 0xA7: 0x18, 0xA8: 0x19, 0xA9: 0x1E, 0xAA: 0x1F, 0xAB: 0x20}
_QUERY_POST_HEADER = 13  # thread id 4, exec time 4, db length 1, error code 2, status vars length 2


def _mariadb_uncompress(buf: bytes, what: str) -> bytes:
    """MariaDB's compressed form: a byte 0x80|n, the length in n big-endian bytes, then zlib."""
    if not buf or buf[0] & 0xE0 != 0x80 or not 1 <= buf[0] & 0x07 <= 4:
        raise DecodeError(f"compressed {what} without MariaDB's compression header")
    width = buf[0] & 0x07
    size = int.from_bytes(buf[1:1 + width], "big")
    try:
        # A bounded first buffer: the stated size may be a lie; a true one grows the buffer.
        data = zlib.decompress(buf[1 + width:], bufsize=min(max(size, 1), 1 << 24))
    except zlib.error as exc:
        raise DecodeError(f"cannot decompress a compressed {what}: {exc}") from None
    if len(data) != size:
        raise DecodeError(f"compressed {what} holds {len(data)} bytes, its header says {size}")
    return data


def mariadb_uncompressed(event: bytes) -> bytes:
    """A MariaDB compressed event (19-byte header and body, no checksum) as the plain event it stands
    for: QUERY with its statement, or a rows event with its row images, decompressed."""
    kind = event[4]
    body = event[HEADER:]
    if kind == MARIADB_QUERY_COMPRESSED:
        db_len, vars_len = body[8], int.from_bytes(body[11:13], "little")
        split = _QUERY_POST_HEADER + vars_len + db_len + 1  # the statement follows the db name and its NUL
        plain_kind, body = 0x02, body[:split] + _mariadb_uncompress(body[split:], "statement")
    elif kind in MARIADB_ROWS_COMPRESSED:
        plain_kind = MARIADB_ROWS_COMPRESSED[kind]
        pos = 8  # table id (6 bytes), flags
        if plain_kind >= 0x1E:  # V2: the extra data, its 2-byte length counting itself
            pos += int.from_bytes(body[8:10], "little")
        width, pos = net_length(body, pos)
        pos += ((width + 7) >> 3) * (2 if plain_kind in (0x18, 0x1F) else 1)  # one bitmap, two for updates
        body = body[:pos] + _mariadb_uncompress(body[pos:], "rows event")
    else:
        raise DecodeError(f"binlog event type {kind:#x} is no MariaDB compressed event")
    header = bytearray(event[:HEADER])
    header[4] = plain_kind
    header[9:13] = struct.pack("<I", HEADER + len(body))
    return bytes(header) + body

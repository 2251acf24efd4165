"""What binlake changes in mysql-replication 1.0.x, and why; imported by the binlog reader.

- Never let the library reconnect by itself: it would restart from its first position and replay
  forever (see PITFALLS).
- COM_BINLOG_DUMP_GTID carries binlake's own GTID set encoding (`shared.gtid`): the library's
  has no tagged GTIDs.
- Previous_gtids events reach the reader unparsed (the library misreads tagged sets).
- TableMap optional metadata it does not know is skipped by its length instead of failing the
  whole event; MySQL 9's VECTOR_DIMENSIONALITY is kept as `binlake_vector_dimensions` on the event.
- VECTOR columns (MySQL 9) read their length-prefix size from the TableMap, as BLOBs do.
"""

from __future__ import annotations

from typing import Any

import pymysqlreplication.binlogstream as binlogstream
from pymysqlreplication import column as lib_column
from pymysqlreplication import event as ev
from pymysqlreplication import row_event as rev
from pymysqlreplication.packet import BinLogPacketWrapper

from services.parser import mysql_events
from services.parser.values import VECTOR
from shared.gtid import GtidSet


class _DumpGtidSet:
    """What the library sends in COM_BINLOG_DUMP_GTID, tagged GTIDs included."""

    def __init__(self, text: str) -> None:
        self._data = GtidSet.parse(text).encode()

    @property
    def encoded_length(self) -> int:
        return len(self._data)

    def encoded(self) -> bytes:
        return self._data


VECTOR_DIMENSIONALITY = 13  # MySQL 9: one length-encoded integer per VECTOR column
_KNOWN_METADATA = frozenset(m.value for m in rev.MetadataFieldType
                            if m is not rev.MetadataFieldType.UNKNOWN_METADATA_FIELD_TYPE)
_optional_meta_data = rev.TableMapEvent._get_optional_meta_data


def _known_optional_meta_data(self: Any) -> Any:
    """Drop the TLV fields the library does not know from the packet, then let it read the rest."""
    packet = self.packet.packet  # pymysql's packet: its bytes and read position
    data, start = packet._data, packet._position
    end = len(data) - 4  # the checksum (inner events of a compressed transaction get a zero one)
    kept, pos = bytearray(), start
    self.binlake_vector_dimensions = []
    while pos < end:
        kind = data[pos]
        length, after = mysql_events.net_length(data, pos + 1)
        if kind in _KNOWN_METADATA:
            kept += data[pos:after + length]
        elif kind == VECTOR_DIMENSIONALITY:
            field = after
            while field < after + length:
                dimensions, field = mysql_events.net_length(data, field)
                self.binlake_vector_dimensions.append(dimensions)
        pos = after + length
    self.binlake_data = data  # the event as sent: what `BinlogReader` caches compiled schemas by
    if len(kept) != end - start:
        packet._data = bytes(data[:start]) + bytes(kept) + bytes(data[end:])
    return _optional_meta_data(self)


_parse_column = lib_column.Column._Column__parse_column_definition


def _parse_column_definition(self: Any, column_type: int, packet: Any) -> None:
    _parse_column(self, column_type, packet)
    if column_type == VECTOR:
        self.length_size = packet.read_uint8()


def install() -> None:
    binlogstream.MYSQL_EXPECTED_ERROR_CODES = []
    binlogstream.GtidSet = _DumpGtidSet
    BinLogPacketWrapper._BinLogPacketWrapper__event_map[mysql_events.PREVIOUS_GTIDS] = ev.NotImplementedEvent
    rev.TableMapEvent._get_optional_meta_data = _known_optional_meta_data
    lib_column.Column._Column__parse_column_definition = _parse_column_definition


install()

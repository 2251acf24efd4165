"""The only blocking code: mysql-replication's reader in a thread, feeding the event loop.

`BinlogReader.run` is the thread body. It reads events, turns TableMaps into compiled
schemas, decodes rows itself (`rows.decode_rows`), lets the `Assembler` cut transactions and
envelopes, and hands finished messages to a `ThreadBridge`. Connection errors are not
retried here: the library would reconnect from its original start position and replay
forever (see PITFALLS), so every error ends the thread and the pipeline restarts from what
the stream holds.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pymysql
from pymysql.protocol import MysqlPacket
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication import event as ev
from pymysqlreplication import row_event as rev
from pymysqlreplication.packet import BinLogPacketWrapper

from services.parser import ddl, mysql_events, replication_lib  # noqa: F401 (replication_lib: patches)
from services.parser.columns import TableSchema, schema_from_table_map
from services.parser.redact import redact
from services.parser.rows import check_full_image, decode_rows
from services.parser.snapshot.windows import Windows
from services.parser.transactions import INNER_CHUNKS, Assembler, Outgoing, Resume
from services.parser.values import DecodeStats
from shared.bridge import BridgeClosed, ThreadBridge
from shared.errors import (
    BinlakeError,
    DecodeError,
    SourceMisconfigured,
    SourceUnavailable,
)
from shared.gtid import GtidSet
from shared.mysql import MysqlUrl, map_mysql_error

_EVENTS = [
    ev.QueryEvent, ev.XidEvent, ev.GtidEvent, ev.MariadbGtidEvent, ev.RotateEvent, ev.FormatDescriptionEvent,
    ev.HeartbeatLogEvent, ev.MariadbGtidListEvent, ev.MariadbBinLogCheckPointEvent, ev.NotImplementedEvent,
    ev.XAPrepareEvent, ev.StopEvent, ev.BeginLoadQueryEvent, ev.ExecuteLoadQueryEvent, ev.MariadbStartEncryptionEvent,
    rev.TableMapEvent, rev.WriteRowsEvent, rev.UpdateRowsEvent, rev.DeleteRowsEvent, rev.PartialUpdateRowsEvent,
]
_ROW_OPS = {rev.WriteRowsEvent: "i", rev.UpdateRowsEvent: "u", rev.DeleteRowsEvent: "d"}
ANONYMOUS_GTID = 0x22
HEARTBEAT_V2 = 0x29
_IGNORABLE = {0x1C, 0x1D, 0x24, 0x25, 0x05, 0x0D, 0x0E, 0xA0}  # ignorable, rows-query, context, intvar, rand...
_MARIADB_COMPRESSED = {mysql_events.MARIADB_QUERY_COMPRESSED, *mysql_events.MARIADB_ROWS_COMPRESSED}


class BinlogReader:
    """Reads the binlog from `start` and pushes finished messages into `bridge` (thread body)."""

    def __init__(self, dsn: MysqlUrl, server_id: int, assembler: Assembler, bridge: ThreadBridge[Outgoing],
                 *, mariadb: bool, heartbeat_s: float = 5.0, windows: Windows | None = None,
                 read_timeout_s: float | None = None, seen: Callable[[], None] | None = None) -> None:
        self._dsn = dsn
        self._read_timeout_s = read_timeout_s  # a hung source ends the read instead of blocking forever
        self._seen = seen
        self._windows = windows
        self._server_id = server_id
        self._asm = assembler
        self._bridge = bridge
        self._mariadb = mariadb
        self._heartbeat_s = heartbeat_s
        self._schemas: dict[bytes, TableSchema] = {}
        self._tables: dict[int, TableSchema] = {}
        self._stream: BinLogStreamReader | None = None
        self.events = 0
        self.stats = DecodeStats()
        self._chunk = 0  # first chunk number of the event being handled (inside a compressed transaction)

    def _open(self, start: Resume) -> BinLogStreamReader:
        kwargs: dict[str, Any] = {}
        if self._asm.by_gtid and start.gtid:
            # By GTID: on a promoted replica the same place has another file and offset.
            kwargs.update(is_mariadb=self._mariadb, auto_position=start.gtid)
        else:
            # File/offset resume; on MariaDB this needs is_mariadb=False (see PITFALLS).
            kwargs.update(log_file=start.file, log_pos=start.offset, resume_stream=True)
        return BinLogStreamReader(
            connection_settings={**self._dsn.pymysql_settings(),
                                 **({"read_timeout": self._read_timeout_s} if self._read_timeout_s else {})},
            server_id=self._server_id, blocking=True,
            only_events=_EVENTS, filter_non_implemented_events=False, slave_heartbeat=self._heartbeat_s,
            enable_logging=False, **kwargs,
        )

    def run(self) -> None:
        """Thread body: read until cancelled or an error; the error goes to the consumer."""
        start = self._asm.boundary
        error: BaseException | None = None
        try:
            self._stream = self._open(start)
            while not self._bridge.cancelled:
                event = self._stream.fetchone()
                if event is None:
                    raise SourceUnavailable("the source closed the binlog stream")
                if self._seen is not None:
                    self._seen()
                out = self._handle(event, self._stream.log_file)
                # mysql-replication links an event and its packet both ways: unlinked, both go (with
                # the event's bytes) when the last reference does, not at the collector's next pass.
                packet: Any = getattr(event, "packet", None)
                if packet is not None and getattr(packet, "event", None) is event:
                    packet.event = None
                if out:
                    self._bridge.put_many(out)
                    if self._seen is not None:
                        self._seen()  # time blocked on a slow bus is not the source's silence
        except BridgeClosed:
            pass
        except BinlakeError as exc:
            error = exc
        except (pymysql.err.MySQLError, OSError) as exc:
            error = map_mysql_error(exc, f"{start.file}:{start.offset} gtid={start.gtid}")
        except Exception as exc:  # the library raises plain exceptions on malformed events
            error = DecodeError(f"cannot read binlog event: {exc!r}")
            error.__cause__ = exc
        finally:
            self.close()
            self._bridge.finish(error)

    def interrupt(self) -> None:
        """Wake the thread from its blocking socket read (safe from the event loop).

        Closing the connection here would wait for the buffered reader's lock that the reading
        thread holds; shutting the socket down makes that read fail at once, and the thread
        then closes the connection itself.
        """
        stream = self._stream
        conn = getattr(stream, "_stream_connection", None)
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception:  # closing a broken connection may fail again; nothing to keep
                pass

    def _handle(self, event: Any, file: str) -> list[Outgoing]:
        pkt = event.packet
        end = pkt.log_pos
        return self._dispatch(event, file, end - pkt.event_size, end)

    def _dispatch(self, event: Any, file: str, start: int, end: int) -> list[Outgoing]:
        self.events += 1
        ts = event.timestamp * 1000
        asm = self._asm
        op = _ROW_OPS.get(type(event))
        if op is not None:
            return self._rows(event, op, file, start, ts)
        if isinstance(event, rev.TableMapEvent):
            self._table_map(event)
            return []
        if isinstance(event, ev.XidEvent):
            return asm.commit(file, end)
        if isinstance(event, ev.QueryEvent):
            return self._query(event, file, start, end, ts)
        if isinstance(event, ev.MariadbGtidEvent):
            return asm.gtid(event.gtid, event.domain_id, bool(event.flags & 1), file, start)
        if isinstance(event, ev.GtidEvent):
            return asm.gtid(event.gtid, None, False, file, start)
        if isinstance(event, ev.HeartbeatLogEvent):
            return asm.heartbeat(int(time.time() * 1000))
        if isinstance(event, ev.RotateEvent):
            asm.between(event.next_binlog, event.position)
            return []
        if isinstance(event, ev.NotImplementedEvent):
            return self._other(event, file, start, end)
        if isinstance(event, rev.PartialUpdateRowsEvent):
            raise SourceMisconfigured(
                f"a partial JSON update at {file}:{start}: a session wrote it with binlog_row_value_options="
                "PARTIAL_JSON; set binlog_row_value_options='' on the source (globally, and in sessions that "
                "override it); binlake cannot carry that transaction exactly: to go on past it, reset the parser to "
                "the current position and take a new snapshot of the tables"
            )
        if isinstance(event, ev.XAPrepareEvent):
            raise DecodeError(f"XA transaction at {file}:{start}: binlake does not support XA transactions yet")
        if isinstance(event, (ev.BeginLoadQueryEvent, ev.ExecuteLoadQueryEvent)):
            raise SourceMisconfigured(f"statement-based LOAD DATA at {file}:{start}; set binlog_format=ROW")
        if end:
            asm.between(file, end)
        return []

    def _query(self, event: Any, file: str, start: int, end: int, ts: int) -> list[Outgoing]:
        # The one place statements enter binlake: mask credentials before anything (the
        # snapshot windows' reasons, envelopes, errors, logs) sees the text.
        sql = redact(event.query, getattr(event, "sql_mode", 0))
        db = event.schema.decode("utf-8", "replace") if isinstance(event.schema, bytes) else event.schema
        if self._windows is not None and self._windows.watching:
            self._ddl_in_window(sql, db)
        return self._asm.query(sql, db, file, start, end, ts)

    def _other(self, event: Any, file: str, start: int, end: int) -> list[Outgoing]:
        etype = event.event_type
        if etype == ANONYMOUS_GTID:
            return self._asm.anonymous_start(file, start)
        if etype == HEARTBEAT_V2:
            return self._asm.heartbeat(int(time.time() * 1000))
        if etype == mysql_events.TRANSACTION_PAYLOAD:
            return self._payload(event, file, start, end)
        if etype == mysql_events.GTID_TAGGED:
            gtid = mysql_events.parse_tagged_gtid(self._body(event))
            return self._asm.gtid(str(gtid), None, False, file, start)
        if etype == mysql_events.PREVIOUS_GTIDS:
            self._asm.previous_gtids(GtidSet.decode(self._body(event)))
            self._asm.between(file, end)
            return []
        if etype in _MARIADB_COMPRESSED:  # log_bin_compress: the event it stands for, at its place
            assert self._stream is not None
            raw = bytes(event.packet.packet._data[1:20 + event.event_size])
            inner = self._wrap(self._stream, mysql_events.mariadb_uncompressed(raw))
            return [] if inner is None else self._dispatch(inner, file, start, end)
        if etype in _IGNORABLE:
            return []
        raise DecodeError(f"unknown binlog event type {etype:#x} at {file}:{start}; binlake cannot read it safely")

    @staticmethod
    def _body(event: Any) -> bytes:
        """An unparsed event's body: after the OK byte and the common header, without the checksum."""
        return bytes(event.packet.packet._data[20:20 + event.event_size])

    def _payload(self, event: Any, file: str, start: int, end: int) -> list[Outgoing]:
        """A compressed transaction: its inner events, each carried as if it stood in the binlog.

        Inner events have no position of their own: all stand at the payload event's, and the k-th
        numbers its messages' chunks from k * INNER_CHUNKS, so (scn, chunk) and message ids stay
        unique and increasing and a replay numbers every event as before. The transaction ends at
        the payload's end. Each inner event's messages go to the bridge as they are made (its bound
        holds here too), and each counts as a sign of life of the source.
        """
        stream = self._stream
        assert stream is not None
        try:
            for k, raw in enumerate(mysql_events.inner_events(mysql_events.parse_payload(self._body(event)))):
                if raw[4] not in mysql_events.INNER_EVENTS:
                    raise DecodeError(f"compressed transaction at {file}:{start} holds an event of type "
                                      f"{raw[4]:#x}, which no transaction payload may hold")
                self._chunk = k * INNER_CHUNKS
                inner = self._wrap(stream, raw)
                out = [] if inner is None else self._dispatch(inner, file, start, end)
                if out:
                    self._bridge.put_many(out)
                if self._seen is not None:
                    self._seen()
        finally:
            self._chunk = 0
        return []

    @staticmethod
    def _wrap(stream: BinLogStreamReader, raw: bytes) -> Any:
        """An inner event (header and body, no checksum) parsed as the library parses a streamed one."""
        def setting(name: str) -> Any:
            return getattr(stream, f"_BinLogStreamReader__{name}")

        # Given a zero checksum, it reads the event exactly as a streamed one (the TableMap's metadata
        # runs to 4 bytes before the end).
        sized = raw[:9] + struct.pack("<I", len(raw) + 4) + raw[13:] + b"\0\0\0\0"
        packet = BinLogPacketWrapper(
            MysqlPacket(b"\x00" + sized, stream._ctl_connection.encoding), stream.table_map, stream._ctl_connection,
            stream.mysql_version, True, setting("allowed_events_in_packet"), setting("only_tables"),
            setting("ignored_tables"), setting("only_schemas"), setting("ignored_schemas"),
            setting("freeze_schema"), setting("ignore_decode_errors"), False, setting("optional_meta_data"),
            False, setting("use_column_name_cache"), setting("post_header_lengths"))
        inner = packet.event
        if isinstance(inner, rev.TableMapEvent):
            stream.table_map[inner.table_id] = inner.get_table()  # as the library's fetchone does
        return inner

    def _table_map(self, event: Any) -> None:
        # The TableMap body after its table id is identical while the table's schema is, so
        # compiled decoders are cached by those bytes: from after the table id (the OK byte and
        # the 19-byte header come first) to the body's end, without the event's CRC32, which
        # covers the header and so differs in every event.
        data = getattr(event, "binlake_data", None) or event.packet.packet._data  # before `replication_lib` cut it
        key = bytes(data[26 : 20 + event.event_size])
        schema = self._schemas.get(key)
        if schema is None:
            schema = schema_from_table_map(event, self.stats)
            self.stats.schemas_compiled += 1
            if len(self._schemas) > 10_000:
                self._schemas.clear()
            self._schemas[key] = schema
        self._tables[event.table_id] = schema

    def _rows(self, event: Any, op: str, file: str, start: int, ts: int) -> list[Outgoing]:
        table = self._tables.get(event.table_id)
        if table is None:
            raise DecodeError(f"rows event at {file}:{start} refers to table id {event.table_id} without a TableMap")
        if event.number_of_columns != len(table.columns):
            raise DecodeError(f"rows event at {file}:{start} has {event.number_of_columns} columns, "
                              f"its TableMap {len(table.columns)}")
        bitmaps = [event.columns_present_bitmap]
        if op == "u":
            bitmaps.append(event.columns_present_bitmap2)
        check_full_image(table, f"{file}:{start}", *bitmaps)
        pkt = event.packet
        body = pkt.read(event.event_size - pkt.read_bytes)
        rows = decode_rows(table, op, body)
        windows = self._windows
        if windows is not None:
            if windows.is_watermark(table.db, table.table):
                return self._watermark(windows, rows, file, start, ts)
            if windows.active:
                windows.on_rows(table.db, table.table, rows)
        return self._asm.rows(op, table, rows, file, start, ts, self._chunk)

    def _watermark(self, windows: Windows, rows: list[dict[str, Any]], file: str, start: int,
                   ts: int) -> list[Outgoing]:
        """A snapshot watermark: never published itself; a high one releases its chunk here."""
        out: list[Outgoing] = []

        def emit(schema: TableSchema, chunk: list[dict[str, Any]], marks: tuple[str, ...]) -> int:
            out.extend(self._asm.snapshot(schema, chunk, file, start, ts, self._chunk, marks=marks))
            return self._asm.scn(file, start)

        windows.on_watermark(rows, emit)
        return out

    def _ddl_in_window(self, sql: str, db: str) -> None:
        assert self._windows is not None
        stmt = ddl.parse(sql, db)
        if stmt.kind not in ("txn", "dml"):
            self._windows.on_ddl(list(stmt.tables) or None, sql)

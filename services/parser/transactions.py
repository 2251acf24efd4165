"""Pure: assemble binlog events into transactions and envelopes ready to publish.

The binlog thread feeds events in order; `Assembler` keeps the open transaction, holds back
the newest message until it knows whether it is the transaction's last (so `txn.last` and
`resume` are exact), splits messages larger than max_payload into chunks (one row too large for a
message goes to an object, `shared.objects`), and drops the
batches a restart replays that the stream already holds (Debezium's
`eventsToSkipUponRestart`, keyed by transaction id and batch index).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.parser import alter, ddl
from services.parser.columns import TableSchema
from shared import envelope, objects
from shared.errors import DecodeError, SourceMisconfigured
from shared.gtid import GtidSet
from shared.subjects import DDL_TABLE, HEARTBEAT_TABLE, Names

HEADER_ALLOWANCE = 1024  # room left in max_payload for headers
# The events of a compressed transaction share the payload event's position; the k-th numbers its
# messages from k * INNER_CHUNKS on (a rows event never splits into that many).
INNER_CHUNKS = 1 << 24


@dataclass(frozen=True)
class Resume:
    """Where a reader restarts: binlog file/offset and the GTID state (MariaDB: the last GTID of each
    domain; MySQL: the executed GTID set, None when unknown); the server (its server_id, and on
    MySQL its server_uuid) those belong to and the epoch of the order keys (`envelope.scn`)."""

    file: str
    offset: int
    gtid: str | None = None
    server: int | None = None
    epoch: int = 0
    uuid: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "offset": self.offset, "gtid": self.gtid}
        if self.server is not None:
            out["server"] = self.server
        if self.epoch:
            out["epoch"] = self.epoch
        if self.uuid is not None:
            out["uuid"] = self.uuid
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Resume:
        server = d.get("server")
        return cls(file=d["file"], offset=int(d["offset"]), gtid=d.get("gtid"),
                   server=None if server is None else int(server), epoch=int(d.get("epoch") or 0),
                   uuid=d.get("uuid"))


@dataclass(frozen=True)
class SkipMark:
    """Batches `0..i` of transaction `txn_id` are already in the stream."""

    txn_id: str
    i: int


@dataclass(slots=True)
class Outgoing:
    """One message for BINLAKE_RAW plus what the position reporter needs after its ack."""

    subject: str
    data: bytes
    msg_id: str
    headers: dict[str, str]
    op: str
    ts: int
    rows: int
    resume: Resume
    last: bool
    blob: bytes | None = None  # the whole envelope when `data` is its reference (`shared.objects`)
    blob_ref: objects.Ref | None = None  # the object `blob` goes to
    order: tuple[int, int] | None = None  # (scn, chunk) of a message on a table's subject (`order_guard`)

    def size(self) -> int:
        """Bytes it holds (the bound of the parser's buffers)."""
        return len(self.data) + (len(self.blob) if self.blob is not None else 0)


@dataclass
class _Txn:
    id: str
    start: Resume
    gtid: str | None
    domain: int | None
    ddl_ends: bool
    i: int = 0
    pending: tuple[dict[str, Any], bytes | None, str | None] | None = None


def gtid_state_str(state: dict[int, str]) -> str:
    return ",".join(state[d] for d in sorted(state))


def parse_gtid_state(text: str | None) -> dict[int, str]:
    state: dict[int, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if part:
            state[int(part.split("-", 1)[0])] = part
    return state


@dataclass
class Assembler:
    source: str
    names: Names
    start: Resume
    max_payload: int = 1024 * 1024
    skip: SkipMark | None = None
    mariadb: bool = True
    ignore: frozenset[tuple[str, str]] = frozenset()  # binlake's own tables in the source (watermarks)
    # The source runs with lower_case_table_names=1: a DDL names its tables in lower case, the way
    # the server stores them and the rows' TableMaps carry them, however the statement spells them.
    lower_names: bool = False
    server: int | None = None  # the source's server_id
    uuid: str | None = None  # MySQL: the source's server_uuid
    epoch: int = 0  # of the order keys (`envelope.scn`): servers moved to so far
    gtids: bool = True  # the source has GTIDs (MariaDB; MySQL with gtid_mode=ON): track them
    # The stream is opened by GTID (MariaDB; MySQL on another server than `start`'s). Its first
    # events lie before the resume point, and until a transaction of this run commits, no
    # position the server sends is one to resume at by file and offset: the boundary stays `start`.
    by_gtid: bool = False
    _txn: _Txn | None = field(default=None, init=False)
    _gtids: dict[int, str] = field(default_factory=dict, init=False)
    _gtid_set: GtidSet | None = field(default=None, init=False)  # MySQL's executed set, None while unknown
    _boundary: Resume = field(init=False)
    _ready: list[Outgoing] = field(default_factory=list, init=False)
    _committed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.mariadb:
            self._gtids = parse_gtid_state(self.start.gtid)
        elif self.gtids and self.start.gtid is not None:
            self._gtid_set = GtidSet.parse(self.start.gtid)
        self._boundary = self.start
        self.ignore = frozenset((ddl.stored_name(d, self.lower_names), ddl.stored_name(t, self.lower_names))
                                for d, t in self.ignore)

    @property
    def boundary(self) -> Resume:
        """The position after the last complete transaction."""
        return self._boundary

    @property
    def in_transaction(self) -> bool:
        return self._txn is not None

    # -- events -------------------------------------------------------------------------

    def gtid(self, gtid: str, domain: int | None, standalone: bool, file: str, start: int) -> list[Outgoing]:
        out = self._close_dangling(file, start)
        self._txn = _Txn(id=gtid, start=self._at(file, start, self._state_str()), gtid=gtid, domain=domain,
                         ddl_ends=standalone or not self.mariadb)
        return out

    def anonymous_start(self, file: str, start: int) -> list[Outgoing]:
        """MySQL ANONYMOUS_GTID: a transaction starts here, without a GTID."""
        out = self._close_dangling(file, start)
        self._txn = _Txn(id=f"{file}:{start}", start=self._at(file, start, None), gtid=None, domain=None,
                         ddl_ends=True)
        return out

    def query(self, sql: str, db: str, file: str, start: int, end: int, ts: int) -> list[Outgoing]:
        """A QUERY event; `sql` is already redacted (`redact.redact`), it is published as given.

        `db` is the session's database; its DDL's `db` and `table` are named as the server stores them.
        """
        db = ddl.stored_name(db, self.lower_names)
        stmt = ddl.parse(sql, db, lower_names=self.lower_names)
        if stmt.kind == "txn":
            words = ddl.strip_comments(sql).upper().split()
            word = words[0]
            if "TO" in words[1:3]:
                return []  # ROLLBACK [WORK] TO SAVEPOINT stays inside the transaction
            if word == "BEGIN":
                if self._txn is None:
                    self._txn = _Txn(id=f"{file}:{start}", start=self._at(file, start, self._state_str()),
                                     gtid=None, domain=None, ddl_ends=False)
                else:
                    self._txn.ddl_ends = False
                return []
            if word in ("COMMIT", "ROLLBACK"):
                return self.commit(file, end)
            return []
        if stmt.kind == "dml":
            raise SourceMisconfigured(
                f"statement-based DML in the binlog at {file}:{start} ({sql[:80]!r}); "
                "set binlog_format=ROW on the source (globally, and in sessions that override it)"
            )
        standalone = self._txn is None
        if standalone:
            self._txn = _Txn(id=f"{file}:{start}", start=self._at(file, start, self._state_str()), gtid=None,
                             domain=None, ddl_ends=True)
        scn = self.scn(file, start)
        named = list(dict.fromkeys(stmt.tables))
        # DDL of binlake's own tables (the watermarks) is not published; DDL naming no table is.
        targets = [t for t in named if t not in self.ignore] if named else [(db, "")]
        change = alter.describe(sql, db, mariadb=self.mariadb, lower_names=self.lower_names)
        for idx, (tdb, table) in enumerate(targets):
            env = self._env("ddl", tdb, table or None, file, start, scn, ts, idx)
            env["ddl"] = sql
            env["alter"] = change
            self._push(env, None, None)
        assert self._txn is not None
        return self.commit(file, end) if self._txn.ddl_ends else self._drain_before_last()

    def rows(self, op: str, table: TableSchema, rows: list[dict[str, Any]], file: str, start: int,
             ts: int, chunk: int = 0) -> list[Outgoing]:
        """A rows event at `start`; `chunk` numbers it among the events that share that position
        (a compressed transaction's, `INNER_CHUNKS` apart)."""
        if self._txn is None:
            raise DecodeError(f"rows event for {table.db}.{table.table} at {file}:{start} outside a transaction")
        env = self._env(op, table.db, table.table, file, start, self.scn(file, start), ts, chunk)
        env["pk"] = list(table.pk)
        env["rows"] = rows
        self._push(env, table.packed, table.id)
        return self._drain_before_last()

    def snapshot(self, table: TableSchema, changes: list[dict[str, Any]], file: str, start: int,
                 ts: int, chunk: int = 0, *, marks: Sequence[str] = ()) -> list[Outgoing]:
        """Snapshot rows (`op = "r"`, each `{"after": row}`) at the position of the high watermark
        that releases them, after `marks` (`replace`, `replaced`: no rows) at the same position."""
        for mark in marks:
            if self._txn is None:
                raise DecodeError(f"snapshot of {table.db}.{table.table} at {file}:{start} outside a transaction")
            env = self._env(mark, table.db, table.table, file, start, self.scn(file, start), ts, chunk)
            if mark == envelope.REPLACE:  # with the table's columns: a consumer without the table creates it here
                env["pk"] = list(table.pk)
                self._push(env, table.packed, table.id)
            else:
                self._push(env, None, None)
            chunk += 1
        if marks and not changes:
            return self._drain_before_last()
        return self.rows("r", table, changes, file, start, ts, chunk)

    def commit(self, file: str, end: int) -> list[Outgoing]:
        txn = self._txn
        if txn is None:
            return []
        self._txn = None
        self._committed = True
        if txn.domain is not None and txn.gtid:
            self._gtids[txn.domain] = txn.gtid
        elif txn.gtid and self._gtid_set is not None:
            self._gtid_set.add(txn.gtid)
        self._boundary = self._at(file, end, self._state_str())
        out, self._ready = self._ready, []
        if txn.pending is not None:
            env, packed, schema_id = txn.pending
            txn.pending = None
            out += self._release(txn, env, packed, schema_id, last=True, resume=self._boundary)
        if self.skip is not None and self.skip.txn_id == txn.id:
            self.skip = None
        return out

    def previous_gtids(self, executed: GtidSet) -> None:
        """MySQL's Previous_gtids at the start of a binlog file: every transaction before it.

        Joined to the tracked set (a resume by file and offset learns its set here; a resume by GTID
        gets the file's set, which the tracked one already holds).
        """
        if self.mariadb or not self.gtids:
            return
        if self._gtid_set is None:
            self._gtid_set = executed.copy()
        else:
            self._gtid_set.update(executed)

    def between(self, file: str, end: int) -> None:
        """An event outside any transaction (rotate, GTID list, checkpoint) moved the position.

        Never backwards within a file: a resume by GTID streams the file from its start (its
        FORMAT_DESCRIPTION and Previous_gtids lie before the resume point).
        """
        b = self._boundary
        if self.by_gtid and not self._committed:
            return
        if self._txn is None and not (file == b.file and end < b.offset):
            self._boundary = self._at(file, end, self._state_str())

    def heartbeat(self, ts: int) -> list[Outgoing]:
        """A heartbeat at the current boundary, only between transactions, and not while the
        stream ends inside a transaction this run has not finished (its tail must keep the skip
        mark that says which batches of it are stored)."""
        if self._txn is not None or self.skip is not None:
            return []
        b = self._boundary
        scn = self.scn(b.file, b.offset)
        env = {"v": envelope.VERSION, "source": self.source, "db": None, "table": None, "op": "hb",
               "ts": ts, "pos": {"file": b.file, "offset": b.offset, "gtid": b.gtid}, "scn": scn,
               "chunk": 0, "txn": {"id": None, "i": 0, "last": True}, "resume": b.to_dict()}
        data = envelope.encode(env)
        mid = f"{self.source}:{scn}:hb{ts}"
        subject = self.names.raw_internal(self.source, HEARTBEAT_TABLE)
        return [Outgoing(subject, data, mid, envelope.headers(env, mid), "hb", ts, 0, b, True)]

    def scn(self, file: str, offset: int) -> int:
        """The order key of a position of this server."""
        return envelope.scn(file, offset, self.epoch)

    # -- internals ----------------------------------------------------------------------

    def _at(self, file: str, offset: int, gtid: str | None) -> Resume:
        return Resume(file, offset, gtid, self.server, self.epoch, self.uuid)

    def _state_str(self) -> str | None:
        if self.mariadb:
            return gtid_state_str(self._gtids)
        return None if self._gtid_set is None else str(self._gtid_set)

    def _close_dangling(self, file: str, start: int) -> list[Outgoing]:
        # A transaction without its commit event (e.g. a non-transactional statement logged
        # without COMMIT) ends where the next one starts.
        return self.commit(file, start) if self._txn is not None else []

    def _env(self, op: str, db: str, table: str | None, file: str, start: int, scn: int, ts: int,
             chunk: int) -> dict[str, Any]:
        txn = self._txn
        assert txn is not None
        return {"v": envelope.VERSION, "source": self.source, "db": db, "table": table, "op": op, "ts": ts,
                "pos": {"file": file, "offset": start, "gtid": txn.gtid}, "scn": scn, "chunk": chunk,
                "txn": {"id": txn.id, "i": 0, "last": False}}

    def _push(self, env: dict[str, Any], packed: bytes | None, schema_id: str | None) -> None:
        txn = self._txn
        assert txn is not None
        if txn.pending is not None:
            self._ready.extend(self._release(txn, *txn.pending, last=False, resume=txn.start))
        txn.pending = (env, packed, schema_id)

    def _drain_before_last(self) -> list[Outgoing]:
        out, self._ready = self._ready, []
        return out

    def _release(self, txn: _Txn, env: dict[str, Any], packed: bytes | None, schema_id: str | None, *,
                 last: bool, resume: Resume) -> list[Outgoing]:
        out: list[Outgoing] = []
        parts = [env]
        limit = self.max_payload - HEADER_ALLOWANCE
        while True:
            encoded = []
            for n, part in enumerate(parts):
                is_last = last and n == len(parts) - 1
                part["chunk"] = env["chunk"] + n
                part["txn"] = {"id": txn.id, "i": txn.i + n, "last": is_last}
                part["resume"] = (resume if is_last else txn.start).to_dict()
                encoded.append(envelope.encode(part, packed))
            too_big = [n for n, data in enumerate(encoded) if len(data) > limit and len(parts[n].get("rows") or ()) > 1]
            if not too_big:
                break
            parts = self._halve(parts, too_big)
        for n, (part, data) in enumerate(zip(parts, encoded, strict=True)):
            i = txn.i + n
            is_last = last and n == len(parts) - 1
            if self.skip is not None and self.skip.txn_id == txn.id and i <= self.skip.i:
                continue
            msg = self._outgoing(part, data, resume if is_last else txn.start, is_last, schema_id)
            if len(data) > limit:  # one row larger than a message: the envelope goes to an object
                ref = objects.Ref.of_data(self.names.raw_objects_bucket, msg.msg_id, data)
                msg.blob, msg.blob_ref, msg.data = data, ref, envelope.encode(objects.referring(part, ref))
                msg.headers[objects.HEADER] = f"{ref.bucket}/{ref.name}"
            out.append(msg)
        txn.i += len(parts)
        return out

    @staticmethod
    def _halve(parts: list[dict[str, Any]], too_big: list[int]) -> list[dict[str, Any]]:
        """Split each oversize part's rows in two (a single row that does not fit goes to an object)."""
        out: list[dict[str, Any]] = []
        for n, part in enumerate(parts):
            rows = part.get("rows") or []
            if n not in too_big:
                out.append(part)
                continue
            half = len(rows) // 2
            out += [{**part, "rows": rows[:half]}, {**part, "rows": rows[half:]}]
        return out

    def _outgoing(self, env: dict[str, Any], data: bytes, resume: Resume, last: bool,
                  schema_id: str | None) -> Outgoing:
        mid = envelope.msg_id(self.source, env["scn"], env["chunk"])
        table = env["table"]
        order: tuple[int, int] | None = None
        if env["op"] == "ddl" and not table:
            subject = self.names.raw_internal(self.source, DDL_TABLE)
        else:
            subject, order = self.names.raw(self.source, env["db"], table), (env["scn"], env["chunk"])
        rows = len(env.get("rows") or ())
        headers = envelope.headers(env, mid)
        if schema_id:
            headers[envelope.SCHEMA_HEADER] = schema_id
        return Outgoing(subject, data, mid, headers, env["op"], env["ts"], rows, resume, last, order=order)

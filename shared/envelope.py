"""The change envelope (DESIGN §4): one msgpack map per table per binlog rows event.

Keys: `v`, `source`, `db`, `table`, `op` (`i`/`u`/`d`/`r`/`ddl`/`hb`), `ts` (commit time,
ms), `pos` (`file`, `offset`, `gtid`), `scn`, `chunk`, `txn` (`id`, `i`, `last`), `pk`,
`rows`, `schema`, plus `ddl` (statement text) on DDL and `resume` on every message.

`resume` is where a reader restarts so that nothing after this message is lost: for the
last message of a transaction the position after its commit, otherwise the start of its
transaction (the reader then skips the batches of that transaction it already published).
It is a map with `file`, `offset` and `gtid` (the GTID state to connect with, or None), and
`server` (the source's server_id) and `epoch` (see `scn`) when known.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypedDict, cast

import msgpack

VERSION: Final = 1
REF_VERSION: Final = 2  # a reference to an object holding a version-1 envelope (`shared.objects`)
REPLACE: Final = "replace"  # a keyless table's snapshot begins here: it replaces the table's rows before it
REPLACED: Final = "replaced"  # ... and is complete here (every `r` row of it came before)
ABANDONED: Final = "abandoned"  # ... or will not complete (it failed): its `r` rows count for nothing
SNAPSHOT_MARKS: Final = (REPLACE, REPLACED, ABANDONED)  # rowless events of a keyless table's snapshot
OPS: Final = frozenset({"i", "u", "d", "r", *SNAPSHOT_MARKS, "ddl", "hb"})
ROW_OPS: Final = frozenset({"i", "u", "d", "r"})  # the ops that carry rows
REQUIRED: Final = ("v", "source", "op", "ts", "pos", "scn", "txn")

_SCHEMA_KEY: bytes = msgpack.packb("schema")
_packer = msgpack.Packer(use_bin_type=True, autoreset=True)


def _packb(obj: Any) -> bytes:
    data: bytes = _packer.pack(obj)
    return data


class Position(TypedDict):
    file: str
    offset: int
    gtid: str | None


class Txn(TypedDict):
    id: str
    i: int
    last: bool


class Envelope(TypedDict, total=False):
    """DESIGN §4 as a type: what `decode` returns (the keys in REQUIRED are always there)."""

    v: int
    source: str
    db: str | None
    table: str | None
    op: str
    ts: int
    pos: Position
    scn: int
    chunk: int
    txn: Txn
    pk: list[str]
    rows: list[dict[str, Any]]
    schema: dict[str, Any]
    ddl: str
    alter: dict[str, Any]
    resume: Position


class EnvelopeError(ValueError):
    """A message is not a binlake envelope this version can read."""


EPOCH_SHIFT: Final = 56
MAX_EPOCH: Final = 127  # the order key stays a positive signed 64-bit integer (Iceberg's long)


def scn(file: str, offset: int, epoch: int = 0) -> int:
    """64-bit order key: epoch << 56 | binlog file number << 32 | offset (as in Databus).

    The epoch counts the servers of the source's replication topology binlake has moved to
    (a failover, `services.parser.failover`): another server numbers its binlogs its own way,
    so its positions order only after everything read before the switch.
    """
    number = binlog_number(file)
    if not 0 <= epoch <= MAX_EPOCH or number >= 1 << 24 or not 0 <= offset < 1 << 32:
        raise EnvelopeError(f"position {file}:{offset} (epoch {epoch}) does not fit the 64-bit order key")
    return (epoch << EPOCH_SHIFT) | (number << 32) | offset


def binlog_number(file: str) -> int:
    """`mysql-bin.000042` -> 42."""
    _, _, ext = file.rpartition(".")
    if not ext.isdigit():
        raise EnvelopeError(f"binlog file name without a number: {file!r}")
    return int(ext)


def pack_schema(schema: Mapping[str, Any]) -> bytes:
    """Pack a schema once per table map so every message can reuse the bytes."""
    return _packb(schema)


def encode(fields: Mapping[str, Any], packed_schema: bytes | None = None) -> bytes:
    """Encode an envelope; `packed_schema` (from `pack_schema`) is spliced in as `schema`."""
    data = _packb(fields)
    if packed_schema is None:
        return data
    n = len(fields)
    if n >= 15 or data[0] != 0x80 | n:
        return _packb({**fields, "schema": msgpack.unpackb(packed_schema)})
    # A fixmap header holds the entry count, so appending one entry is a header bump.
    return b"".join((bytes((0x80 | (n + 1),)), memoryview(data)[1:], _SCHEMA_KEY, packed_schema))  # one copy


def decode(data: bytes) -> Envelope:
    """Decode and check an envelope; raises EnvelopeError with the reason."""
    try:
        env = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise EnvelopeError(f"not msgpack: {exc}") from exc
    return _checked(env)


class Decoder:
    """`decode` for a reader of many messages per table: a schema it decoded before is not
    decoded again.

    `encode` writes the schema as the last entry of the map, so a message that ends with the
    bytes of the schema the last message under the same key (its subject) ended with is decoded
    without them, and gets the schema decoded then (one object shared by those envelopes: do
    not change it in place). msgpack values delimit themselves, so the rest decodes as a map of
    one entry less, with nothing left over, only if those bytes are exactly its last entry; any
    other message is decoded whole. Either way the result equals `decode(data)`.
    """

    def __init__(self, keys: int = 1024) -> None:
        self._keys = keys
        self._last: dict[str, tuple[bytes, Any]] = {}  # key -> (b"schema" entry as packed, its value)

    def decode(self, data: bytes, key: str) -> Envelope:
        last = self._last.get(key)
        if last is not None and len(data) > len(last[0]) and 0x81 <= data[0] <= 0x8F and data.endswith(last[0]):
            try:
                rest = b"".join((bytes((data[0] - 1,)), memoryview(data)[1:len(data) - len(last[0])]))
                env = msgpack.unpackb(rest, raw=False, strict_map_key=False)
            except Exception:  # msgpack raises several unrelated types
                env = None
            if isinstance(env, dict):
                env["schema"] = last[1]
                return _checked(env)
        out = decode(data)
        schema = out.get("schema")
        if isinstance(schema, dict):
            entry = _SCHEMA_KEY + _packb(schema)
            if data.endswith(entry):
                if len(self._last) >= self._keys and key not in self._last:
                    self._last.clear()
                self._last[key] = (entry, schema)
        return out


def _checked(env: Any) -> Envelope:
    if not isinstance(env, dict):
        raise EnvelopeError(f"envelope is a {type(env).__name__}, expected a map")
    missing = [k for k in REQUIRED if k not in env]
    if missing:
        raise EnvelopeError(f"envelope lacks {', '.join(missing)}")
    if env["v"] != VERSION and not (env["v"] == REF_VERSION and "ref" in env):
        raise EnvelopeError(f"envelope version {env['v']!r} is not supported (this binlake reads {VERSION})")
    if env["op"] not in OPS:
        raise EnvelopeError(f"unknown op {env['op']!r}")
    return cast(Envelope, env)


def as_dict(env: Envelope) -> dict[str, Any]:
    """The envelope as a plain dict, for code that reshapes any envelope (sink rules, the lake's frames)."""
    return cast(dict[str, Any], env)


def msg_id(source: str, scn_value: int, chunk: int = 0) -> str:
    """`<source>:<scn>[:<chunk>]`, stable across replays of the same binlog event."""
    return f"{source}:{scn_value}" if chunk == 0 else f"{source}:{scn_value}:{chunk}"


OP_HEADER: Final = "Binlake-Op"  # the envelope's op
TABLE_HEADER: Final = "Binlake-Table"  # "db.table", empty for binlake's own messages
POS_HEADER: Final = "Binlake-Pos"  # "file:offset[ gtid]" at the source
SCN_HEADER: Final = "Binlake-Scn"  # the order key
SCHEMA_HEADER: Final = "Binlake-Schema"  # the id of the schema the rows are in
ROWS_HEADER: Final = "Binlake-Rows"  # the rows the message holds
TS_HEADER: Final = "Binlake-Ts"  # the source's commit time, epoch milliseconds
TXN_HEADER: Final = "Binlake-Txn"  # "<i> <1 if last else 0> <txn id>": how a reader finds whole transactions


def txn_tag(headers: Mapping[str, str]) -> tuple[str, int, bool] | None:
    """(transaction id, index of the message in it, whether it is the last) from a message's
    `Binlake-Txn` header; None without one (heartbeats, messages of an older binlake)."""
    value = headers.get(TXN_HEADER)
    if not value:
        return None
    try:
        i, last, txn_id = value.split(" ", 2)
        return txn_id, int(i), last == "1"
    except ValueError:
        return None


def txn_header(env: Mapping[str, Any]) -> str | None:
    """The `Binlake-Txn` value of an envelope (None for a message outside transactions, a
    heartbeat); EnvelopeError when its `txn` is not what a parser writes."""
    txn = env.get("txn")
    if not isinstance(txn, Mapping) or txn.get("id") is None:
        return None
    txn_id, i, last = txn.get("id"), txn.get("i"), txn.get("last")
    if not isinstance(txn_id, str) or not 0 < len(txn_id) <= 256 or not txn_id.isprintable() or " " in txn_id \
            or isinstance(i, bool) or not isinstance(i, int) or i < 0 or not isinstance(last, bool):
        raise EnvelopeError(f"txn {str(txn)[:200]!r} is not an id, an index and a last flag")
    return f"{i} {1 if last else 0} {txn_id}"


def headers(env: Mapping[str, Any], mid: str) -> dict[str, str]:
    """Headers readable in `nats stream view` without decoding the body."""
    pos = env["pos"]
    table = f"{env['db']}.{env['table']}" if env.get("table") is not None else ""
    out = {
        "Nats-Msg-Id": mid,
        OP_HEADER: env["op"],
        TABLE_HEADER: table,
        POS_HEADER: f"{pos['file']}:{pos['offset']}" + (f" {pos['gtid']}" if pos.get("gtid") else ""),
        ROWS_HEADER: str(len(env.get("rows") or ())),
        SCN_HEADER: str(env["scn"]),
        TS_HEADER: str(env["ts"]),
    }
    schema_id = schema_id_of(env)
    if schema_id:
        out[SCHEMA_HEADER] = schema_id
    txn = txn_header(env)
    if txn is not None:
        out[TXN_HEADER] = txn
    return out


def schema_id_of(env: Mapping[str, Any]) -> str | None:
    schema = env.get("schema")
    return str(schema["id"]) if isinstance(schema, Mapping) and schema.get("id") else None

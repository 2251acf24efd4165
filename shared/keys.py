"""Every KV key binlake writes, and the one escape that makes any name a key token.

Buckets come from `shared.subjects.Names`; the keys in them from here, so that services,
`binlake status` and `binlake rewind` spell each one the same way. A source is already a
key token (`[A-Za-z0-9_-]+`, checked by the configuration); any other name goes through
`kv_token`, which is reversible (`unescape_key`).

| bucket | key | written by |
|---|---|---|
| leases | `parser.<source>` | the parser holding the lease |
| leases | `loader.<source>.<client>` | the loader holding the lease |
| members | `sink.<source>.<instance>` | each live sink worker |
| cursors | `parser.<source>` | the parser's acked position |
| cursors | `parser.<source>.schema` | the parser's schema recorder: the last BINLAKE_RAW sequence it recorded |
| cursors | `meta.schema.<source>` | nobody now: where meta recorded schemas until the parser took over (read once) |
| cursors | `sink.<source>.p<partition>` | the sink worker owning that partition |
| cursors | `client.<source>.<client>` | the store, for a batch-protocol client (or meta's MySQL backend) |
| cursors | `loader.<source>.<client>.held` | the loader: the source tables it set aside, and why |
| cursors | `snapshot.<source>.table.<db>.<table>`, `snapshot.<source>.request.<id>` | snapshots |
| schema | `<hex source>.<hex db>.<hex table>.<scn>` | meta's schema history |
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_ESCAPED = re.compile(r"(?:=[0-9A-F]{2})+")


def escape_key(name: str) -> str:
    """A name as KV key characters; distinct names always give distinct results (`=XX` escapes)."""
    return _UNSAFE.sub(lambda m: "".join(f"={b:02X}" for b in m.group().encode()), name)


def kv_token(name: str) -> str:
    """A KV key token for any name (never empty); distinct names give distinct tokens."""
    return escape_key(name) or "="


def unescape_key(token: str) -> str:
    """Inverse of `kv_token` / `escape_key`."""
    if token == "=":
        return ""
    return _ESCAPED.sub(lambda m: bytes.fromhex(m.group().replace("=", "")).decode(), token)


# -- leases ------------------------------------------------------------------------------------

def parser_lease(source: str) -> str:
    return f"parser.{source}"


def loader_lease(source: str, client: str) -> str:
    return f"loader.{source}.{kv_token(client)}"


# -- members -----------------------------------------------------------------------------------

def members_prefix(source: str) -> str:
    return f"sink.{source}."


def member(source: str, instance: str) -> str:
    return members_prefix(source) + kv_token(instance)


# -- cursors -----------------------------------------------------------------------------------

def parser_cursor(source: str) -> str:
    return f"parser.{source}"


def schema_recorder(source: str) -> str:
    """The last BINLAKE_RAW sequence whose schema or DDL the parser recorded in meta's history.

    Below `parser.<source>`, never equal to it: a source has no dot, so no other source's
    `parser_cursor` can be this key.
    """
    return f"{parser_cursor(source)}.schema"


def legacy_schema_recorder(source: str) -> str:
    """Meta's recorder cursor from before the parser recorded schemas (KV backend only); read, never written."""
    return f"meta.schema.{source}"


def partition_cursor(source: str, partition: int) -> str:
    return f"sink.{source}.p{partition}"


def partition_cursors(source: str) -> str:
    """The KV key filter of every sink partition cursor of a source."""
    return f"sink.{source}.*"


def clients_prefix(source: str) -> str:
    return f"client.{source}."


def client_cursor(source: str, client: str) -> str:
    """The cursor key of a batch-protocol client."""
    return clients_prefix(source) + escape_key(client)


def client_of(key: str) -> str:
    """The client name of a `client_cursor` key."""
    return unescape_key(key.split(".", 2)[2])


def loaders_prefix(source: str) -> str:
    return f"loader.{source}."


def loader_held(source: str, client: str) -> str:
    """The loader's tables set aside (cursors bucket), for `binlake status`."""
    return f"{loaders_prefix(source)}{kv_token(client)}.held"


def held_client(source: str, key: str) -> str | None:
    """The client of a `loader_held` key, None for other keys."""
    prefix = loaders_prefix(source)
    if not key.startswith(prefix) or not key.endswith(".held"):
        return None
    return unescape_key(key[len(prefix):-len(".held")])


def snapshot_table(source: str, db: str, table: str) -> str:
    return f"snapshot.{kv_token(source)}.table.{kv_token(db)}.{kv_token(table)}"


def snapshot_request(source: str, request_id: str) -> str:
    return f"snapshot.{kv_token(source)}.request.{kv_token(request_id)}"


def snapshot_tables(source: str) -> str:
    """KV filter: every table's snapshot progress."""
    return f"snapshot.{kv_token(source)}.table.>"


def snapshot_requests(source: str) -> str:
    """KV filter: every snapshot request."""
    return f"snapshot.{kv_token(source)}.request.>"


# -- schema history ----------------------------------------------------------------------------
# Hex, not `kv_token`: the history is kept, and its keys were hex before the escape had one owner.

def _hex(name: str) -> str:
    return name.encode().hex() or "_"


def schema_record(source: str, db: str, table: str, scn: int) -> str:
    return f"{schema_table(source, db, table)}.{scn}"


def schema_table(source: str, db: str, table: str) -> str:
    return f"{_hex(source)}.{_hex(db)}.{_hex(table)}"

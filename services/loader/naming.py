"""Pure: lake identifiers of source tables, collision-free and reversible.

Iceberg namespaces and table names are `escape(db)` and `escape(table)`; the changelog of
a table is `escape(table) + "__changelog"` and its live view `escape(table) + "__live"`.

`escape` keeps `[a-z0-9]` and a `_` between two of them; every other character becomes
`__x<hex code point>_` (`Users` -> `__x55_sers`, `order-items` -> `order__x2d_items`,
`a__b` -> `a__x5f___x5f_b`). Its output is lower case (safe in catalogs that fold case and on
case-insensitive file systems) and never holds `__` followed by anything but `x<hex>_`, so
the suffixes above and the bookkeeping namespace `_binlake` cannot be produced by any
source name, and `unescape` recovers the source name exactly.

Identifiers are bounded: an escaped name longer than `MAX_NAME` bytes (a 46-character upper-case
table name escapes to 276) is cut and ends in `__h<16 hex of the SHA-256 of the source name>_`,
a form `escape` never produces; such a table is found by its property `binlake.source`
(`tables.lake_source`), since `unescape` cannot recover the name.

Columns keep their source names, except those the lake's bookkeeping columns (`_binlake_…`)
could meet: a source column matching `_+binlake_` (any case) gets one more leading `_`
(`_binlake_x` -> `__binlake_x`, `__binlake_x` -> `___binlake_x`), so a lake column that starts
with a single `_binlake_` is always the lake's own (`lake_column`, `source_column`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

CHANGELOG_SUFFIX = "__changelog"
LIVE_SUFFIX = "__live"
BOOK_NAMESPACE = "_binlake"  # bookkeeping tables: never an escaped source name (no leading single `_`)
COMMITS_TABLE = "commits"  # one row per batch committed to every table it touched
RENAMES_TABLE = "renames"  # one row per RENAME TABLE the lake followed
STREAMS_TABLE = "streams"  # one row per BINLAKE_CDC definition loaded from: its sequences' offset in the lake
CUTS_TABLE = "cuts"  # per published cut, one row per current table: its snapshot as of that batch
CUT_TAG = "binlake_cut"  # Iceberg tag on each current table: its snapshot in the newest cut
HELD_TABLE = "held"  # the changes of tables set aside, until they load again
RESNAPSHOTS_TABLE = "resnapshots"  # one row per re-snapshot a DDL needs, until the parser has it
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_ESCAPE = re.compile(r"__x([0-9a-f]+)_")
MAX_NAME = 100  # bytes of a namespace or table base name: with the suffixes, under catalogs' 128 and file systems' 255
_HASHED = re.compile(r"__h[0-9a-f]{16}_$")
_RESERVED_COLUMN = re.compile(r"_+binlake_", re.IGNORECASE)


class LakeNameError(ValueError):
    """A lake identifier that no source name escapes to."""


def escape(name: str) -> str:
    """A source database or table name -> its lake identifier."""
    out = []
    last = len(name) - 1
    for i, ch in enumerate(name):
        if ch in _SAFE:
            out.append(ch)
        elif ch == "_" and 0 < i < last and name[i - 1] in _SAFE and name[i + 1] in _SAFE:
            out.append("_")
        else:
            out.append(f"__x{ord(ch):x}_")
    return "".join(out)


def bounded(name: str) -> str:
    """`escape(name)`, cut to `MAX_NAME` bytes with a hash of the whole name where it is longer."""
    ident = escape(name)
    if len(ident) <= MAX_NAME:
        return ident
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{ident[: MAX_NAME - 20]}__h{digest}_"


def hashed(ident: str) -> bool:
    """An identifier `bounded` cut (its source name is in the table's properties)."""
    return _HASHED.search(ident) is not None


def unescape(ident: str) -> str:
    """The inverse of `escape`; raises LakeNameError for identifiers it never produces."""
    out, i = [], 0
    while i < len(ident):
        if ident.startswith("__", i):
            m = _ESCAPE.match(ident, i)
            if m is None:
                raise LakeNameError(f"{ident!r} is not an escaped source name (bad escape at {i})")
            code = int(m.group(1), 16)
            if code > 0x10FFFF:
                raise LakeNameError(f"{ident!r} is not an escaped source name (code point {code:#x})")
            out.append(chr(code))
            i = m.end()
        elif ident[i] in _SAFE or ident[i] == "_":
            out.append(ident[i])
            i += 1
        else:
            raise LakeNameError(f"{ident!r} is not an escaped source name ({ident[i]!r} at {i})")
    name = "".join(out)
    if escape(name) != ident:
        raise LakeNameError(f"{ident!r} is not an escaped source name")
    return name


def lake_column(name: str) -> str:
    """A source column's name in the lake."""
    return "_" + name if _RESERVED_COLUMN.match(name) else name


def source_column(name: str) -> str:
    """The inverse of `lake_column` (a bookkeeping column comes back as it is)."""
    return name[1:] if name.startswith("__") and _RESERVED_COLUMN.match(name) else name


def reserved_column(name: str) -> bool:
    """A source column that `lake_column` renames."""
    return _RESERVED_COLUMN.match(name) is not None


def quote(ident: str) -> str:
    """A Spark SQL identifier in backticks (backticks doubled)."""
    return "`" + ident.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    """A Spark SQL string literal of any text (hex, so no quoting rules apply)."""
    return f"CAST(X'{text.encode().hex()}' AS STRING)"


@dataclass(frozen=True)
class TableNames:
    """The lake identifiers of one source table in catalog `catalog`."""

    catalog: str
    db: str
    table: str

    @property
    def namespace(self) -> str:
        return bounded(self.db)

    @property
    def current_name(self) -> str:
        return bounded(self.table)

    @property
    def changelog_name(self) -> str:
        return bounded(self.table) + CHANGELOG_SUFFIX

    @property
    def live_name(self) -> str:
        return bounded(self.table) + LIVE_SUFFIX

    def sql(self, name: str) -> str:
        """`catalog`.`ns`.`name` for Spark SQL."""
        return ".".join(quote(p) for p in (self.catalog, self.namespace, name))

    @property
    def current(self) -> str:
        return self.sql(self.current_name)

    @property
    def changelog(self) -> str:
        return self.sql(self.changelog_name)

    @property
    def live(self) -> str:
        return self.sql(self.live_name)

    def path(self, warehouse: str, name: str) -> str:
        """A table's folder under a hadoop-catalog warehouse (for readers without a catalog)."""
        return f"{warehouse.rstrip('/')}/{self.namespace}/{name}"


def source_of(namespace: str, name: str) -> tuple[str, str, str] | None:
    """(db, table, kind) of a lake table (kind: current / changelog), None for other tables and
    for `hashed` names (see `tables.lake_source`)."""
    if namespace == BOOK_NAMESPACE:
        return None
    kind = "current"
    if name.endswith(CHANGELOG_SUFFIX):
        name, kind = name[: -len(CHANGELOG_SUFFIX)], "changelog"
    try:
        return unescape(namespace), unescape(name), kind
    except LakeNameError:
        return None

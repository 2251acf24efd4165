"""Pure: which tables a statement from a binlog QUERY event touches.

DDL travels on the subject of the table it alters so it stays ordered with that table's
rows (a partition exchange also on the other table's: it changes the rows of both). Only
the table names are parsed here, plus the lexing helpers (`tokens`, `split_top_level`,
`unquote`) that `alter` uses to describe the columns.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

_BACKTICK = r"`(?:[^`]|``)*`"
_STRING = r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\""
# Quoted tokens come first in the alternation so comment markers inside them are kept.
_QUOTED_OR_COMMENT = re.compile(rf"(?P<q>{_BACKTICK}|{_STRING})|/\*(?!!).*?\*/|--[ \t][^\n]*|#[^\n]*", re.DOTALL)
# One lexical token; a string may carry an introducer (_utf8mb4'x') or a X/B/N prefix.
_TOKEN = re.compile(
    rf"(?P<quoted>(?:[xXbBnN]|_[A-Za-z0-9]+)?(?:{_STRING})|{_BACKTICK})"
    r"|(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![\w$\u0080-\uffff]))"
    r"|(?P<word>[\w$\u0080-\uffff]+)|(?P<open>\()|(?P<close>\))|(?P<comma>,)|(?P<other>\S)",
    re.DOTALL,
)
_NAME = r"(?:`(?:[^`]|``)+`|[\w$\u0080-\uffff]+)"
_QNAME = rf"({_NAME}(?:\s*\.\s*{_NAME})?)"
_IF = r"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?"

_PATTERNS = [
    ("create", re.compile(rf"^CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\s+{_IF}{_QNAME}", re.I)),
    ("alter", re.compile(rf"^ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+{_IF}{_QNAME}", re.I)),
    ("truncate", re.compile(rf"^TRUNCATE\s+(?:TABLE\s+)?{_QNAME}", re.I)),
    ("index", re.compile(rf"^(?:CREATE|DROP)\s+(?:OR\s+REPLACE\s+)?(?:ONLINE\s+)?(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?"
                         rf"INDEX\s+{_IF}{_NAME}\s+(?:USING\s+\w+\s+)?ON\s+{_QNAME}", re.I)),
]
_DROP = re.compile(r"^DROP\s+(?:TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.*?)(?:\s+(?:RESTRICT|CASCADE))?\s*$",
                   re.I | re.S)
_RENAME = re.compile(r"^RENAME\s+TABLES?\s+(.*)$", re.I | re.S)
_ALTER_RENAME = re.compile(rf"^RENAME\s+(?:TO\s+|AS\s+|=\s*)?{_QNAME}\s*$", re.I)
_ALTER_RENAME_COLUMN = re.compile(r"^RENAME\s+(?:COLUMN|INDEX|KEY)\b", re.I)
# Partition specs that move rows between the altered table and another one.
_ALTER_PARTNER = re.compile(rf"^(?:EXCHANGE\s+PARTITION\s+{_NAME}\s+WITH\s+TABLE\s+{_QNAME}"
                            rf"|CONVERT\s+PARTITION\s+{_NAME}\s+TO\s+TABLE\s+{_QNAME}"
                            rf"|CONVERT\s+TABLE\s+{_QNAME}\s+TO\s+PARTITION\b)", re.I)
_DML = re.compile(r"^(?:INSERT|UPDATE|DELETE|REPLACE|LOAD\s+DATA|LOAD\s+XML)\b", re.I)
_TXN = re.compile(r"^(?:BEGIN|COMMIT|ROLLBACK|XA\s|SAVEPOINT|RELEASE\s+SAVEPOINT|ROLLBACK\s+TO)\b", re.I)


@dataclass(frozen=True)
class Statement:
    """A parsed QUERY event: its kind and the (db, table) pairs it touches, in order."""

    kind: str  # create / alter / drop / rename / truncate / index / other / dml / txn
    tables: tuple[tuple[str, str], ...]
    rest: str = field(default="", compare=False, repr=False)  # CREATE/ALTER: the text after the table name


def strip_comments(sql: str) -> str:
    return _QUOTED_OR_COMMENT.sub(lambda m: m["q"] or " ", sql).strip()


class Token(NamedTuple):
    """One top-level token; kind is quoted / num / word / group / comma / other."""

    kind: str
    text: str

    @property
    def word(self) -> str:
        """The upper-cased bare word, or "" for any other token."""
        return self.text.upper() if self.kind == "word" else ""


def _scan(text: str) -> Iterator[tuple[str, int, int]]:
    """Top-level tokens as (kind, start, end); a parenthesised group, nested to any depth, is one "group"."""
    depth = start = 0
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "other"
        if kind == "open":
            start = m.start() if depth == 0 else start
            depth += 1
        elif kind == "close" and depth:
            depth -= 1
            if depth == 0:
                yield "group", start, m.end()
        elif depth == 0:
            yield kind, m.start(), m.end()
    if depth:
        yield "group", start, len(text)


def tokens(text: str) -> list[Token]:
    """Top-level tokens: quoted names and strings (with any prefix), numbers, words, symbols, `(...)` groups."""
    return [Token(kind, text[start:end]) for kind, start, end in _scan(text)]


def split_top_level(text: str) -> list[str]:
    """Split on commas outside quotes and parentheses."""
    parts, pos = [], 0
    for kind, start, end in _scan(text):
        if kind == "comma":
            parts.append(text[pos:start])
            pos = end
    parts.append(text[pos:])
    return [p.strip() for p in parts if p.strip()]


def unquote(name: str) -> str:
    """A name as written (bare or in backticks) -> the name."""
    name = name.strip()
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def stored_name(name: str, lower_names: bool) -> str:
    """A database or table name as the server stores it and its TableMaps carry it.

    :param lower_names: the source runs with lower_case_table_names=1, which stores names in
        lower case however a statement (or `USE`) spells them
    """
    return name.lower() if lower_names else name


def _split_name(qname: str, default_db: str, lower_names: bool) -> tuple[str, str]:
    parts = re.findall(_NAME, qname)
    db, table = (unquote(parts[0]), unquote(parts[1])) if len(parts) == 2 else (default_db, unquote(parts[0]))
    return stored_name(db, lower_names), stored_name(table, lower_names)


def rename_target(spec: str, default_db: str, *, lower_names: bool = False) -> tuple[str, str] | None:
    """The new name an ALTER TABLE `RENAME [TO|AS] x` spec gives, else None (RENAME COLUMN/INDEX too)."""
    m = _ALTER_RENAME.match(spec)
    if m is None or _ALTER_RENAME_COLUMN.match(spec):
        return None
    # An unqualified new name resolves against the session's database.
    return _split_name(m.group(1), default_db, lower_names)


def partition_partner(spec: str, default_db: str, *, lower_names: bool = False) -> tuple[str, str] | None:
    """The other table of an ALTER TABLE spec that moves a partition's rows (EXCHANGE PARTITION ...
    WITH TABLE x, MariaDB's CONVERT PARTITION ... TO TABLE x and CONVERT TABLE x TO PARTITION), else None."""
    m = _ALTER_PARTNER.match(spec)
    if m is None:
        return None
    return _split_name(next(g for g in m.groups() if g), default_db, lower_names)


def _name_list(text: str) -> list[str]:
    return re.findall(_QNAME, text)


def parse(sql: str, default_db: str, *, lower_names: bool = False) -> Statement:
    """Classify a statement and name the tables it touches (`default_db` for unqualified names).

    :param lower_names: name them as a lower_case_table_names=1 server stores them (`stored_name`),
        so a DDL names its table the way that table's rows do
    """
    text = strip_comments(sql)
    if _TXN.match(text):
        return Statement("txn", ())
    if _DML.match(text):
        return Statement("dml", ())
    m = _DROP.match(text)
    if m:
        return Statement("drop", tuple(_split_name(n, default_db, lower_names) for n in _name_list(m.group(1))))
    m = _RENAME.match(text)
    if m:
        names: list[tuple[str, str]] = []
        for pair in split_top_level(m.group(1)):
            names.extend(_split_name(n, default_db, lower_names)
                         for n in re.findall(rf"{_QNAME}(?=\s+TO\s+|\s*$)", pair, re.I))
        return Statement("rename", tuple(names))
    for kind, pattern in _PATTERNS:
        m = pattern.match(text)
        if m:
            tables = [_split_name(m.group(1), default_db, lower_names)]
            rest = text[m.end():]
            if kind == "alter":
                for item in split_top_level(rest):
                    t = rename_target(item, default_db, lower_names=lower_names)
                    t = t or partition_partner(item, default_db, lower_names=lower_names)
                    if t:
                        tables.append(t)
            return Statement(kind, tuple(tables), rest if kind in ("create", "alter") else "")
    return Statement("other", ())

"""Pure: which tables a statement from a binlog QUERY event touches.

DDL travels on the subject of the table it alters so it stays ordered with that table's
rows. Only the table names are parsed here; the columns come from the next TableMap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Quoted tokens come first in the alternation so comment markers inside them are kept.
_QUOTED_OR_COMMENT = re.compile(
    r"(?P<q>`(?:[^`]|``)*`|'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\")"
    r"|/\*(?!!).*?\*/|--[ \t][^\n]*|#[^\n]*",
    re.DOTALL,
)
_TOP_LEVEL_COMMA = re.compile(r"(`(?:[^`]|``)*`|'(?:[^'\\]|\\.)*'|\((?:[^()]|\([^()]*\))*\))|,")
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
_DML = re.compile(r"^(?:INSERT|UPDATE|DELETE|REPLACE|LOAD\s+DATA|LOAD\s+XML)\b", re.I)
_TXN = re.compile(r"^(?:BEGIN|COMMIT|ROLLBACK|XA\s|SAVEPOINT|RELEASE\s+SAVEPOINT|ROLLBACK\s+TO)\b", re.I)


@dataclass(frozen=True)
class Statement:
    """A parsed QUERY event: its kind and the (db, table) pairs it touches, in order."""

    kind: str  # create / alter / drop / rename / truncate / index / other / dml / txn
    tables: tuple[tuple[str, str], ...]


def strip_comments(sql: str) -> str:
    return _QUOTED_OR_COMMENT.sub(lambda m: m["q"] or " ", sql).strip()


def split_top_level(text: str) -> list[str]:
    """Split on commas outside quotes and parentheses."""
    parts, current = [], []
    pos = 0
    for m in _TOP_LEVEL_COMMA.finditer(text):
        if m.group(1) is None:
            current.append(text[pos : m.start()])
            parts.append("".join(current))
            current = []
            pos = m.end()
    current.append(text[pos:])
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _unquote(name: str) -> str:
    name = name.strip()
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def _split_name(qname: str, default_db: str) -> tuple[str, str]:
    parts = re.findall(_NAME, qname)
    if len(parts) == 2:
        return _unquote(parts[0]), _unquote(parts[1])
    return default_db, _unquote(parts[0])


def _name_list(text: str) -> list[str]:
    return re.findall(_QNAME, text)


def parse(sql: str, default_db: str) -> Statement:
    """Classify a statement and name the tables it touches (`default_db` for unqualified names)."""
    text = strip_comments(sql)
    if _TXN.match(text):
        return Statement("txn", ())
    if _DML.match(text):
        return Statement("dml", ())
    m = _DROP.match(text)
    if m:
        return Statement("drop", tuple(_split_name(n, default_db) for n in _name_list(m.group(1))))
    m = _RENAME.match(text)
    if m:
        names: list[tuple[str, str]] = []
        for pair in split_top_level(m.group(1)):
            names.extend(_split_name(n, default_db) for n in re.findall(rf"{_QNAME}(?=\s+TO\s+|\s*$)", pair, re.I))
        return Statement("rename", tuple(names))
    for kind, pattern in _PATTERNS:
        m = pattern.match(text)
        if m:
            tables = [_split_name(m.group(1), default_db)]
            if kind == "alter":
                for item in split_top_level(text[m.end():]):
                    r = _ALTER_RENAME.match(item)
                    if r and not _ALTER_RENAME_COLUMN.match(item):
                        # An unqualified new name resolves against the session's database.
                        tables.append(_split_name(r.group(1), default_db))
            return Statement(kind, tuple(tables))
    return Statement("other", ())

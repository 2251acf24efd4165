"""Pure: mask credentials in a statement from a binlog QUERY event before anything sees it.

`CREATE USER u IDENTIFIED BY 'secret'` reaches the binlog as written (MariaDB) or with a
password hash (MySQL 8). Every QUERY event goes through `redact` once, where the binlog
reader receives it, so neither BINLAKE_RAW, BINLAKE_CDC, the schema history, the lake's
`_binlake_ddl` nor a log line ever holds the secret. Only the secret literals become `'***'`;
the rest of the statement stays, so operators still see who was created or altered.

The lexer follows MySQL's: strings in either quote with `''` / `\\'` escapes (no backslash
escapes under NO_BACKSLASH_ESCAPES), an introducer or X/B/N prefix, hex literals, comments
skipped, and the body of `/*! ... */` / `/*M! ... */` read as code (the server runs it). A
naive regex breaks on a quote inside a quoted password; a lexer that disagrees with the
server's leaks the next literal, hence the sql_mode.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

MASK = "'***'"
NO_BACKSLASH_ESCAPES = 1 << 20  # sql_mode bits, the same in MySQL and MariaDB
ANSI_QUOTES = 1 << 2

_SPACE = re.compile(r"\s+")
_EXEC_COMMENT = re.compile(r"/\*M?!\d*")
_COMMENT = re.compile(r"/\*.*?(?:\*/|\Z)|--(?=\s|\Z)[^\n]*|#[^\n]*", re.DOTALL)
_PREFIX = re.compile(r"(?:[xXbBnN]|_[A-Za-z0-9]+)(?=['\"])")
_HEX = re.compile(r"0x[0-9a-fA-F]+(?![\w$])|0b[01]+(?![\w$])")
_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_WORD = re.compile(r"[\w$\u0080-\uffff]+")

# Literals right after these words hold a secret in any statement.
_REPLICATION_PASSWORDS = frozenset({"MASTER_PASSWORD", "SOURCE_PASSWORD"})
_PASSWORD_FUNCTIONS = frozenset({"PASSWORD", "OLD_PASSWORD"})
# Inside an IDENTIFIED clause: BY 'x', BY PASSWORD 'hash', WITH p BY/AS 'x', VIA p USING 'x', REPLACE 'old'.
_IDENTIFIED_SECRET_AFTER = frozenset({"BY", "AS", "USING", "REPLACE"})


class _Token(NamedTuple):
    kind: str  # lit (a string or hex value) / name / num / word (upper-cased) / sym
    text: str
    start: int
    end: int


# Table options whose text may carry a remote server's credentials: FEDERATED / CONNECT /
# Spider `CONNECTION='mysql://user:secret@host/db/t'`, Spider's `COMMENT='... password "x"'`,
# CONNECT's `OPTION_LIST='user=u,password=x'` and `CONNECTION='DSN=d;UID=u;PWD=x'` (ODBC) or a JDBC URL.
_LINK_OPTIONS = frozenset({"CONNECTION", "COMMENT", "OPTION_LIST"})
_URL_SECRET = re.compile(r"(://[^:/@\s'\"]*:)([^@\s'\"]*)(@)")
_NAMES_PASSWORD = re.compile(r"password", re.IGNORECASE)
# A connection string: `password=` (JDBC, CONNECT's OPTION_LIST), `PWD=`, `Pass=`, `Db_Pwd=`
# (ODBC), `passwd`, and Oracle's `user/secret@host`.
_LINK_PASSWORD = re.compile(r"pass|pwd|[^\s/:@'\"]/[^\s/@'\"]+@", re.IGNORECASE)
_SPIDER_PASSWORD = re.compile(r"\bpassword\s+(?:\"|''|\\')", re.IGNORECASE)  # inside a literal

# Every form a secret comes in names one of these words (IDENTIFIED ..., PASSWORD(...),
# SET PASSWORD, *_PASSWORD, OPTIONS (PASSWORD ...), CONNECTION='scheme://user:secret@...').
_MAY_HOLD_SECRET = re.compile(r"identified|pass|connection|pwd", re.IGNORECASE)


def redact(sql: str, sql_mode: int = 0) -> str:
    """`sql` with every secret literal replaced by `'***'`; anything else is returned unchanged.

    :param sql_mode: the QUERY event's sql_mode, which decides how quotes are read.
    """
    if not _MAY_HOLD_SECRET.search(sql):  # every BEGIN and most DDL: no lexing on the hot path
        return sql
    tokens = list(_lex(sql, backslash=not sql_mode & NO_BACKSLASH_ESCAPES, ansi_quotes=bool(sql_mode & ANSI_QUOTES)))
    secrets = [(tok, MASK) for tok in _secrets(tokens)] + _link_secrets(tokens)
    if not secrets:
        return sql
    out: list[str] = []
    pos = 0
    for tok, masked in sorted(secrets, key=lambda x: x[0].start):
        if tok.start < pos:
            continue  # already masked whole
        out += [sql[pos:tok.start], masked]
        pos = tok.end
    out.append(sql[pos:])
    return "".join(out)


def _lex(sql: str, *, backslash: bool, ansi_quotes: bool) -> Iterator[_Token]:
    """Significant tokens; whitespace and comments are skipped, executable comments read as code."""
    pos, n, in_exec = 0, len(sql), False
    while pos < n:
        if m := _SPACE.match(sql, pos):
            pos = m.end()
            continue
        if in_exec and sql.startswith("*/", pos):
            pos, in_exec = pos + 2, False
            continue
        if not in_exec and (m := _EXEC_COMMENT.match(sql, pos)):
            pos, in_exec = m.end(), True
            continue
        if m := _COMMENT.match(sql, pos):
            pos = m.end()
            continue
        start = pos
        if m := _PREFIX.match(sql, pos):
            pos = m.end()
        quote = sql[pos]
        if quote in "'\"`":
            # Backslash escapes apply in strings; under ANSI_QUOTES "..." is a name, read like `...`.
            is_name = quote == "`" or (quote == '"' and ansi_quotes)
            end = _quoted_end(sql, pos, backslash=backslash and not is_name)
            yield _Token("name" if is_name else "lit", sql[start:end], start, end)
            pos = end
        elif m := _HEX.match(sql, pos):
            yield _Token("lit", m.group(), start, m.end())
            pos = m.end()
        elif m := _NUMBER.match(sql, pos):
            yield _Token("num", m.group(), start, m.end())
            pos = m.end()
        elif m := _WORD.match(sql, pos):
            yield _Token("word", m.group().upper(), start, m.end())
            pos = m.end()
        else:
            yield _Token("sym", quote, start, pos + 1)
            pos += 1


def _quoted_end(sql: str, pos: int, *, backslash: bool) -> int:
    """The end of the quoted token opening at `pos`; an unterminated one runs to the end."""
    quote, i, n = sql[pos], pos + 1, len(sql)
    while i < n:
        c = sql[i]
        if c == "\\" and backslash:
            i += 2
        elif c == quote:
            if i + 1 < n and sql[i + 1] == quote:
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return n


def _link_secrets(tokens: list[_Token]) -> list[tuple[_Token, str]]:
    """Credentials inside a CONNECTION / COMMENT / OPTION_LIST option, with what replaces them.

    A URL keeps everything but its password (`mysql://u:***@host/db/t`); any other such table
    option that names a password is masked whole. Inside parentheses (a column's or a Spider
    partition's COMMENT) only a Spider parameter (`password "x"`) counts.
    """
    out: list[tuple[_Token, str]] = []
    depth = 0
    for i, tok in enumerate(tokens):
        if tok.kind == "sym":
            depth += {"(": 1, ")": -1}.get(tok.text, 0)
            continue
        if tok.kind != "lit" or i == 0:
            continue
        p1, p2 = tokens[i - 1], tokens[i - 2] if i >= 2 else None
        named = p1 if p1.kind == "word" else p2 if (p1.text == "=" and p2 is not None and p2.kind == "word") else None
        if named is None or named.text not in _LINK_OPTIONS:
            continue
        text = _URL_SECRET.sub(r"\1***\3", tok.text) if named.text == "CONNECTION" else tok.text
        names = _NAMES_PASSWORD if named.text == "COMMENT" else _LINK_PASSWORD
        if (_SPIDER_PASSWORD if depth > 0 else names).search(text):
            out.append((tok, MASK))
        elif text != tok.text:
            out.append((tok, text))
    return out


def _secrets(tokens: list[_Token]) -> list[_Token]:
    """The literal tokens that hold a password, hash or server secret, in order."""
    words = [t.text if t.kind in ("word", "sym") else "" for t in tokens]
    set_password = words[:2] == ["SET", "PASSWORD"]  # SET PASSWORD [FOR u] = 'x' | PASSWORD('x')
    start_replica = words[:1] == ["START"]  # START REPLICA|SLAVE ... PASSWORD = 'x'
    out: list[_Token] = []
    depth = 0
    identified = False  # inside a user's IDENTIFIED clause (until the next top-level comma)
    options: int | None = None  # depth inside CREATE/ALTER SERVER ... OPTIONS (...)
    function: int | None = None  # depth inside PASSWORD(...) / OLD_PASSWORD(...)
    for i, tok in enumerate(tokens):
        p1, p2 = (words[i - 1] if i >= 1 else ""), (words[i - 2] if i >= 2 else "")
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if tok.kind == "sym":
            if tok.text == "(":
                depth += 1
                if p1 in _PASSWORD_FUNCTIONS and function is None:
                    function = depth
                elif p1 == "OPTIONS" and options is None:
                    options = depth
            elif tok.text == ")":
                function = None if function == depth else function
                options = None if options == depth else options
                depth = max(depth - 1, 0)
            elif tok.text in ",;" and depth == 0:
                identified = False
            if tok.text == ";":
                set_password = start_replica = False
            continue
        if tok.kind == "word":
            # A column named `identified` must not open the clause: require IDENTIFIED BY/WITH/VIA.
            if tok.text == "IDENTIFIED" and nxt in ("BY", "WITH", "VIA"):
                identified = True
            continue
        if tok.kind != "lit":
            continue
        secret = (
            function is not None
            or (out and out[-1] is tokens[i - 1])  # 'a' 'b' is one string: the rest of a secret
            or p1 in _REPLICATION_PASSWORDS or (p1 == "=" and p2 in _REPLICATION_PASSWORDS)
            or (identified and (p1 in _IDENTIFIED_SECRET_AFTER or (p1 == "PASSWORD" and p2 == "BY")))
            or (set_password and p1 in ("=", "REPLACE"))
            or (options is not None and p1 == "PASSWORD")
            or (start_replica and p1 == "=" and p2 == "PASSWORD")
        )
        if secret:
            out.append(tok)
    return out

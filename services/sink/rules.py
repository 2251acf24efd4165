"""Pure: which events a sink forwards, and how it reshapes them (filters, columns, masks).

Table filters follow Canal: comma-separated regular expressions that must match the whole
`db.table` (`filter.regex` = include, `black.regex` = exclude). Column rules and masks are
keyed by `db.table` globs (`shop.*`). Names match the way the source compares them, so a
rule written the way the source's SQL spells a name never misses it in the binlog:

- columns always case-insensitively (as in MySQL): a mask for `Email` masks `email`;
- databases and tables (filter regexes and glob keys alike) per the source's
  `lower_case_table_names`: 0 compares them case-sensitively (`Shop.Orders` and `shop.orders`
  are two tables); 1 (stored in lower case) and 2 (stored as given, compared in lower case)
  case-insensitively, so `Shop.Orders` matches the binlog's `shop.orders`.

Primary-key columns are never dropped, so every row stays addressable downstream. A masked
value never leaves this module in clear text.

DDL envelopes get the same column rules, in the structured `alter` description the loader
creates and alters lake tables from (`services/parser/alter.py` `describe`): a column the
rules drop is not in a CREATE TABLE's `columns`, and no op brings it in (`_reshape_op`); a
masked column keeps its name and gets the type the rows' schema gives it, and the value an
ADD or MODIFY gives existing rows (`default`) is masked as a row's value is. The statement
text (`ddl`) travels as the source wrote it, and the lake keeps it in the changelog's
`_binlake_ddl`: it is the record of what the source ran, and it names the columns the rules
drop and carries DEFAULT literals. The rules protect the values of rows, not a table's
column names; redacting the text would mean rewriting SQL into a statement the source never
ran. Keep secrets out of column names and DEFAULTs.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.envelope import REPLACE, ROW_OPS
from shared.errors import ConfigError
from shared.mysql_types import BINARIES, TEXTS

# Types whose values stay of the same kind when truncated (strings or bytes).
_TRUNCATABLE = frozenset({*TEXTS, *BINARIES})
MASK_METHODS = ("hash", "truncate", "replace")
# The values of MySQL's and MariaDB's `lower_case_table_names`; only 0 compares names by case.
LOWER_CASE_TABLE_NAMES = (0, 1, 2)


@dataclass(frozen=True)
class Mask:
    method: str
    arg: str = ""

    @classmethod
    def parse(cls, spec: str, where: str) -> Mask:
        method, _, arg = spec.partition(":")
        if method == "hash" and arg:
            raise ConfigError(f"mask {where} = {spec!r}: hash takes no argument (it is salted sha256)")
        if method not in MASK_METHODS:
            raise ConfigError(f"mask {where} = {spec!r}: method must be one of {', '.join(MASK_METHODS)}")
        if method == "truncate" and not arg.isdigit():
            raise ConfigError(f"mask {where} = {spec!r}: truncate needs a length, e.g. 'truncate:4'")
        return cls(method, arg)

    def apply(self, value: Any, salt: bytes) -> Any:
        if value is None:
            return None
        if self.method == "replace":
            return self.arg
        if self.method == "truncate":
            n = int(self.arg)
            return value[:n] if isinstance(value, (str, bytes)) else str(value)[:n]
        raw = value if isinstance(value, bytes) else str(value).encode()
        return hashlib.sha256(salt + raw).hexdigest()


@dataclass(frozen=True)
class TableRules:
    """What happens to the rows of one table (column names casefolded)."""

    include: frozenset[str] | None = None
    exclude: frozenset[str] = frozenset()
    masks: Mapping[str, Mask] = field(default_factory=dict)

    @property
    def rewrites(self) -> bool:
        return self.include is not None or bool(self.exclude) or bool(self.masks)

    def keeps(self, name: str) -> bool:
        """Whether the column rules keep `name` (key columns are kept whatever this says)."""
        folded = name.casefold()
        return (self.include is None or folded in self.include) and folded not in self.exclude

    def missing(self, columns: Iterable[str]) -> list[str]:
        """Columns the rules name that the table does not have (a typo would silently mask nothing)."""
        have = {c.casefold() for c in columns}
        named = set(self.include or ()) | set(self.exclude) | set(self.masks)
        return sorted(named - have)


def _patterns(items: Iterable[str], what: str, ignore_case: bool) -> tuple[re.Pattern[str], ...]:
    out = []
    flags = re.IGNORECASE if ignore_case else 0
    for item in items:
        for part in (p.strip() for p in item.split(",")):
            if not part:
                continue
            try:
                out.append(re.compile(part, flags))
            except re.error as exc:
                raise ConfigError(f"{what} regex {part!r} is invalid: {exc}") from None
    return tuple(out)


@dataclass(frozen=True)
class Rules:
    include: tuple[re.Pattern[str], ...] = ()
    exclude: tuple[re.Pattern[str], ...] = ()
    skip_ops: frozenset[str] = frozenset()
    columns_include: Mapping[str, frozenset[str]] = field(default_factory=dict)
    columns_exclude: Mapping[str, frozenset[str]] = field(default_factory=dict)
    masks: Mapping[str, Mapping[str, Mask]] = field(default_factory=dict)
    salt: bytes = b""
    tables_ignore_case: bool = True  # `lower_case_table_names` 1 or 2 (`build` compiles the regexes to agree)

    @classmethod
    def build(cls, *, include: Sequence[str] = (), exclude: Sequence[str] = (), skip_ops: Sequence[str] = (),
              columns_include: Mapping[str, Sequence[str]] | None = None,
              columns_exclude: Mapping[str, Sequence[str]] | None = None,
              masks: Mapping[str, Mapping[str, str]] | None = None, salt: str = "",
              lower_case_table_names: int = 1) -> Rules:
        """Validate configuration values and build the rules; raises ConfigError naming the bad value.

        :param lower_case_table_names: the source's setting of that name (0, 1 or 2): how database
            and table names compare.
        """
        if isinstance(lower_case_table_names, bool) or lower_case_table_names not in LOWER_CASE_TABLE_NAMES:
            raise ConfigError(f"BINLAKE_LOWER_CASE_TABLE_NAMES must be 0, 1 or 2 (the source's "
                              f"@@lower_case_table_names), got {lower_case_table_names!r}")
        ignore_case = lower_case_table_names != 0
        columns_include = _column_lists(columns_include, "columns_include")
        columns_exclude = _column_lists(columns_exclude, "columns_exclude")
        masks = _mask_specs(masks)
        bad_ops = set(skip_ops) - ROW_OPS
        if bad_ops:
            raise ConfigError(f"skip_ops may only name row operations {sorted(ROW_OPS)}, got {sorted(bad_ops)}")
        parsed_masks = {
            table: {col: Mask.parse(spec, f"{table}.{col}") for col, spec in cols.items()}
            for table, cols in (masks or {}).items()
        }
        if parsed_masks and not salt:
            raise ConfigError("masks are configured but mask_salt is empty; set BINLAKE_MASK_SALT to a secret")
        return cls(
            include=_patterns(include, "include", ignore_case), exclude=_patterns(exclude, "exclude", ignore_case),
            skip_ops=frozenset(skip_ops),
            columns_include={t: frozenset(x.casefold() for x in c) for t, c in (columns_include or {}).items()},
            columns_exclude={t: frozenset(x.casefold() for x in c) for t, c in (columns_exclude or {}).items()},
            masks={t: {c.casefold(): m for c, m in cols.items()} for t, cols in parsed_masks.items()},
            salt=salt.encode(), tables_ignore_case=ignore_case,
        )

    def table_allowed(self, db: str, table: str) -> bool:
        name = f"{db}.{table}"
        if self.include and not any(p.fullmatch(name) for p in self.include):
            return False
        return not any(p.fullmatch(name) for p in self.exclude)

    def for_table(self, db: str, table: str) -> TableRules:
        name = f"{db}.{table}"
        include: set[str] | None = None
        for pattern, cols in self.columns_include.items():
            if self._glob_matches(name, pattern):
                include = (include or set()) | cols
        exclude: set[str] = set()
        for pattern, cols in self.columns_exclude.items():
            if self._glob_matches(name, pattern):
                exclude |= cols
        masks: dict[str, Mask] = {}
        for pattern, table_masks in self.masks.items():
            if self._glob_matches(name, pattern):
                masks.update(table_masks)
        return TableRules(frozenset(include) if include is not None else None, frozenset(exclude), masks)

    def _glob_matches(self, name: str, pattern: str) -> bool:
        # Both sides folded: the keys keep their spelling, so `Shop.*` and `shop.*` still both apply.
        if self.tables_ignore_case:
            return fnmatch.fnmatchcase(name.casefold(), pattern.casefold())
        return fnmatch.fnmatchcase(name, pattern)

    def apply(self, env: dict[str, Any], table_rules: TableRules) -> dict[str, Any] | None:
        """The event to forward (reshaped when the table has column rules or masks), or None."""
        op = env["op"]
        if op in self.skip_ops:
            return None
        if not table_rules.rewrites:
            return env
        if op == "ddl":
            return _reshape_ddl(env, table_rules, self.salt)
        if op not in ROW_OPS and op != REPLACE:  # a keyless snapshot's `replace` carries the table's schema
            return env
        pk = set(env.get("pk") or ())
        keep = _kept_columns(env, table_rules, pk)
        masks = table_rules.masks
        out = dict(env)
        if "rows" in env:
            out["rows"] = [{image: _reshape(values, keep, masks, self.salt) for image, values in row.items()}
                           for row in env["rows"]]
        if "schema" in env:
            out["schema"] = _reshape_schema(env["schema"], keep, masks)
        return out


def _column_lists(value: Mapping[str, Sequence[str]] | None, what: str) -> dict[str, list[str]]:
    """Check `{"db.table": ["col", ...]}`; a lone string is one column, not its letters."""
    out: dict[str, list[str]] = {}
    for table, cols in (value or {}).items():
        if isinstance(cols, str):
            cols = [cols]
        if not isinstance(cols, (list, tuple)) or not all(isinstance(c, str) for c in cols):
            raise ConfigError(f"{what}[{table!r}] must be a list of column names, got {cols!r}")
        out[str(table)] = list(cols)
    return out


def _mask_specs(value: Mapping[str, Mapping[str, str]] | None) -> dict[str, dict[str, str]]:
    """Check `{"db.table": {"col": "hash" | "truncate:N" | "replace:TEXT"}}`."""
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(f"masks must map db.table to {{column: method}}, got {value!r}")
    out: dict[str, dict[str, str]] = {}
    for table, cols in (value or {}).items():
        if not isinstance(cols, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in cols.items()):
            raise ConfigError(f"masks[{table!r}] must map column names to methods like 'hash', got {cols!r}")
        out[str(table)] = dict(cols)
    return out


def _kept_columns(env: dict[str, Any], rules: TableRules, pk: set[str]) -> frozenset[str] | None:
    if rules.include is None and not rules.exclude:
        return None
    names = [c["name"] for c in env.get("schema", {}).get("columns", [])]
    if not names and env["rows"]:
        first = env["rows"][0]
        names = list((first.get("after") or first.get("before") or {}).keys())
    return frozenset({n for n in names if rules.keeps(n)} | pk)


def _reshape(values: dict[str, Any], keep: frozenset[str] | None, masks: Mapping[str, Mask],
             salt: bytes) -> dict[str, Any]:
    out = {}
    for name, value in values.items():
        if keep is not None and name not in keep:
            continue
        mask = masks.get(name.casefold())
        out[name] = mask.apply(value, salt) if mask is not None else value
    return out


def _reshape_column(col: dict[str, Any], mask: Mask | None) -> dict[str, Any]:
    """A column description as its masked values make it: a string, unless truncated and already one."""
    if mask is None or "type" not in col:  # not masked, or a type binlake cannot map (`unknown`)
        return col
    col = {**col, "masked": mask.method}
    if mask.method != "truncate" or col["type"] not in _TRUNCATABLE:
        col = {k: v for k, v in col.items() if k not in ("precision", "scale", "fsp", "unsigned", "values")}
        col["type"] = "varchar"
    return col


def _reshape_schema(schema: dict[str, Any], keep: frozenset[str] | None, masks: Mapping[str, Mask]) -> dict[str, Any]:
    columns = [_reshape_column(col, masks.get(col["name"].casefold())) for col in schema.get("columns", [])
               if keep is None or col["name"] in keep]
    # A reshaped table has a schema of its own, so it gets an id of its own.
    sid = hashlib.blake2b(repr(columns).encode(), digest_size=8).hexdigest()
    return {**schema, "columns": columns, "id": sid}


@dataclass(frozen=True)
class _DdlRules:
    """The column rules as one DDL statement sees them."""

    rules: TableRules
    key: frozenset[str]  # casefolded: the primary key columns the statement names
    salt: bytes

    def keeps(self, name: str) -> bool:
        return name.casefold() in self.key or self.rules.keeps(name)

    def column(self, col: dict[str, Any]) -> dict[str, Any]:
        return _reshape_column(col, self.rules.masks.get(str(col["name"]).casefold()))


def _reshape_ddl(env: dict[str, Any], rules: TableRules, salt: bytes) -> dict[str, Any]:
    """A DDL envelope whose `alter` adds no column the rules drop, with masked columns as the rows have them.

    The key columns are those the statement names (CREATE TABLE's key, ADD PRIMARY KEY): the
    sink keeps no state between messages, so a key from an earlier statement is not known here.
    """
    alter = env.get("alter")
    if not isinstance(alter, dict):
        return env  # no structured description: the loader applies nothing of it
    ops = list(alter.get("ops") or [])
    key = [*(alter.get("pk") or []), *(c for op in ops if op.get("op") == "primary_key" for c in op["columns"])]
    ddl = _DdlRules(rules, frozenset(str(c).casefold() for c in key), salt)
    shaped = dict(alter)
    if alter.get("columns") is not None:
        shaped["columns"] = [ddl.column(c) for c in alter["columns"] if ddl.keeps(str(c["name"]))]
    if ops:
        shaped["ops"] = [out for op in ops for out in _reshape_op(op, ddl)]
    return env if shaped == alter else {**env, "alter": shaped}


def _reshape_op(op: dict[str, Any], ddl: _DdlRules) -> list[dict[str, Any]]:
    """One `alter` op under the column rules: none brings a column the rules drop into the lake.

    An op that only moves or removes a column stays, because the lake may hold a column the
    rules drop: a key column (rows always carry the key), or one loaded before the rule. For a
    column the lake lacks it does nothing. So a DROP stays; a RENAME or CHANGE of a kept column
    to a dropped name becomes the DROP of the old name; one between two dropped names stays a
    rename; ADD and MODIFY of a dropped column go (a key column's new type comes with its rows).
    """
    kind = op.get("op")
    if kind not in ("add", "modify", "rename"):
        return [op]  # drop, (drop_)primary_key, rename_table
    new = str(op["new"] if kind == "rename" else (op["column"]["name"] if "column" in op else op["name"]))
    if not ddl.keeps(new):
        old = str(op.get("old", new))
        if kind == "add" or old.casefold() == new.casefold():
            return []
        return [{"op": "drop", "name": old} if ddl.keeps(old) else {"op": "rename", "old": old, "new": new}]
    if kind == "rename":
        return [op]
    out = dict(op)
    if "column" in op:
        out["column"] = ddl.column(op["column"])
    mask = ddl.rules.masks.get(new.casefold())
    if mask is not None and "default" in op:
        out["default"] = mask.apply(op["default"], ddl.salt)  # what existing rows get: masked like theirs
    if "after" in op and not ddl.keeps(str(op["after"])):
        del out["after"]  # after a column the lake does not have: at the end
    return [out]

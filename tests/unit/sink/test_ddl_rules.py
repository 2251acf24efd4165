"""services.sink.rules on DDL envelopes: the column rules reach the `alter` the loader builds lake tables from."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest

from services.loader.frames import Ddl, Rows, group
from services.loader.tables import ReservedColumn, data_types
from services.parser.alter import describe
from services.sink.rules import Rules

SALT = "pepper"
CREATE = ("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20), secret VARCHAR(40), n INT UNSIGNED NOT NULL, "
          "email VARCHAR(60), _binlake_x INT)")


def ddl_env(sql: str, table: str = "t") -> dict[str, Any]:
    """A DDL envelope as the parser publishes it (`alter` from the parser's own `describe`)."""
    return {"v": 1, "source": "main", "db": "shop", "table": table, "op": "ddl", "ts": 1, "scn": 42, "chunk": 0,
            "pos": {"file": "mysql-bin.000001", "offset": 4, "gtid": None},
            "txn": {"id": "mysql-bin.000001:4", "i": 0, "last": True}, "ddl": sql, "alter": describe(sql, "shop")}


def rules(**kw: Any) -> Rules:
    kw.setdefault("columns_exclude", {"shop.t": ["secret", "_binlake_x"]})
    return Rules.build(salt=SALT, **kw)


def shaped(r: Rules, env: dict[str, Any]) -> dict[str, Any]:
    out = r.apply(env, r.for_table(str(env["db"]), str(env["table"])))
    assert out is not None
    return out


def names(columns: list[dict[str, Any]]) -> list[str]:
    return [str(c["name"]) for c in columns]


def ops(env: dict[str, Any]) -> list[dict[str, Any]]:
    return list(env["alter"]["ops"])


# --- CREATE TABLE --------------------------------------------------------------------------------


def test_create_table_loses_the_excluded_columns_and_keeps_its_text():
    env = ddl_env(CREATE)
    before = copy.deepcopy(env)
    out = shaped(rules(), env)
    assert names(out["alter"]["columns"]) == ["id", "v", "n", "email"]
    assert out["alter"]["pk"] == ["id"]
    assert out["ddl"] == CREATE  # the statement as the source ran it (documented in rules.py)
    assert {k: v for k, v in out.items() if k != "alter"} == {k: v for k, v in env.items() if k != "alter"}
    assert env == before, "the input envelope is not changed"


def test_a_reserved_column_the_loader_refuses_loads_once_excluded():
    columns = describe(CREATE, "shop")["columns"]
    assert columns is not None
    with pytest.raises(ReservedColumn, match="_binlake_x"):
        data_types(columns)
    assert "_binlake_x" not in data_types(shaped(rules(), ddl_env(CREATE))["alter"]["columns"])


def test_create_table_keeps_only_included_columns_and_the_key():
    out = shaped(rules(columns_include={"shop.t": ["v", "EMAIL"]}, columns_exclude={}), ddl_env(CREATE))
    assert names(out["alter"]["columns"]) == ["id", "v", "email"]


def test_create_table_keeps_an_excluded_key_column():
    sql = "CREATE TABLE t (tenant INT, secret INT, v INT, PRIMARY KEY (tenant, SECRET))"
    out = shaped(rules(columns_exclude={"shop.t": ["secret", "v"]}), ddl_env(sql))
    assert names(out["alter"]["columns"]) == ["tenant", "secret"]
    assert out["alter"]["pk"] == ["tenant", "SECRET"]


def test_column_names_match_case_insensitively():
    out = shaped(rules(columns_exclude={"shop.t": ["SECRET"]}),
                 ddl_env("CREATE TABLE t (id INT PRIMARY KEY, Secret INT)"))
    assert names(out["alter"]["columns"]) == ["id"]


def test_masked_columns_keep_their_name_and_take_the_type_of_masked_rows():
    r = rules(masks={"shop.t": {"n": "replace:x", "email": "truncate:3", "v": "hash"}})
    cols = {c["name"]: c for c in shaped(r, ddl_env(CREATE))["alter"]["columns"]}
    assert cols["n"] == {"name": "n", "type": "varchar", "nullable": False, "masked": "replace"}  # no longer INT
    assert cols["email"]["type"] == "varchar" and cols["email"]["masked"] == "truncate"
    assert cols["v"]["type"] == "varchar" and cols["v"]["masked"] == "hash"
    assert "masked" not in cols["id"]


@pytest.mark.parametrize("masks", [{}, {"n": "replace:x"}, {"n": "hash", "email": "truncate:2"}])
@pytest.mark.parametrize("exclude", [[], ["secret", "_binlake_x"], ["id", "email", "_binlake_x"]])
def test_the_lake_gets_the_same_columns_from_the_create_and_from_the_rows(masks, exclude):
    """What the loader makes of a reshaped CREATE TABLE equals what it makes of the reshaped rows' schema."""
    r = Rules.build(columns_exclude={"shop.t": exclude}, masks={"shop.t": masks} if masks else None, salt=SALT)
    ddl = shaped(r, ddl_env(CREATE))
    row_env = {**{k: v for k, v in ddl_env(CREATE).items() if k not in ("ddl", "alter")}, "op": "i", "pk": ["id"],
               "rows": [{"after": {"id": 1, "v": "a", "secret": "s", "n": 5, "email": "e@x", "_binlake_x": 0}}],
               "schema": {"id": "raw", "columns": describe(CREATE, "shop")["columns"]}}
    row = shaped(r, row_env)
    steps = group([(1, ddl), (2, row)])[("shop", "t")].steps
    assert isinstance(steps[0], Ddl) and isinstance(steps[1], Rows)
    from_ddl, from_rows = steps[0].alter["columns"], steps[1].columns
    if "_binlake_x" in exclude:
        assert data_types(from_ddl) == data_types(from_rows)
    assert from_ddl == from_rows


# --- ALTER TABLE ---------------------------------------------------------------------------------


def test_add_of_an_excluded_column_is_left_out():
    out = shaped(rules(), ddl_env("ALTER TABLE t ADD COLUMN secret VARCHAR(40) DEFAULT 'clear-default'"))
    assert ops(out) == []  # a no-op for the lake; the statement still travels (the changelog records it)
    assert out["alter"]["kind"] == "alter"
    assert "clear-default" in out["ddl"]


def test_an_alter_keeps_its_ops_on_kept_columns_and_drops_a_position_after_an_excluded_one():
    sql = ("ALTER TABLE t ADD COLUMN a INT AFTER secret, ADD COLUMN secret2 INT, ADD COLUMN b INT AFTER v, "
           "ADD COLUMN _binlake_x INT FIRST")
    out = shaped(rules(columns_exclude={"shop.t": ["secret", "secret2", "_binlake_x"]}), ddl_env(sql))
    assert ops(out) == [{"op": "add", "column": {"name": "a", "type": "int", "nullable": True}, "default": None},
                        {"op": "add", "column": {"name": "b", "type": "int", "nullable": True}, "default": None,
                         "after": "v"}]


def test_add_of_a_column_the_include_list_lacks_is_left_out():
    out = shaped(rules(columns_include={"shop.t": ["v"]}, columns_exclude={}),
                 ddl_env("ALTER TABLE t ADD COLUMN w INT, ADD COLUMN V2 INT, MODIFY v VARCHAR(99)"))
    assert [o["op"] for o in ops(out)] == ["modify"]


def test_a_column_the_statement_makes_the_key_is_kept():
    out = shaped(rules(), ddl_env("ALTER TABLE t ADD COLUMN secret INT NOT NULL, ADD PRIMARY KEY (secret)"))
    assert [o["op"] for o in ops(out)] == ["add", "primary_key"]


@pytest.mark.parametrize(("sql", "expected"), [
    # MODIFY of an excluded column: nothing for the lake
    ("ALTER TABLE t MODIFY secret TEXT", []),
    ("ALTER TABLE t CHANGE secret SECRET TEXT", []),
    # a kept column renamed to an excluded name leaves the kept columns: the lake drops it
    ("ALTER TABLE t RENAME COLUMN v TO secret", [{"op": "drop", "name": "v"}]),
    ("ALTER TABLE t CHANGE v secret TEXT", [{"op": "drop", "name": "v"}]),
    # between two excluded names: a rename, which does nothing to a lake without the column
    ("ALTER TABLE t RENAME COLUMN secret TO _binlake_x", [{"op": "rename", "old": "secret", "new": "_binlake_x"}]),
    ("ALTER TABLE t CHANGE secret _binlake_x INT", [{"op": "rename", "old": "secret", "new": "_binlake_x"}]),
    # a DROP stays (the lake may hold the column: loaded before the rule, or a key column)
    ("ALTER TABLE t DROP COLUMN secret", [{"op": "drop", "name": "secret"}]),
    # an excluded column renamed to a kept name: the column comes into the lake as the rows would bring it
    ("ALTER TABLE t RENAME COLUMN secret TO public", [{"op": "rename", "old": "secret", "new": "public"}]),
    ("ALTER TABLE t CHANGE secret public INT",
     [{"op": "modify", "old": "secret", "column": {"name": "public", "type": "int", "nullable": True},
       "default": None}]),
])
def test_renames_modifies_and_drops_of_excluded_columns(sql, expected):
    assert ops(shaped(rules(), ddl_env(sql))) == expected


def test_a_type_binlake_cannot_map_follows_the_rules_by_name():
    out = shaped(rules(masks={"shop.t": {"u": "hash"}}), ddl_env("ALTER TABLE t ADD COLUMN secret UUID, ADD u UUID"))
    assert ops(out) == [{"op": "add", "unknown": "UUID", "name": "u"}]


# --- masks in ALTER TABLE ------------------------------------------------------------------------


def test_an_added_masked_column_has_the_masked_type_and_default():
    r = rules(masks={"shop.t": {"n2": "replace:x", "h": "hash", "c": "truncate:3"}})
    out = shaped(r, ddl_env("ALTER TABLE t ADD COLUMN n2 INT NOT NULL DEFAULT 7, "
                            "ADD COLUMN h VARCHAR(40) DEFAULT 'clear-default', "
                            "ADD COLUMN c VARCHAR(9) DEFAULT 'abcdef', ADD COLUMN e VARCHAR(9) DEFAULT 'kept'"))
    by_name = {o["column"]["name"]: o for o in ops(out)}
    assert by_name["n2"]["column"] == {"name": "n2", "type": "varchar", "nullable": False, "masked": "replace"}
    assert by_name["n2"]["default"] == "x"
    assert by_name["h"]["default"] == hashlib.sha256(b"pepperclear-default").hexdigest()
    assert by_name["c"]["default"] == "abc" and by_name["c"]["column"]["type"] == "varchar"
    assert by_name["e"]["default"] == "kept" and "masked" not in by_name["e"]["column"]


def test_a_masked_default_equals_the_masked_value_of_a_row_holding_it():
    """Existing rows get the ADD's default in the lake; rows changed later arrive masked: the two agree."""
    r = rules(masks={"shop.t": {"n2": "hash"}})
    default = ops(shaped(r, ddl_env("ALTER TABLE t ADD COLUMN n2 INT NOT NULL DEFAULT 7")))[0]["default"]
    row_env = {**{k: v for k, v in ddl_env("x").items() if k not in ("ddl", "alter")}, "op": "i", "pk": ["id"],
               "rows": [{"after": {"id": 1, "n2": 7}}],
               "schema": {"id": "s", "columns": [{"name": "id", "type": "int", "nullable": False},
                                                 {"name": "n2", "type": "int", "nullable": False}]}}
    assert shaped(r, row_env)["rows"][0]["after"]["n2"] == default


def test_modify_of_a_masked_column_keeps_the_masked_type():
    r = rules(masks={"shop.t": {"n": "replace:x"}})
    [op] = ops(shaped(r, ddl_env("ALTER TABLE t MODIFY n BIGINT NOT NULL DEFAULT 3")))
    assert op["column"] == {"name": "n", "type": "varchar", "nullable": False, "masked": "replace"}
    assert op["default"] == "x"


# --- unchanged DDL stays the same object (its original bytes) -----------------------------------


@pytest.mark.parametrize("sql", [
    "ALTER TABLE t ADD COLUMN w INT, DROP COLUMN v",
    "ALTER TABLE t ADD INDEX (v)",
    "TRUNCATE TABLE t",
    "DROP TABLE t",
    "RENAME TABLE t TO t2",
    "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
    "CREATE TABLE t LIKE u",
])
def test_ddl_the_rules_do_not_touch_is_forwarded_as_is(sql):
    env = ddl_env(sql)
    r = rules()
    assert r.apply(env, r.for_table("shop", "t")) is env


def test_ddl_without_an_alter_description_is_forwarded_as_is():
    env = ddl_env(CREATE)
    del env["alter"]
    r = rules()
    assert r.apply(env, r.for_table("shop", "t")) is env


def test_ddl_of_a_table_without_column_rules_is_forwarded_as_is():
    env = ddl_env(CREATE, table="other")
    r = rules()
    assert r.apply(env, r.for_table("shop", "other")) is env

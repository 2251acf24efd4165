"""services.sink.rules: table filters, skipped ops, column rules and masks (pure)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest

from services.parser.alter import describe
from services.sink.rules import Mask, Rules, TableRules
from shared.errors import ConfigError

SALT = "pepper"


def col(name: str, type_: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "nullable": True, **extra}


USERS_SCHEMA = {
    "id": "0123456789abcdef",
    "columns": [
        col("id", "int", nullable=False),
        col("name", "varchar", length=200, charset="utf8mb4"),
        col("email", "varchar", length=400, charset="utf8mb4"),
        col("ssn", "char", length=44, charset="utf8mb4"),
        col("bio", "text", length=2, charset="utf8mb4"),
        col("avatar", "blob", length=2),
        col("balance", "decimal", precision=10, scale=2),
        col("age", "int", unsigned=True),
    ],
}


def envelope(op: str = "i", rows: list[dict[str, Any]] | None = None, db: str = "shop", table: str = "users",
             schema: dict[str, Any] | None = None, pk: tuple[str, ...] = ("id",)) -> dict[str, Any]:
    env: dict[str, Any] = {
        "v": 1, "source": "main", "db": db, "table": table, "op": op, "ts": 1, "scn": 42, "chunk": 0,
        "pos": {"file": "mysql-bin.000001", "offset": 4, "gtid": None},
        "txn": {"id": "mysql-bin.000001:4", "i": 0, "last": True}, "pk": list(pk),
        "rows": rows if rows is not None else [{"after": user_row()}],
        "schema": copy.deepcopy(schema if schema is not None else USERS_SCHEMA),
    }
    return env


def user_row(**over: Any) -> dict[str, Any]:
    row = {"id": 1, "name": "Alice", "email": "alice@example.com", "ssn": "123-45-6789", "bio": "hello world",
           "avatar": b"\x89PNG\r\n", "balance": "10.50", "age": 33}
    row.update(over)
    return row


def sha(value: str | bytes, salt: str = SALT) -> str:
    raw = value if isinstance(value, bytes) else value.encode()
    return hashlib.sha256(salt.encode() + raw).hexdigest()


def shape(rules: Rules, env: dict[str, Any], table_rules: TableRules) -> dict[str, Any]:
    """`rules.apply` for an event that must be forwarded."""
    out = rules.apply(env, table_rules)
    assert out is not None
    return out


def columns(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in env["schema"]["columns"]}


# --- table filters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("include", "exclude", "name", "allowed"),
    [
        ((), (), "shop.users", True),
        ((r"shop\..*",), (), "shop.users", True),
        ((r"shop\..*",), (), "other.users", False),
        # full match: neither a prefix nor a substring is enough
        ((r"shop\.user",), (), "shop.users", False),
        ((r"hop\.users",), (), "shop.users", False),
        ((r"shop",), (), "shop.users", False),
        ((r"shop\.users",), (), "xshop.users", False),
        # comma-separated lists, in one value or several, with spaces around items
        ((r"shop\.users, crm\..*",), (), "crm.leads", True),
        ((r"shop\.users", r"crm\..*"), (), "crm.leads", True),
        ((r"shop\.users , crm\..*",), (), "hr.staff", False),
        # exclude wins over include
        ((r"shop\..*",), (r"shop\.audit",), "shop.audit", False),
        ((r"shop\..*",), (r"shop\.audit",), "shop.users", True),
        ((), (r".*\.tmp_.*",), "shop.tmp_1", False),
        ((), (r".*\.tmp_.*",), "shop.users", True),
        ((), (r"shop\.a, shop\.b",), "shop.b", False),
        # `.` in a regex is any character: Canal users escape it; an unescaped dot still matches
        ((r"shop.users",), (), "shop.users", True),
        ((r"shop.users",), (), "shop_users.x", False),
        # empty items are ignored
        ((r",shop\.users,,",), (), "shop.users", True),
        ((r",shop\.users,,",), (), "shop.orders", False),
    ],
)
def test_table_filters(include, exclude, name, allowed):
    rules = Rules.build(include=include, exclude=exclude)
    db, _, table = name.partition(".")
    assert rules.table_allowed(db, table) is allowed


def test_filters_are_full_match_regexes_case_sensitive_when_the_source_is():
    rules = Rules.build(include=[r"shop\.(users|orders)"], lower_case_table_names=0)
    assert rules.table_allowed("shop", "users")
    assert rules.table_allowed("shop", "orders")
    assert not rules.table_allowed("shop", "Users")
    assert not rules.table_allowed("shop", "users_old")


@pytest.mark.parametrize("field", ["include", "exclude"])
@pytest.mark.parametrize("bad", [r"shop\.(users", "[a-", "*", r"ok\.t, (unclosed"])
def test_invalid_regex_is_a_config_error(field, bad):
    with pytest.raises(ConfigError, match=field):
        Rules.build(**{field: [bad]})  # type: ignore[arg-type]


def test_invalid_regex_error_names_the_bad_item():
    with pytest.raises(ConfigError, match=r"'\(unclosed'"):
        Rules.build(include=[r"shop\.users,(unclosed"])


# --- skipped operations --------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["i", "u", "d", "r"])
def test_skip_ops_drop_row_events(op):
    rules = Rules.build(skip_ops=[op])
    env = envelope(op=op)
    assert rules.apply(env, rules.for_table("shop", "users")) is None
    for other in {"i", "u", "d", "r"} - {op}:
        other_env = envelope(op=other)
        assert rules.apply(other_env, rules.for_table("shop", "users")) is other_env


@pytest.mark.parametrize("bad", [["ddl"], ["hb"], ["x"], ["I"], ["i", "delete"], [""]])
def test_skip_ops_only_accept_row_operations(bad):
    with pytest.raises(ConfigError, match="skip_ops"):
        Rules.build(skip_ops=bad)


@pytest.mark.parametrize("op", ["ddl", "hb"])
def test_ddl_and_heartbeats_are_never_skipped(op):
    """(How column rules reshape a DDL's `alter`: test_ddl_rules.py; this one touches no ruled column.)"""
    rules = Rules.build(skip_ops=["i", "u", "d", "r"], columns_exclude={"shop.*": ["ssn"]},
                        masks={"shop.users": {"email": "hash"}}, salt=SALT)
    env = envelope(op=op, rows=[])
    env.pop("schema")
    if op == "ddl":
        env["ddl"] = "ALTER TABLE users ADD COLUMN ssn2 CHAR(11)"
        env["alter"] = describe(env["ddl"], "shop")
    assert rules.apply(env, rules.for_table("shop", "users")) is env


# --- identity when nothing is rewritten ----------------------------------------------------------


def test_apply_returns_the_same_object_without_rewrite_rules():
    rules = Rules.build(include=[r"shop\..*"], exclude=[r"shop\.audit"], skip_ops=["d"],
                        columns_exclude={"crm.*": ["ssn"]}, masks={"crm.leads": {"email": "hash"}}, salt=SALT)
    tr = rules.for_table("shop", "users")
    assert not tr.rewrites
    for op in ("i", "u", "r"):
        env = envelope(op=op)
        snapshot = copy.deepcopy(env)
        assert rules.apply(env, tr) is env
        assert env == snapshot


def test_default_rules_forward_everything_unchanged():
    rules = Rules.build()
    assert rules.table_allowed("any", "thing")
    env = envelope()
    assert rules.apply(env, rules.for_table("shop", "users")) is env


def test_apply_does_not_mutate_its_input():
    rules = Rules.build(columns_exclude={"shop.users": ["bio"]}, masks={"shop.users": {"ssn": "hash"}}, salt=SALT)
    env = envelope(op="u", rows=[{"before": user_row(), "after": user_row(name="Bob")}])
    snapshot = copy.deepcopy(env)
    out = shape(rules, env, rules.for_table("shop", "users"))
    assert out is not env
    assert env == snapshot


# --- column include / exclude --------------------------------------------------------------------


def test_for_table_matches_glob_keys():
    rules = Rules.build(columns_include={"shop.*": ["name"], "crm.leads": ["email"]},
                        columns_exclude={"*.users": ["ssn"], "shop.u?ers": ["bio"]},
                        masks={"shop.*": {"email": "hash"}, "shop.orders": {"card": "truncate:4"}}, salt=SALT)
    users = rules.for_table("shop", "users")
    assert users.include == frozenset({"name"})
    assert users.exclude == frozenset({"ssn", "bio"})
    assert set(users.masks) == {"email"}
    orders = rules.for_table("shop", "orders")
    assert set(orders.masks) == {"email", "card"}
    assert orders.exclude == frozenset()
    other = rules.for_table("crm", "users")
    assert other.include is None and other.exclude == frozenset({"ssn"}) and not other.masks
    assert rules.for_table("hr", "staff") == TableRules()
    assert not rules.for_table("hr", "staff").rewrites


def test_several_include_globs_add_up():
    rules = Rules.build(columns_include={"shop.*": ["name"], "*.users": ["email"]})
    assert rules.for_table("shop", "users").include == frozenset({"name", "email"})


def test_columns_exclude_drops_columns_from_rows_and_schema():
    rules = Rules.build(columns_exclude={"shop.*": ["ssn", "avatar"]})
    env = envelope(op="u", rows=[{"before": user_row(), "after": user_row(name="Bob")}])
    out = shape(rules, env, rules.for_table("shop", "users"))
    expected = {k: v for k, v in user_row().items() if k not in ("ssn", "avatar")}
    assert out["rows"] == [{"before": expected, "after": {**expected, "name": "Bob"}}]
    assert [c["name"] for c in out["schema"]["columns"]] == ["id", "name", "email", "bio", "balance", "age"]
    # kept columns keep their full description
    assert columns(out)["balance"] == USERS_SCHEMA["columns"][6]


def test_a_keyless_snapshots_replace_gets_the_same_schema_as_its_rows():
    """The `replace` carries the table's columns (a consumer without the table creates it there)."""
    rules = Rules.build(columns_exclude={"shop.*": ["ssn", "avatar"]})
    env = {k: v for k, v in envelope(op="replace").items() if k != "rows"}
    out = shape(rules, env, rules.for_table("shop", "users"))
    rows = shape(rules, envelope(op="r", rows=[{"after": user_row()}]), rules.for_table("shop", "users"))
    assert "rows" not in out and out["schema"] == rows["schema"]


def test_columns_include_keeps_only_listed_columns_and_the_primary_key():
    rules = Rules.build(columns_include={"shop.users": ["name", "email"]})
    env = envelope(op="d", rows=[{"before": user_row()}, {"before": user_row(id=2, name="Bo")}])
    out = shape(rules, env, rules.for_table("shop", "users"))
    assert out["rows"] == [{"before": {"id": 1, "name": "Alice", "email": "alice@example.com"}},
                           {"before": {"id": 2, "name": "Bo", "email": "alice@example.com"}}]
    assert [c["name"] for c in out["schema"]["columns"]] == ["id", "name", "email"]


def test_primary_key_is_kept_even_when_excluded():
    rules = Rules.build(columns_exclude={"shop.users": ["id", "ssn"]})
    out = shape(rules, envelope(), rules.for_table("shop", "users"))
    assert out["rows"][0]["after"]["id"] == 1
    assert "ssn" not in out["rows"][0]["after"]
    assert "id" in columns(out)


def test_composite_primary_key_is_kept():
    schema = {"id": "x", "columns": [col("tenant", "int"), col("id", "int"), col("v", "varchar"),
                                     col("w", "varchar")]}
    row = {"tenant": 7, "id": 1, "v": "a", "w": "b"}
    rules = Rules.build(columns_include={"shop.t": ["w"]}, columns_exclude={"shop.t": ["tenant"]})
    out = shape(rules, envelope(rows=[{"after": row}], table="t", schema=schema, pk=("tenant", "id")),
                      rules.for_table("shop", "t"))
    assert out["rows"] == [{"after": {"tenant": 7, "id": 1, "w": "b"}}]
    assert [c["name"] for c in out["schema"]["columns"]] == ["tenant", "id", "w"]


def test_exclude_wins_over_include_for_columns():
    rules = Rules.build(columns_include={"shop.users": ["name", "email"]}, columns_exclude={"shop.*": ["email"]})
    out = shape(rules, envelope(), rules.for_table("shop", "users"))
    assert out["rows"] == [{"after": {"id": 1, "name": "Alice"}}]


def test_table_without_primary_key_keeps_only_the_selected_columns():
    rules = Rules.build(columns_include={"shop.users": ["name"]})
    out = shape(rules, envelope(pk=()), rules.for_table("shop", "users"))
    assert out["rows"] == [{"after": {"name": "Alice"}}]


def test_reshaped_schema_gets_a_new_stable_id():
    rules = Rules.build(columns_exclude={"shop.users": ["ssn"]})
    tr = rules.for_table("shop", "users")
    a = shape(rules, envelope(), tr)
    b = shape(rules, envelope(rows=[{"after": user_row(id=5)}]), tr)
    assert a["schema"]["id"] != USERS_SCHEMA["id"]
    assert a["schema"]["id"] == b["schema"]["id"]  # same shape, same id
    other = Rules.build(columns_exclude={"shop.users": ["bio"]})
    c = shape(other, envelope(), other.for_table("shop", "users"))
    assert c["schema"]["id"] not in (a["schema"]["id"], USERS_SCHEMA["id"])
    # a different mask on the same columns is a different schema, too
    masked = Rules.build(columns_exclude={"shop.users": ["ssn"]}, masks={"shop.users": {"name": "hash"}}, salt=SALT)
    d = shape(masked, envelope(), masked.for_table("shop", "users"))
    assert d["schema"]["id"] != a["schema"]["id"]


def test_rows_are_reshaped_from_their_keys_when_the_schema_is_absent():
    rules = Rules.build(columns_exclude={"shop.users": ["ssn", "id"]})
    env = envelope()
    env.pop("schema")
    out = shape(rules, env, rules.for_table("shop", "users"))
    assert "schema" not in out
    assert out["rows"][0]["after"] == {k: v for k, v in user_row().items() if k != "ssn"}


def test_rows_and_schema_keep_the_same_columns():
    rules = Rules.build(columns_include={"shop.*": ["name", "email", "bio", "nope"]},
                        columns_exclude={"shop.users": ["bio"]}, masks={"shop.users": {"email": "hash"}}, salt=SALT)
    out = shape(rules, envelope(op="u", rows=[{"before": user_row(), "after": user_row(bio="x")}]),
                      rules.for_table("shop", "users"))
    names = [c["name"] for c in out["schema"]["columns"]]
    assert names == ["id", "name", "email"]
    for row in out["rows"]:
        for image in row.values():
            assert list(image) == names


# --- masks ---------------------------------------------------------------------------------------


def masked(spec: str, value: Any, column: str = "name", salt: str = SALT) -> Any:
    rules = Rules.build(masks={"shop.users": {column: spec}}, salt=salt)
    out = shape(rules, envelope(rows=[{"after": user_row(**{column: value})}]), rules.for_table("shop", "users"))
    return out["rows"][0]["after"][column]


def test_hash_is_sha256_hex_of_salt_and_value():
    assert masked("hash", "123-45-6789", "ssn") == sha("123-45-6789")
    assert masked("hash", "123-45-6789", "ssn") == hashlib.sha256(b"pepper123-45-6789").hexdigest()


def test_hash_is_deterministic_and_salted():
    assert masked("hash", "alice@example.com") == masked("hash", "alice@example.com")
    assert masked("hash", "alice@example.com") != masked("hash", "bob@example.com")
    assert masked("hash", "alice@example.com", salt="other") != masked("hash", "alice@example.com")
    assert masked("hash", "alice@example.com", salt="other") == sha("alice@example.com", "other")


def test_hash_of_non_strings_and_bytes():
    assert masked("hash", 42, "age") == sha("42")
    assert masked("hash", b"\x00\xffraw", "avatar") == sha(b"\x00\xffraw")
    assert masked("hash", "10.50", "balance") == sha("10.50")
    assert masked("hash", "żółw", "name") == sha("żółw".encode())


def test_hash_masks_before_and_after_images_alike():
    rules = Rules.build(masks={"shop.users": {"ssn": "hash"}}, salt=SALT)
    env = envelope(op="u", rows=[{"before": user_row(), "after": user_row(ssn="999-99-9999")},
                                 {"before": user_row(id=2), "after": user_row(id=2, name="Z")}])
    out = shape(rules, env, rules.for_table("shop", "users"))
    assert [r["before"]["ssn"] for r in out["rows"]] == [sha("123-45-6789")] * 2
    assert [r["after"]["ssn"] for r in out["rows"]] == [sha("999-99-9999"), sha("123-45-6789")]
    assert out["rows"][1]["after"]["name"] == "Z"  # other columns untouched


@pytest.mark.parametrize(("value", "n", "expected"), [
    ("alice@example.com", 5, "alice"),
    ("ab", 5, "ab"),
    ("", 3, ""),
    ("żółwik", 3, "żół"),  # characters, not bytes
    ("abc", 0, ""),
])
def test_truncate_strings(value, n, expected):
    assert masked(f"truncate:{n}", value) == expected


def test_truncate_bytes_stay_bytes():
    assert masked("truncate:3", b"\x89PNG\r\n", "avatar") == b"\x89PN"


@pytest.mark.parametrize(("value", "expected"), [(123456, "1234"), (3.14159, "3.14"), (True, "True"),
                                                 (["a", "b"], "['a'")])
def test_truncate_of_non_strings_gives_a_string(value, expected):
    assert masked("truncate:4", value, "age") == expected


@pytest.mark.parametrize(("spec", "expected"), [
    ("replace:***", "***"),
    ("replace:redacted:by:policy", "redacted:by:policy"),
    ("replace:a, b", "a, b"),
    ("replace:", ""),
])
def test_replace(spec, expected):
    assert masked(spec, "alice@example.com", "email") == expected
    assert masked(spec, 12, "age") == expected


@pytest.mark.parametrize("spec", ["hash", "truncate:2", "replace:X"])
def test_null_stays_null(spec):
    assert masked(spec, None, "email") is None
    assert masked(spec, None, "age") is None


@pytest.mark.parametrize(("spec", "method"), [("hash", "hash"), ("replace:***", "replace"),
                                              ("truncate:3", "truncate")])
def test_masked_schema_entry_is_marked_and_becomes_varchar(spec, method):
    rules = Rules.build(masks={"shop.users": {"balance": spec, "age": spec}}, salt=SALT)
    out = shape(rules, envelope(), rules.for_table("shop", "users"))
    cols = columns(out)
    for name in ("balance", "age"):
        assert cols[name]["masked"] == method
        assert cols[name]["type"] == "varchar"
        assert not {"precision", "scale", "unsigned"} & set(cols[name])
    assert cols["id"] == USERS_SCHEMA["columns"][0]
    assert "masked" not in cols["name"]


@pytest.mark.parametrize("type_", ["char", "varchar", "tinytext", "text", "mediumtext", "longtext",
                                   "binary", "varbinary", "blob"])
def test_truncate_keeps_the_type_of_string_columns(type_):
    schema = {"id": "s", "columns": [col("id", "int"), col("c", type_, length=2)]}
    rules = Rules.build(masks={"shop.t": {"c": "truncate:2"}}, salt=SALT)
    value: Any = b"abcdef" if "bin" in type_ or "blob" in type_ else "abcdef"
    out = shape(rules, envelope(table="t", schema=schema, rows=[{"after": {"id": 1, "c": value}}]),
                      rules.for_table("shop", "t"))
    assert out["rows"][0]["after"]["c"] == value[:2]
    assert columns(out)["c"] == {**col("c", type_, length=2), "masked": "truncate"}


@pytest.mark.parametrize("type_", ["tinyblob", "mediumblob", "longblob"])
def test_truncate_keeps_the_type_of_blob_columns(type_):
    schema = {"id": "s", "columns": [col("id", "int"), col("c", type_, length=3)]}
    rules = Rules.build(masks={"shop.t": {"c": "truncate:2"}}, salt=SALT)
    out = shape(rules, envelope(table="t", schema=schema, rows=[{"after": {"id": 1, "c": b"abcdef"}}]),
                      rules.for_table("shop", "t"))
    assert out["rows"][0]["after"]["c"] == b"ab"
    assert columns(out)["c"]["type"] == type_


@pytest.mark.parametrize("spec", ["hash", "replace:x"])
def test_hash_and_replace_of_text_columns_become_varchar(spec):
    rules = Rules.build(masks={"shop.users": {"bio": spec, "avatar": spec}}, salt=SALT)
    cols = columns(shape(rules, envelope(), rules.for_table("shop", "users")))
    assert cols["bio"]["type"] == "varchar" and cols["avatar"]["type"] == "varchar"


def test_truncate_of_a_non_string_column_becomes_varchar():
    rules = Rules.build(masks={"shop.users": {"balance": "truncate:2"}}, salt=SALT)
    out = shape(rules, envelope(), rules.for_table("shop", "users"))
    assert out["rows"][0]["after"]["balance"] == "10"
    assert columns(out)["balance"] == {"name": "balance", "type": "varchar", "nullable": True, "masked": "truncate"}


def test_mask_on_a_primary_key_column_masks_it():
    rules = Rules.build(masks={"shop.users": {"id": "hash"}}, salt=SALT)
    out = shape(rules, envelope(), rules.for_table("shop", "users"))
    assert out["rows"][0]["after"]["id"] == sha("1")


def test_masks_and_column_rules_combine():
    rules = Rules.build(columns_exclude={"shop.*": ["avatar", "bio"]},
                        masks={"shop.users": {"ssn": "hash", "email": "truncate:5", "avatar": "hash"}}, salt=SALT)
    out = shape(rules, envelope(), rules.for_table("shop", "users"))
    assert out["rows"][0]["after"] == {"id": 1, "name": "Alice", "email": "alice", "ssn": sha("123-45-6789"),
                                       "balance": "10.50", "age": 33}
    assert set(columns(out)) == {"id", "name", "email", "ssn", "balance", "age"}


def test_later_glob_masks_override_earlier_ones_per_column():
    rules = Rules.build(masks={"shop.*": {"email": "hash", "ssn": "hash"}, "shop.users": {"email": "replace:E"}},
                        salt=SALT)
    after = shape(rules, envelope(), rules.for_table("shop", "users"))["rows"][0]["after"]
    assert after["email"] == "E"
    assert after["ssn"] == sha("123-45-6789")


def test_masks_need_a_salt():
    with pytest.raises(ConfigError, match="mask_salt"):
        Rules.build(masks={"shop.users": {"email": "hash"}})
    with pytest.raises(ConfigError, match="BINLAKE_MASK_SALT"):
        Rules.build(masks={"shop.users": {"email": "replace:x"}}, salt="")
    Rules.build(masks={}, salt="")  # no masks, no salt needed


@pytest.mark.parametrize("spec", ["md5", "HASH", "", "truncate", "truncate:", "truncate:x", "truncate:-1",
                                  "truncate:1.5", "truncate: 4", "redact:x", "replac"])
def test_bad_mask_specs_are_config_errors(spec):
    with pytest.raises(ConfigError, match=r"shop\.users\.email"):
        Rules.build(masks={"shop.users": {"email": spec}}, salt=SALT)


def test_mask_parse():
    assert Mask.parse("hash", "w") == Mask("hash", "")
    assert Mask.parse("truncate:12", "w") == Mask("truncate", "12")
    assert Mask.parse("replace:a:b", "w") == Mask("replace", "a:b")


def test_masked_value_never_appears_in_the_output():
    secret = "secret-ssn-123-45-6789"
    rules = Rules.build(masks={"shop.users": {"ssn": "hash", "email": "replace:x", "name": "truncate:3"}},
                        salt=SALT)
    env = envelope(op="u", rows=[{"before": user_row(ssn=secret, email=secret, name=secret),
                                  "after": user_row(ssn=secret + "!", email=secret, name=secret)}])
    out = shape(rules, env, rules.for_table("shop", "users"))
    assert secret not in repr(out)


@pytest.mark.parametrize("field", ["columns_include", "columns_exclude"])
def test_a_column_list_given_as_a_string_is_not_split_into_characters(field):
    try:
        rules = Rules.build(**{field: {"shop.users": "email"}})  # type: ignore[arg-type]
    except ConfigError:
        return  # a clear error is fine too
    tr = rules.for_table("shop", "users")
    assert (tr.include if field == "columns_include" else tr.exclude) == frozenset({"email"})


@pytest.mark.parametrize("masks", [{"shop.users": "hash"}, {"shop.users": {"email": 5}},
                                   {"shop.users": ["email"]}])
def test_malformed_masks_are_config_errors(masks):
    with pytest.raises(ConfigError):
        Rules.build(masks=masks, salt=SALT)


def test_column_rules_and_masks_match_column_names_case_insensitively() -> None:
    rules = Rules.build(masks={"shop.users": {"Email": "hash", "SSN": "replace:x"}},
                        columns_exclude={"shop.*": ["BIO"]}, salt=SALT)
    out = rules.apply(envelope(), rules.for_table("shop", "users"))
    assert out is not None
    row = out["rows"][0]["after"]
    assert row["email"] == hashlib.sha256(SALT.encode() + b"alice@example.com").hexdigest()
    assert row["ssn"] == "x" and "bio" not in row
    masked = {c["name"]: c.get("masked") for c in out["schema"]["columns"]}
    assert masked["email"] == "hash" and masked["ssn"] == "replace" and "bio" not in masked
    kept = Rules.build(columns_include={"shop.users": ["NAME"]}).apply(envelope(), Rules.build(
        columns_include={"shop.users": ["NAME"]}).for_table("shop", "users"))
    assert kept is not None and set(kept["rows"][0]["after"]) == {"id", "name"}


def test_rules_naming_columns_a_table_lacks_are_reported() -> None:
    rules = Rules.build(masks={"shop.*": {"emial": "hash", "Email": "hash"}}, columns_exclude={"shop.users": ["nope"]},
                        salt=SALT)
    names = [c["name"] for c in USERS_SCHEMA["columns"]]  # type: ignore[index]
    assert rules.for_table("shop", "users").missing(names) == ["emial", "nope"]
    assert Rules.build().for_table("shop", "users").missing(names) == []


# --- database and table names per the source's lower_case_table_names ----------------------------
# 0: stored as given, compared by case; 1: stored in lower case (the binlog says `shop.orders` for
# a table created as `Shop.Orders`); 2: stored as given, compared in lower case.

BINLOG_NAMES = {0: ("Shop", "Orders"), 1: ("shop", "orders"), 2: ("Shop", "Orders")}


@pytest.mark.parametrize(("lctn", "db", "table", "matches"), [
    (0, "Shop", "Orders", True),
    (0, "shop", "orders", False),
    (0, "SHOP", "ORDERS", False),
    (1, "shop", "orders", True),
    (1, "Shop", "Orders", True),
    (2, "Shop", "Orders", True),
    (2, "shop", "orders", True),
    (2, "SHOP", "orders", True),
])
def test_table_filters_follow_lower_case_table_names(lctn, db, table, matches):
    include = Rules.build(include=[r"Shop\.Orders"], lower_case_table_names=lctn)
    assert include.table_allowed(db, table) is matches
    exclude = Rules.build(exclude=[r"Shop\.Ord.*, other\.x"], lower_case_table_names=lctn)
    assert exclude.table_allowed(db, table) is not matches
    # a lower-case rule, the other way round
    lower = Rules.build(include=[r"shop\.orders"], lower_case_table_names=lctn)
    assert lower.table_allowed(db, table) is (lctn != 0 or (db, table) == ("shop", "orders"))


@pytest.mark.parametrize("lctn", [1, 2])
def test_case_insensitive_filters_still_match_whole_names_only(lctn):
    rules = Rules.build(include=[r"Shop\.Orders"], exclude=[r"SHOP\.ORDERS_OLD"], lower_case_table_names=lctn)
    assert not rules.table_allowed("shop", "orders_2")
    assert not rules.table_allowed("xshop", "orders")
    assert not Rules.build(include=[r"Shop\.Orders", r"shop\.orders_old"], exclude=[r"SHOP\.ORDERS_OLD"],
                           lower_case_table_names=lctn).table_allowed("shop", "orders_old")


@pytest.mark.parametrize("lctn", [0, 1, 2])
def test_masks_and_column_rules_keyed_by_db_table_follow_lower_case_table_names(lctn):
    rules = Rules.build(masks={"Shop.Orders": {"EMAIL": "replace:x"}}, columns_exclude={"SHOP.*": ["Notes"]},
                        columns_include={"shop.ord?rs": ["Name", "email", "notes"]}, salt=SALT,
                        lower_case_table_names=lctn)
    for db, table in {("shop", "orders"), ("Shop", "Orders"), BINLOG_NAMES[lctn]}:
        found = rules.for_table(db, table)
        folded = lctn != 0
        assert (set(found.masks) == {"email"}) is (folded or (db, table) == ("Shop", "Orders"))
        assert (found.exclude == frozenset({"notes"})) is folded
        assert (found.include == frozenset({"name", "email", "notes"})) is (folded or (db, table) == ("shop", "orders"))
    assert not rules.for_table("crm", "orders").rewrites


@pytest.mark.parametrize("lctn", [1, 2])
def test_a_mask_written_as_the_sql_spells_the_table_masks_the_binlog_rows(lctn):
    rules = Rules.build(masks={"Shop.Users": {"EMAIL": "hash"}}, salt=SALT, lower_case_table_names=lctn)
    db, table = ("shop", "users") if lctn == 1 else ("Shop", "Users")
    env = envelope(db=db, table=table)
    out = shape(rules, env, rules.for_table(db, table))
    assert out["rows"][0]["after"]["email"] == sha("alice@example.com")
    assert b"alice@example.com" not in repr(out).encode()
    assert columns(out)["email"]["masked"] == "hash"


def test_on_a_case_sensitive_source_a_mask_only_masks_its_own_table():
    rules = Rules.build(masks={"Shop.Users": {"email": "hash"}}, salt=SALT, lower_case_table_names=0)
    assert rules.for_table("Shop", "Users").masks
    other = rules.for_table("shop", "users")  # another table on such a server
    assert not other.rewrites
    assert rules.apply(envelope(), other)["rows"][0]["after"]["email"] == "alice@example.com"  # type: ignore[index]


def test_keys_differing_only_in_case_both_apply_when_names_ignore_case():
    rules = Rules.build(masks={"shop.*": {"email": "hash", "ssn": "hash"}, "SHOP.users": {"ssn": "replace:x"}},
                        salt=SALT, lower_case_table_names=1)
    masks = rules.for_table("shop", "users").masks
    assert masks["email"] == Mask("hash") and masks["ssn"] == Mask("replace", "x")


def test_names_ignore_case_by_default():
    rules = Rules.build(include=[r"Shop\..*"], masks={"SHOP.USERS": {"email": "hash"}}, salt=SALT)
    assert rules.tables_ignore_case
    assert rules.table_allowed("shop", "users") and set(rules.for_table("shop", "users").masks) == {"email"}


@pytest.mark.parametrize("bad", [3, -1, True, "1"])
def test_lower_case_table_names_must_be_a_server_value(bad):
    with pytest.raises(ConfigError, match="BINLAKE_LOWER_CASE_TABLE_NAMES"):
        Rules.build(lower_case_table_names=bad)

"""`binlake tail`: which CDC subject a table name on the command line reads."""

from __future__ import annotations

import pytest

from services.ops.tail import table_subject
from shared.errors import ConfigError
from shared.mysql import display
from shared.subjects import Names


def test_a_plain_name_reads_its_subject() -> None:
    assert table_subject(Names(), "main", "shop.items") == "binlake.cdc.main.shop.items"


def test_names_with_dots_and_backticks_are_given_in_backticks() -> None:
    db, table = "t_1 `x.\"ü'*>%$", "we`ird \"t'.ä*>%$"
    subject = table_subject(Names("bl"), "main", display(db, table))
    assert subject == Names("bl").cdc("main", db, table)
    assert len(subject.split(".")) == 5  # every name one escaped token
    assert table_subject(Names(), "main", "`shop`.`a.b`") == Names().cdc("main", "shop", "a.b")


def test_an_unquoted_name_with_two_dots_is_refused_not_guessed() -> None:
    with pytest.raises(ConfigError, match="backticks"):
        table_subject(Names(), "main", "shop.a.b")
    with pytest.raises(ConfigError, match=r"db\.table"):
        table_subject(Names(), "main", "nodot")

"""Pure parts of `binlake lake` and of the demo's lake reader: the text table and the keyed fold."""

from __future__ import annotations

from typing import Any

import pytest

from services.launcher.demo import fold
from services.loader import lakecli
from services.loader.iceberg import Marker
from services.loader.lakecli import render
from services.loader.naming import TableNames
from shared.errors import ConfigError
from shared.mysql import display

COLUMNS = ["id", "v"]


def change(op: str, scn: int, row: int, id_: int, v: str | None, prev: int | None = None) -> dict[str, Any]:
    return {"_binlake_op": op, "_binlake_scn": scn, "_binlake_seq": scn, "_binlake_row": row, "id": id_, "v": v,
            "_binlake_prev_id": prev}


def test_render_pads_columns_and_prints_null():
    text = render(["id", "name"], [["1", None], ["10", "a\nb"]])
    assert text.splitlines() == ["id  name", "--  ----", "1   NULL", "10  a\\nb"]


def test_render_shortens_long_values():
    line = render(["x"], [["y" * 100]]).splitlines()[2]
    assert len(line) == 60 and line.endswith("…")


def test_fold_applies_the_tail_in_source_order():
    current = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}]
    tail = [  # given out of order: the fold sorts by (scn, seq, row)
        change("d", 30, 0, 2, "b"),
        change("u", 10, 0, 10, "c", prev=3),  # key 3 moved to 10
        change("i", 20, 1, 2, "again"),  # before the delete at scn 30, which wins
        change("u", 20, 0, 1, "a2", prev=1),
        change("i", 40, 0, 4, None),
    ]
    out = fold(current, tail, COLUMNS, ["id"])
    assert out == {(1,): {"id": 1, "v": "a2"}, (10,): {"id": 10, "v": "c"}, (4,): {"id": 4, "v": None}}


def test_fold_keeps_untouched_rows():
    assert fold([{"id": 1, "v": "a"}], [], COLUMNS, ["id"]) == {(1,): {"id": 1, "v": "a"}}


# -- table names -------------------------------------------------------------------------------------

HOSTILE = ("t_1 `x.\"ü'*>%$", "we`ird \"t'.ä*>%$")


def test_show_takes_names_with_dots_and_backticks(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[TableNames] = []

    def as_of(spark: Any, names: TableNames, seq: int | None = None) -> None:
        asked.append(names)

    monkeypatch.setattr(lakecli, "tables", lambda spark, catalog: [TableNames(catalog, *HOSTILE),
                                                                   TableNames(catalog, "a.b", "c")])
    monkeypatch.setattr(lakecli, "as_of", as_of)
    for text in (display(*HOSTILE), "a.b.c", "`a.b`.c"):
        with pytest.raises(ConfigError, match="has no table"):
            lakecli.cmd_show(None, "lake", text, 5, None)  # type: ignore[arg-type]
    assert [(n.db, n.table) for n in asked] == [HOSTILE, ("a.b", "c"), ("a.b", "c")]


def test_tables_prints_names_as_show_takes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lakecli, "tables", lambda spark, catalog: [TableNames(catalog, *HOSTILE),
                                                                   TableNames(catalog, "shop", "orders")])
    monkeypatch.setattr(lakecli, "last_batch", lambda spark, catalog: 7)
    monkeypatch.setattr(lakecli, "status", lambda spark, names: lakecli.TableStatus(names, 1, Marker(), Marker(), 0))
    lines = lakecli.cmd_tables(None, "lake", "/wh").splitlines()  # type: ignore[arg-type]
    assert lines[3].startswith(display(*HOSTILE) + "  ") and lines[4].startswith("shop.orders  ")

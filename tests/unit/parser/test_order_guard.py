"""services.parser.order_guard: a table's order key never goes backwards in BINLAKE_RAW."""

from __future__ import annotations

import pytest

from services.parser.order_guard import OrderGuard, OrderWentBack
from services.parser.transactions import Outgoing, Resume
from shared import envelope

A, B = "binlake.raw.s.shop.a", "binlake.raw.s.shop.b"


def msg(subject: str, file: str, offset: int, chunk: int = 0, epoch: int = 0, *, table: bool = True) -> Outgoing:
    scn = envelope.scn(file, offset, epoch)
    return Outgoing(subject, b"", f"s:{scn}", {}, "i", 0, 1, Resume(file, offset), True,
                    order=(scn, chunk) if table else None)


def guard_over(stored: dict[str, tuple[int, int]]) -> tuple[OrderGuard, list[str]]:
    asked: list[str] = []

    async def last_stored(subject: str) -> tuple[int, int] | None:
        asked.append(subject)
        return stored.get(subject)

    return OrderGuard(last_stored), asked


async def test_increasing_keys_pass_and_the_stream_is_asked_once_per_table():
    guard, asked = guard_over({A: (envelope.scn("bin.000003", 100), 0)})
    for m in (msg(A, "bin.000003", 200), msg(A, "bin.000003", 200, chunk=1), msg(B, "bin.000001", 4),
              msg(A, "bin.000004", 4), msg(A, "bin.000001", 4, epoch=1)):
        await guard.check(m)
    assert asked == [A, B]


@pytest.mark.parametrize(("file", "offset", "chunk"), [("bin.000002", 999, 0), ("bin.000003", 100, 0),
                                                      ("bin.000003", 100, 1)])
async def test_a_key_that_does_not_come_after_the_stored_one_halts(file, offset, chunk):
    guard, _ = guard_over({A: (envelope.scn("bin.000003", 100), 1)})
    with pytest.raises(OrderWentBack, match=r"would go backwards.*binlog 3, offset 100, chunk 1.*server_id"):
        await guard.check(msg(A, file, offset, chunk))


async def test_a_key_going_back_within_a_run_halts():
    guard, _ = guard_over({})
    await guard.check(msg(A, "bin.000003", 100))
    await guard.check(msg(B, "bin.000001", 50))  # each table on its own
    with pytest.raises(OrderWentBack):
        await guard.check(msg(A, "bin.000001", 50))


async def test_messages_on_no_table_are_not_checked():
    guard, asked = guard_over({})
    await guard.check(msg("binlake.raw.s._.ddl", "bin.000001", 4, table=False))
    assert asked == []

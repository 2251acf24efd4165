"""Snapshot odds and ends: acked-scn waits, the rate limiter, parser settings, op "r" envelopes, CLI progress."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace
from typing import Any

import pytest

from services.ops import snapshot as cli
from services.parser.config import ParserConfig
from services.parser.snapshot import snapshotter
from services.parser.snapshot.snapshotter import AckedScn, RateLimiter
from services.parser.transactions import Assembler, Outgoing, Resume
from shared import envelope
from shared import snapshots as snap
from shared.errors import ConfigError, DecodeError
from shared.subjects import Names
from tests.unit.parser.test_transactions import TS, F, T

# -- AckedScn -------------------------------------------------------------------------------------


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_wait_past_returns_only_once_advanced_beyond() -> None:
    acked = AckedScn()
    waiter = asyncio.create_task(acked.wait_past(10))
    await settle()
    assert not waiter.done()
    acked.advance(7)
    await settle()
    assert not waiter.done()
    acked.advance(10)  # reaching the scn is not enough: the transaction at 10 must be acked past
    await settle()
    assert not waiter.done()
    acked.advance(11)
    await asyncio.wait_for(waiter, 5)
    assert acked.value == 11


async def test_wait_past_an_already_acked_scn_returns_at_once() -> None:
    acked = AckedScn()
    acked.advance(100)
    await asyncio.wait_for(acked.wait_past(99), 5)
    await asyncio.wait_for(acked.wait_past(0), 5)


async def test_one_advance_releases_every_waiter_past_it() -> None:
    acked = AckedScn()
    early = asyncio.create_task(acked.wait_past(1))
    late = asyncio.create_task(acked.wait_past(50))
    await settle()
    acked.advance(20)
    await asyncio.wait_for(early, 5)
    await settle()
    assert not late.done()
    acked.advance(51)
    await asyncio.wait_for(late, 5)


def test_advance_never_moves_back() -> None:
    acked = AckedScn()
    assert acked.value == 0
    acked.advance(5)
    acked.advance(3)
    acked.advance(5)
    assert acked.value == 5
    acked.advance(6)
    assert acked.value == 6


# -- RateLimiter ----------------------------------------------------------------------------------


class Clock:
    """A fake monotonic clock; `sleep` records the delay and (optionally) lets the time pass."""

    def __init__(self, now: float = 1000.0, *, passes: bool = False) -> None:
        self.now = now
        self.passes = passes
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        if self.passes:
            self.now += delay


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(snapshotter, "time", SimpleNamespace(monotonic=c.monotonic))
    monkeypatch.setattr(asyncio, "sleep", c.sleep)
    return c


async def test_rate_zero_never_sleeps(clock: Clock) -> None:
    limiter = RateLimiter(0)
    for rows in (1, 10_000, 10**9):
        await limiter.spend(rows)
    assert clock.slept == []


async def test_spending_no_rows_never_sleeps(clock: Clock) -> None:
    limiter = RateLimiter(10)
    await limiter.spend(0)
    await limiter.spend(-3)
    assert clock.slept == []


async def test_consecutive_spends_accumulate_delay(clock: Clock) -> None:
    limiter = RateLimiter(100)
    await limiter.spend(50)
    await limiter.spend(50)
    await limiter.spend(100)
    assert clock.slept == pytest.approx([0.5, 1.0, 2.0])


async def test_time_passing_pays_the_debt(clock: Clock) -> None:
    limiter = RateLimiter(100)
    await limiter.spend(100)  # budget until 1001.0
    clock.now += 0.75
    await limiter.spend(50)  # starts at 1001.0, ends 1001.5: 0.75 s from now
    assert clock.slept == pytest.approx([1.0, 0.75])


async def test_idle_time_is_not_banked(clock: Clock) -> None:
    limiter = RateLimiter(10)
    await limiter.spend(10)
    clock.now += 3600
    await limiter.spend(10)  # a full second again, not free because the limiter was idle
    await limiter.spend(5)
    assert clock.slept == pytest.approx([1.0, 1.0, 1.5])


async def test_steady_rate_when_the_sleeps_really_pass(clock: Clock) -> None:
    clock.passes = True
    limiter = RateLimiter(2000)
    start = clock.now
    for _ in range(10):
        await limiter.spend(400)
    assert clock.now - start == pytest.approx(2.0)
    assert clock.slept == pytest.approx([0.2] * 10)


# -- ParserConfig ------------------------------------------------------------------------------------

URL = {"BINLAKE_SOURCE_URL": "mysql://repl:pw@db:3306"}


def test_snapshot_settings_defaults() -> None:
    cfg = ParserConfig.from_env(URL)
    assert (cfg.watermark_table, cfg.snapshot_tables, cfg.snapshot_chunk_rows, cfg.snapshot_parallel,
            cfg.snapshot_max_rows_s) == ("binlake.watermarks", "", 4096, 2, 0.0)
    assert cfg.watermark == ("binlake", "watermarks")


def test_snapshot_settings_from_env() -> None:
    cfg = ParserConfig.from_env(URL | {
        "BINLAKE_SNAPSHOT_CHUNK_ROWS": "1", "BINLAKE_SNAPSHOT_PARALLEL": "64", "BINLAKE_SNAPSHOT_MAX_ROWS_S": "2.5",
        "BINLAKE_SNAPSHOT_TABLES": r"shop\..*", "BINLAKE_WATERMARK_TABLE": "ops.marks",
    })
    assert (cfg.snapshot_chunk_rows, cfg.snapshot_parallel, cfg.snapshot_max_rows_s, cfg.snapshot_tables) == (
        1, 64, 2.5, r"shop\..*")
    assert cfg.watermark == ("ops", "marks")


def test_watermark_splits_at_the_first_dot() -> None:
    assert ParserConfig.from_env(URL | {"BINLAKE_WATERMARK_TABLE": "a.b.c"}).watermark == ("a", "b.c")


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"BINLAKE_SNAPSHOT_CHUNK_ROWS": "0"}, "BINLAKE_SNAPSHOT_CHUNK_ROWS"),
        ({"BINLAKE_SNAPSHOT_CHUNK_ROWS": "-5"}, "BINLAKE_SNAPSHOT_CHUNK_ROWS"),
        ({"BINLAKE_SNAPSHOT_PARALLEL": "0"}, "BINLAKE_SNAPSHOT_PARALLEL"),
        ({"BINLAKE_SNAPSHOT_PARALLEL": "65"}, "BINLAKE_SNAPSHOT_PARALLEL"),
        ({"BINLAKE_SNAPSHOT_MAX_ROWS_S": "-0.1"}, "BINLAKE_SNAPSHOT_MAX_ROWS_S"),
        ({"BINLAKE_SNAPSHOT_TABLES": "shop.(orders"}, "BINLAKE_SNAPSHOT_TABLES"),
        ({"BINLAKE_SNAPSHOT_TABLES": "[a-"}, "BINLAKE_SNAPSHOT_TABLES"),
        ({"BINLAKE_WATERMARK_TABLE": "watermarks"}, "BINLAKE_WATERMARK_TABLE"),
        ({"BINLAKE_WATERMARK_TABLE": ".watermarks"}, "BINLAKE_WATERMARK_TABLE"),
        ({"BINLAKE_WATERMARK_TABLE": "binlake."}, "BINLAKE_WATERMARK_TABLE"),
        ({"BINLAKE_WATERMARK_TABLE": ""}, "BINLAKE_WATERMARK_TABLE"),
    ],
)
def test_invalid_snapshot_settings_name_their_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        ParserConfig.from_env(URL | env)
    assert variable in str(info.value)


def test_rate_limit_zero_and_edges_are_valid() -> None:
    cfg = ParserConfig.from_env(URL | {"BINLAKE_SNAPSHOT_MAX_ROWS_S": "0", "BINLAKE_SNAPSHOT_PARALLEL": "1"})
    assert (cfg.snapshot_max_rows_s, cfg.snapshot_parallel) == (0.0, 1)


# -- Assembler: op "r" and ignored tables -----------------------------------------------------------

WATERMARKS = ("binlake", "watermarks")


def asm(**kw: object) -> Assembler:
    kw.setdefault("start", Resume(F, 4, "0-1-5"))
    return Assembler("src", Names(), **kw)  # type: ignore[arg-type]


def env(msg: Outgoing) -> dict[str, object]:
    return envelope.as_dict(envelope.decode(msg.data))


def test_snapshot_rows_are_op_r_at_the_high_watermark_inside_its_transaction() -> None:
    a = asm()
    a.gtid("0-1-6", 0, False, F, 100)
    a.query("BEGIN", "", F, 140, 180, TS)
    chunk: list[dict[str, Any]] = [{"after": {"id": 1, "note": "a"}}, {"after": {"id": 2, "note": None}}]
    assert a.snapshot(T, chunk, F, 200, TS) == []  # held back like every message until the commit
    (msg,) = a.commit(F, 300)
    e = env(msg)
    assert (msg.op, e["op"], e["db"], e["table"]) == ("r", "r", "shop", "orders")
    assert e["rows"] == [{"after": {"id": 1, "note": "a"}}, {"after": {"id": 2, "note": None}}]
    assert e["pk"] == ["id"]
    assert e["scn"] == envelope.scn(F, 200)
    assert e["pos"] == {"file": F, "offset": 200, "gtid": "0-1-6"}
    assert e["txn"] == {"id": "0-1-6", "i": 0, "last": True}
    assert e["schema"] == T.described
    assert msg.subject == "binlake.raw.src.shop.orders"
    assert msg.msg_id == f"src:{envelope.scn(F, 200)}"
    assert msg.headers["Binlake-Op"] == "r" and msg.headers["Binlake-Rows"] == "2"
    assert msg.headers["Binlake-Schema"] == T.id
    assert msg.rows == 2 and msg.last and msg.resume == Resume(F, 300, "0-1-6")


def test_snapshot_is_ordered_with_the_other_messages_of_its_transaction() -> None:
    a = asm()
    a.gtid("0-1-6", 0, False, F, 100)
    a.query("BEGIN", "", F, 140, 180, TS)
    out = a.rows("i", T, [{"after": {"id": 9, "note": "n"}}], F, 200, TS)
    out += a.snapshot(T, [{"after": {"id": 1, "note": "a"}}], F, 300, TS)
    out += a.commit(F, 400)
    assert [(m.op, m.last) for m in out] == [("i", False), ("r", True)]
    assert [env(m)["txn"]["i"] for m in out] == [0, 1]  # type: ignore[index]


@pytest.mark.parametrize("rows", [0, 1])
def test_snapshot_marks_come_first_each_its_own_message_at_the_watermark(rows: int) -> None:
    """A keyless table's `replace` (or `replaced`): rowless messages at the watermark's position,
    numbered apart (`chunk`) so their ids never meet the rows after them."""
    a = asm()
    a.gtid("0-1-6", 0, False, F, 100)
    a.query("BEGIN", "", F, 140, 180, TS)
    chunk: list[dict[str, Any]] = [{"after": {"id": 1, "note": "a"}}][:rows]
    out = a.snapshot(T, chunk, F, 200, TS, marks=(envelope.REPLACE, envelope.REPLACED)) + a.commit(F, 300)
    got = [env(m) for m in out]
    assert [e["op"] for e in got] == ["replace", "replaced", "r"][:2 + rows]
    assert {e["scn"] for e in got} == {envelope.scn(F, 200)}
    assert len({m.msg_id for m in out}) == len(out)
    assert "rows" not in got[0] and got[-1]["txn"]["last"] is True  # type: ignore[index]
    assert got[0]["schema"] == T.described and got[0]["pk"] == ["id"]  # a consumer without the table creates it
    assert "schema" not in got[1]


def test_snapshot_outside_a_transaction_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="outside a transaction"):
        asm().snapshot(T, [{"after": {"id": 1, "note": "a"}}], F, 200, TS)


def test_ddl_on_an_ignored_table_is_dropped_from_a_multi_table_statement() -> None:
    a = asm(ignore=frozenset({WATERMARKS}))
    a.gtid("0-1-6", 0, True, F, 100)
    (msg,) = a.query("DROP TABLE binlake.watermarks, shop.orders", "shop", F, 140, 260, TS)
    e = env(msg)
    assert (e["db"], e["table"]) == ("shop", "orders")
    assert msg.subject == "binlake.raw.src.shop.orders"
    assert msg.last and msg.resume == Resume(F, 260, "0-1-6")


def test_ignored_names_resolve_against_the_session_database() -> None:
    a = asm(ignore=frozenset({WATERMARKS}))
    a.gtid("0-1-6", 0, True, F, 100)
    msgs = a.query("DROP TABLE watermarks, orders", "binlake", F, 140, 260, TS)
    assert [(env(m)["db"], env(m)["table"]) for m in msgs] == [("binlake", "orders")]


@pytest.mark.parametrize("sql", ["CREATE TABLE other.watermarks (a INT)", "ALTER TABLE binlake.other ADD c INT"])
def test_ddl_on_tables_not_ignored_is_published(sql: str) -> None:
    a = asm(ignore=frozenset({WATERMARKS}))
    a.gtid("0-1-6", 0, True, F, 100)
    (msg,) = a.query(sql, "shop", F, 140, 260, TS)
    assert env(msg)["table"] in ("watermarks", "other")


@pytest.mark.parametrize(
    "sql",
    ["CREATE TABLE IF NOT EXISTS `binlake`.`watermarks` (src VARCHAR(190) NOT NULL, slot INT NOT NULL, "
     "win VARCHAR(100) NOT NULL, mark CHAR(1) NOT NULL, PRIMARY KEY (src, slot)) ENGINE=InnoDB",
     "ALTER TABLE binlake.watermarks ADD COLUMN x INT"],
)
def test_ddl_naming_only_an_ignored_table_is_dropped(sql: str) -> None:
    a = asm(ignore=frozenset({WATERMARKS}))
    a.gtid("0-1-6", 0, True, F, 100)
    out = a.query(sql, "", F, 140, 260, TS)
    assert not a.in_transaction and a.boundary == Resume(F, 260, "0-1-6")
    assert out == []


# -- CLI progress -----------------------------------------------------------------------------------


def progress(table: str = "orders", **kw: object) -> snap.TableProgress:
    base: dict[str, object] = {"db": "shop", "table": table, "run": "r1", "state": snap.RUNNING}
    return snap.TableProgress(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("done", "total", "width", "expected"),
    [
        (0, 0, 4, "[####] 100.0%"),
        (0, 10, 4, "[....]   0.0%"),
        (5, 10, 10, "[#####.....]  50.0%"),
        (20, 10, 4, "[####] 100.0%"),
        (1, 1000, 10, "[..........]   0.1%"),
        (999, 1000, 10, "[#########.]  99.9%"),
    ],
)
def test_bar(done: int, total: int, width: int, expected: str) -> None:
    assert cli.bar(done, total, width) == expected


def test_bar_default_width() -> None:
    assert cli.bar(1, 2) == "[" + "#" * 14 + "." * 14 + "]  50.0%"


def test_line_of_a_running_table() -> None:
    p = progress(rows=1500, estimate=3000)
    assert cli.line(p, None) == f"{'shop.orders':<40} {cli.bar(1500, 3000)} {'1,500':>12}/{'3,000':<12} running"
    assert cli.line(p, 1234.6).endswith("running  1,235 rows/s")
    assert cli.line(p, 0.0).endswith("running")


def test_line_of_a_running_table_past_its_estimate_shows_no_total() -> None:
    text = cli.line(progress(rows=2000, estimate=10), None)
    assert "  2,000/?" in text and "?%" in text and "100.0%" not in text


def test_line_of_a_done_table_is_full_even_below_the_estimate() -> None:
    text = cli.line(progress(state=snap.DONE, rows=10, estimate=1000), None)
    assert "100.0%" in text and "10/10" in text and text.endswith(" done")


def test_line_shows_the_error() -> None:
    text = cli.line(progress(state=snap.FAILED, rows=0, estimate=5, error="no privilege"), None)
    assert text.endswith("failed  no privilege")


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(cli, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_progress_without_a_terminal_prints_each_finished_table_once(frozen: list[float]) -> None:
    out = io.StringIO()
    pr = cli.Progress(out)
    assert not pr.tty
    pr.draw([progress("a", rows=1), progress("b", rows=1)])
    assert out.getvalue() == ""
    pr.draw([progress("a", state=snap.DONE, rows=5), progress("b", rows=3)])
    pr.draw([progress("a", state=snap.DONE, rows=5), progress("b", rows=4)])
    first = out.getvalue()
    assert first == cli.line(progress("a", state=snap.DONE, rows=5), None) + "\n"
    pr.draw([progress("a", state=snap.DONE, rows=5), progress("b", state=snap.FAILED, rows=4, error="x")])
    pr.draw([progress("a", state=snap.DONE, rows=5), progress("b", state=snap.FAILED, rows=4, error="x")])
    lines = out.getvalue().splitlines()
    assert [ln.split()[0] for ln in lines] == ["shop.a", "shop.b"]
    assert "\x1b" not in out.getvalue()


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_redraws_in_place(frozen: list[float]) -> None:
    out = Tty()
    pr = cli.Progress(out)
    assert pr.tty
    tables = [progress("a", rows=0, estimate=100), progress("b", rows=0, estimate=100)]
    pr.draw(tables)
    first = out.getvalue()
    assert "\x1b[" not in first.replace("\x1b[2K", "")  # no cursor movement on the first draw
    assert first == "".join(f"\x1b[2K{cli.line(p, None)}\n" for p in tables)
    out.seek(0)
    out.truncate()
    frozen[0] += 2.0
    tables = [progress("a", rows=100, estimate=100), progress("b", rows=50, estimate=100)]
    pr.draw(tables)
    second = out.getvalue()
    assert second.startswith("\x1b[2F\x1b[2K")  # back up over the two lines drawn before
    assert second.count("\x1b[2K") == 2
    assert "50 rows/s" in second and "25 rows/s" in second
    out.seek(0)
    out.truncate()
    pr.draw([*tables, progress("c")])
    third = out.getvalue()
    assert third.startswith("\x1b[2F") and third.count("\n") == 3
    out.seek(0)
    out.truncate()
    pr.draw(tables)
    assert out.getvalue().startswith("\x1b[3F")


def test_progress_rate_needs_half_a_second(frozen: list[float]) -> None:
    out = Tty()
    pr = cli.Progress(out)
    pr.draw([progress(rows=0)])
    frozen[0] += 0.4
    pr.draw([progress(rows=1000)])
    assert "rows/s" not in out.getvalue()


# -- watermark write errors --------------------------------------------------------------------


@pytest.mark.parametrize(("code", "words"), [
    (1142, "GRANT CREATE, INSERT, UPDATE ON `binlake`.* TO <user>"),
    (1044, "GRANT CREATE, INSERT, UPDATE ON `binlake`.* TO <user>"),
    (1290, "point BINLAKE_SOURCE_URL at the primary"),
    (1836, "point BINLAKE_SOURCE_URL at the primary"),
])
def test_watermark_write_errors_name_the_fix(code: int, words: str) -> None:
    from services.parser.snapshot.watermarks import Watermarks
    from shared.errors import MissingPrivilege

    err = Watermarks(("binlake", "watermarks"), "main")._error(Exception(code, "denied or read-only"))
    assert isinstance(err, MissingPrivilege)
    assert words in str(err) and "binlake.watermarks" in str(err)


@pytest.mark.parametrize(("do_db", "ignore_db", "refused"), [
    ("", "", False),
    ("shop,binlake", "", False),
    ("shop", "", True),
    ("", "binlake", True),
    ("", "other", False),
])
def test_binlog_filters_that_hide_the_watermarks_are_refused(do_db: str, ignore_db: str, refused: bool) -> None:
    from services.parser.snapshot.watermarks import Watermarks
    from shared.errors import SourceMisconfigured

    marks = Watermarks(("binlake", "watermarks"), "main")
    status = (b"mysql-bin.000001", b"4", do_db.encode(), ignore_db.encode())
    if refused:
        with pytest.raises(SourceMisconfigured, match="leave the watermark database 'binlake' out of the binlog"):
            marks._check_filters(status)
    else:
        marks._check_filters(status)


def test_status_shows_an_unknown_total_until_the_end() -> None:
    from services.ops.status import _snapshot, render

    running = _snapshot({"db": "shop", "table": "o", "run": "r", "state": "running", "rows": 50, "estimate": 10})
    pending = _snapshot({"db": "shop", "table": "p", "run": "r", "state": "pending", "rows": 0, "estimate": 0})
    done = _snapshot({"db": "shop", "table": "d", "run": "r", "state": "done", "rows": 7, "estimate": 100})
    assert (running["estimate"], pending["estimate"], done["estimate"]) == (None, None, 7)
    text = render({"source": "main", "parser": None, "partitions": [], "clients": {}, "streams": {},
                   "snapshots": [running, pending, done]})
    assert "shop.o: running 50/? rows" in text and "shop.p: pending 0/? rows" in text
    assert "shop.d: done 7/7 rows (100%)" in text

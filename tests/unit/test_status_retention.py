"""`binlake status`: how close each client is to BINLAKE_CDC's retention edge."""

from __future__ import annotations

from services.ops.status import _edge, problems, render


def status(clients: dict[str, dict[str, object]], first_seq: int) -> dict[str, object]:
    cdc = {"messages": 10, "bytes": 100, "first_seq": first_seq, "last_seq": first_seq + 9}
    return {"source": "main", "parser": None, "partitions": [], "clients": _edge(clients, cdc),
            "streams": {"BINLAKE_CDC": cdc}}


def client(acked: int) -> dict[str, object]:
    return {"acked": acked, "delivered": acked, "batches": [], "filter": ".*"}


def test_headroom_counts_the_read_messages_the_stream_still_holds() -> None:
    out = render(status({"loader": client(150)}, first_seq=101))
    assert "loader: acked=150 delivered=150 unacked=0 filter=.* retention headroom=50 messages" in out


def test_unread_messages_removed_show_as_a_gap() -> None:
    out = render(status({"loader": client(90)}, first_seq=101))
    assert "RETENTION GAP: 10 unread messages removed" in out


def test_a_client_that_never_acked_starts_at_the_edge() -> None:
    s = status({"new": client(0)}, first_seq=500)
    assert "retention_headroom" not in s["clients"]["new"]  # type: ignore[index]


def test_problems_come_first_in_words() -> None:
    s = status({"loader": client(90)}, first_seq=101)
    s["partitions"] = [{"partition": 3, "owner": None, "tables": 2, "cursor": 5, "stream_id": "old"}]
    s["streams"] = {"BINLAKE_RAW": {"messages": 9, "bytes": 90, "last_seq": 9, "id": "new"},
                    "BINLAKE_CDC": s["streams"]["BINLAKE_CDC"],  # type: ignore[index]
                    "BINLAKE_DLQ": {"messages": 2, "bytes": 20, "last_seq": 2}}
    found = problems(s)
    assert found[0].startswith("no parser has reported a position yet")
    assert any("sink partitions [3] count in an earlier BINLAKE_RAW" in p for p in found), found
    assert any("no sink worker owns partitions [3]" in p for p in found), found
    assert any(p.startswith("2 dead letters in BINLAKE_DLQ") for p in found), found
    assert any(p.startswith("client loader: 10 messages it had not read were removed") for p in found), found
    out = render(s)
    assert out.index("problems") < out.index("lag (") < out.index("clients"), out


def test_a_healthy_pipeline_says_so_and_shows_its_lag_per_stage_and_table() -> None:
    s = status({"loader": client(150)}, first_seq=101)
    s["parser"] = {"file": "mysql-bin.000001", "offset": 4, "gtid": None, "lag_ms": 300, "age_s": 0.5,
                   "active": "up-parser"}
    s["lag"] = {"stages": {"RAW → CDC": {"rows": 0, "messages": 0, "capped": False, "seconds": 0.0},
                           "CDC → loader": {"rows": 1200, "messages": 40, "capped": True, "seconds": 3.25}},
                "tables": {"shop.orders": {"CDC → loader": 1200, "seconds": 3.2}}}
    out = render(s)
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "no problems" in lines
    assert "CDC → loader ≥1,200 3.2" in lines, out
    assert "table RAW → CDC CDC → loader seconds" in lines and "shop.orders 0 1,200 3.2" in lines, out


def test_a_partition_cursor_binlake_did_not_write_is_no_cursor() -> None:
    from services.ops.status import _partition_cursor

    assert _partition_cursor({"seq": "x"}, "sink.main.p3", "binlake_cursors") is None
    assert _partition_cursor({"stream": "BINLAKE_RAW", "seq": 6}, "sink.main.p3", "binlake_cursors") is None
    assert _partition_cursor(None, "sink.main.p3", "binlake_cursors") is None
    cursor = _partition_cursor({"seq": 5, "seen": 9, "stream_id": "s"}, "sink.main.p3", "binlake_cursors")
    assert cursor is not None and cursor.handled == 9


def test_a_partition_cursor_beyond_any_stream_sequence_is_no_cursor() -> None:
    from services.ops.status import _partition_cursor

    for seq in (1.5e300, 1 << 64, -5, float("inf")):
        assert _partition_cursor({"seq": seq}, "sink.main.p3", "binlake_cursors") is None, seq

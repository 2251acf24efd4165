"""`binlake status`: how close each client is to BINLAKE_CDC's retention edge."""

from __future__ import annotations

from services.ops.status import _edge, render


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

"""A cursor's stream identity: which definition of a stream its sequences count in."""

from __future__ import annotations

import pytest

from shared.errors import StreamRedefined
from shared.jetstream import StreamIdentity

NOW = StreamIdentity("2026-11-28T17:00:00.123456+00:00", 1, 40)


def check(recorded: str, cursor: int) -> None:
    NOW.check("BINLAKE_CDC", recorded, cursor, "client 'app'", "binlake rewind app --to-start")


def test_the_same_stream_with_the_cursor_inside_it_goes_on() -> None:
    check(NOW.id, 40)
    check(NOW.id, 0)


def test_a_cursor_that_names_no_stream_yet_goes_on_while_inside_it() -> None:
    check("", 12)


def test_a_stream_defined_again_halts_even_below_its_end() -> None:
    with pytest.raises(StreamRedefined) as err:
        check("2026-11-01T00:00:00+00:00", 3)
    text = str(err.value)
    assert "BINLAKE_CDC was deleted and defined again" in text
    assert "created 2026-11-01T00:00:00+00:00" in text
    assert text.endswith("resume deliberately: binlake rewind app --to-start")


@pytest.mark.parametrize("recorded", ["", NOW.id])
def test_a_cursor_past_the_end_of_the_stream_halts(recorded: str) -> None:
    with pytest.raises(StreamRedefined, match="ends at sequence 40, before client 'app''s position 41"):
        check(recorded, 41)

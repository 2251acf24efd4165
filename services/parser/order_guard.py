"""Order keys never go backwards on a table's subject: halt rather than publish what the lake drops.

The sink and the lake take a message whose order key (`scn`, then `chunk`) does not come after
the last one they applied for its table as already applied. A source whose binlog is not the one
binlake read (another server with the same server_id that `failover` cannot tell apart, binlogs
reset by `RESET MASTER`) numbers its changes from lower positions: published, they would vanish.
The guard compares every message with the last one of its table, read from BINLAKE_RAW the
first time a run meets the table, and refuses the first one that does not come after it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from services.parser.transactions import Outgoing
from shared import envelope
from shared.errors import FatalError

# The order key of the last message stored on a raw subject (None: the subject has none).
LastStored = Callable[[str], Awaitable[tuple[int, int] | None]]


class OrderWentBack(FatalError):
    """A table's order key would go backwards: the source's binlog is not the one binlake read."""


class OrderGuard:
    def __init__(self, last_stored: LastStored) -> None:
        self._last_stored = last_stored
        self._last: dict[str, tuple[int, int] | None] = {}  # raw subject -> order key of its last message

    async def check(self, msg: Outgoing) -> None:
        """Raise OrderWentBack unless `msg` comes after every message of its table."""
        if msg.order is None:
            return
        if msg.subject not in self._last:
            self._last[msg.subject] = await self._last_stored(msg.subject)
        last = self._last[msg.subject]
        if last is not None and msg.order <= last:
            raise OrderWentBack(_explain(msg, last))
        self._last[msg.subject] = msg.order


def _explain(msg: Outgoing, last: tuple[int, int]) -> str:
    scn, chunk = msg.order or (0, 0)
    return (
        f"the order key of {msg.subject} would go backwards: {_key(scn, chunk)} at {msg.resume.file} does not come "
        f"after {_key(*last)}, already published; the lake would drop it as applied, so nothing of it was "
        "published. The source's binlog is not the one binlake read: another server with the same server_id "
        "(give every server of the topology its own server_id, so that the parser moves to it by GTID in a new "
        "epoch), or binary logs reset on the server (RESET MASTER). Point BINLAKE_SOURCE_URL back at the server "
        "binlake read, or fix the server_id, and restart the parser"
    )


def _key(scn: int, chunk: int) -> str:
    epoch, number, offset = scn >> envelope.EPOCH_SHIFT, (scn >> 32) & 0xFFFFFF, scn & 0xFFFFFFFF
    return f"scn {scn} (epoch {epoch}, binlog {number}, offset {offset}{f', chunk {chunk}' if chunk else ''})"

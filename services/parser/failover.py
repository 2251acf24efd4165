"""Pure: may the parser go on where it stopped, on the server it now reaches?

Every resume point records the source's `server_id` (and MySQL's `server_uuid`) and the epoch of
the order keys (`envelope.scn`). `server_id` alone does not tell servers apart: Galera nodes,
clones of a data directory and replicas configured alike share it. On MySQL the `server_uuid`
must be the same too (replication refuses two servers with one uuid); on MariaDB, which has no
uuid, the server must have, at the resume point's file and offset, the GTID state binlake
recorded there (`BINLOG_GTID_POS`): a binlog that is not the one binlake read has another file
there, no event boundary there, or other transactions before it. A parser that finds another
server than the one its last published position came from (a promoted replica behind a DNS name
that moved, or a source URL changed by hand) continues by GTID, with the epoch one higher, so
order keys keep increasing per table and message ids never meet the old server's. That needs
GTIDs (the new server finds the transaction to continue after by its GTID, whatever its binlog
file names are) and a server that has every transaction binlake already published: MariaDB's
GTID state, or MySQL's executed GTID set (tagged GTIDs included).
"""

from __future__ import annotations

from services.parser.transactions import Resume, parse_gtid_state
from shared import envelope
from shared.errors import FatalError
from shared.gtid import GtidError, GtidSet


class SourceSwitched(FatalError):
    """The source is another server, and binlake cannot continue on it without loss."""


def other_history(last: Resume, mariadb: bool, there: str | None, server_uuid: str | None = None) -> bool:
    """Is the server's binlog another than the one `last` was read from, whatever its server_id?

    MySQL: its `server_uuid` is not `last`'s. MariaDB: `there`, the GTID state the server's binlog
    has at `last`'s file and offset (`BINLOG_GTID_POS`; None where it has no event boundary
    there), is not the one recorded in `last` (only a position with a GTID state can be checked).
    """
    if not mariadb:
        return last.uuid is not None and server_uuid is not None and last.uuid != server_uuid
    if not last.gtid:
        return False
    have = parse_gtid_state(there)
    return there is None or any(have.get(domain) != gtid for domain, gtid in parse_gtid_state(last.gtid).items())


def resume_on(last: Resume, server_id: int, mariadb: bool, server_gtid: str | None,
              unfinished: str | None = None, *, moved: bool = False) -> Resume:
    """Where to continue on server `server_id` after `last` (the newest published position;
    `unfinished`: the transaction the stream ends inside of, if it does; `moved`: the server's
    binlog is not the one `last` was read from, see `other_history`).

    The same server (or a position from before binlake recorded servers): `last` itself. Another
    one: `last` in the next epoch, to be found there by its GTID state; SourceSwitched when that
    cannot be done without loss.
    """
    if not moved and (last.server is None or last.server == server_id):
        return Resume(last.file, last.offset, last.gtid, server_id, last.epoch, last.uuid)
    if last.server == server_id:
        where = (f"the source is another server with server_id {server_id} (a Galera node, a clone or a replica "
                 f"configured alike): its binlog at binlake's position {last.file}:{last.offset} is not the one "
                 "binlake read")
    else:
        where = f"the source is now server_id {server_id}, binlake's position {last.file}:{last.offset} is of " \
                f"server_id {last.server}"
    if not last.gtid:
        raise SourceSwitched(
            f"{where}, and that position has no GTID to find the same place on the new server by (binlake "
            "continues on another server only by GTID: gtid_mode=ON on MySQL): point BINLAKE_SOURCE_URL back at "
            f"server_id {last.server}")
    if unfinished is not None:
        # Its rows events are the new server's own, split its own way: the batches already
        # published cannot be matched to them, so finish it where it was started.
        raise SourceSwitched(
            f"{where}, and the stream ends inside transaction {unfinished}, published in part from server_id "
            f"{last.server}: point BINLAKE_SOURCE_URL back at that server until the parser has published it whole, "
            "then switch")
    if last.epoch >= envelope.MAX_EPOCH:
        raise SourceSwitched(f"{where}; binlake has moved {last.epoch} times, the most its order keys can count")
    behind = _behind(last.gtid, server_gtid) if mariadb else _missing(last.gtid, server_gtid)
    if behind:
        raise SourceSwitched(
            f"{where}, and server_id {server_id} lacks transactions binlake already published "
            f"(binlake is at {', '.join(behind)}, the server at {server_gtid or 'nothing'}): it is behind, or not "
            "of the same replication topology; point binlake at a server that has them (let a replica catch up)")
    # Still the old server's position: until a transaction on the new one commits, it is found
    # there by GTID only (a restart before that moves again, into the next epoch).
    return Resume(last.file, last.offset, last.gtid, last.server, last.epoch + 1, last.uuid)


def _behind(published: str, server_gtid: str | None) -> list[str]:
    """MariaDB: the domains' GTIDs the server has not reached."""
    have = parse_gtid_state(server_gtid)
    return [gtid for domain, gtid in parse_gtid_state(published).items() if _seq(have.get(domain)) < _seq(gtid)]


def _missing(published: str, server_gtid: str | None) -> list[str]:
    """MySQL: the transactions of the published set the server has not executed."""
    try:
        lacks = GtidSet.parse(server_gtid).missing(GtidSet.parse(published))
    except GtidError as exc:
        raise SourceSwitched(f"cannot compare GTID sets: {exc}") from None
    return [str(lacks)] if lacks else []


def _seq(gtid: str | None) -> int:
    return int(gtid.rsplit("-", 1)[-1]) if gtid else -1

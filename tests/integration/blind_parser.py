"""`python -m tests.integration.blind_parser`: a parser that takes any server with the server_id
it read for that same server, as binlake did before it compared the binlog at its resume point
(`services.parser.failover.other_history`). What the order guard is the last line against."""

from services.parser import pipeline
from services.parser.__main__ import main
from services.parser.transactions import Resume


def _never(last: Resume, mariadb: bool, there: str | None, server_uuid: str | None = None) -> bool:
    return False


pipeline.other_history = _never  # type: ignore[attr-defined]

if __name__ == "__main__":
    main()

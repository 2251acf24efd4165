"""Pre-flight: refuse, with one line naming the fix, a source binlake cannot read exactly.

Runs through asyncmy before the binlog connection opens, so a misconfigured server stops
the parser before anything is published.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncmy
import asyncmy.errors

from services.parser.transactions import Resume
from shared.errors import MissingPrivilege, SourceMisconfigured
from shared.mysql import TLS_CIPHER_SQL, MysqlUrl, binlog_status_sql, map_mysql_error

_VARIABLES = (
    "log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata", "log_bin_compress",
    "binlog_transaction_compression", "binlog_row_value_options", "gtid_mode", "server_id", "version",
    "gtid_binlog_pos", "lower_case_table_names", "server_uuid",
)


@dataclass(frozen=True)
class SourceInfo:
    mariadb: bool
    version: str
    current: Resume
    earliest: Resume
    binlogs: tuple[str, ...]
    # @@lower_case_table_names: with 1 the server stores (and the binlog's TableMaps carry)
    # database and table names in lower case, however a statement spells them.
    lower_case_table_names: int = 0
    server_id: int = 0  # @@server_id: which server of the topology this is (`failover`)
    server_uuid: str | None = None  # MySQL's @@server_uuid (MariaDB has none)
    gtids: bool = True  # transactions have GTIDs: MariaDB, MySQL with gtid_mode=ON


def check_settings(v: Mapping[str, str]) -> None:
    """Raise SourceMisconfigured for the first setting that would lose or garble changes."""
    def is_on(name: str) -> bool:
        return v.get(name, "").upper() in ("ON", "1")

    if not is_on("log_bin"):
        raise SourceMisconfigured("the binary log is off; start the server with log_bin (e.g. --log-bin=mysql-bin "
                                  "--server-id=1)")
    fmt = v.get("binlog_format", "").upper()
    if fmt != "ROW":
        raise SourceMisconfigured(f"binlog_format is {fmt}; set binlog_format=ROW")
    image = v.get("binlog_row_image", "").upper()
    if image != "FULL":
        raise SourceMisconfigured(f"binlog_row_image is {image}; set binlog_row_image=FULL")
    meta = v.get("binlog_row_metadata")
    if meta is None:
        raise SourceMisconfigured("the server has no binlog_row_metadata; binlake needs MariaDB >= 10.5 or "
                                  "MySQL >= 8.0.14 with binlog_row_metadata=FULL")
    if meta.upper() != "FULL":
        raise SourceMisconfigured(f"binlog_row_metadata is {meta.upper()}; set binlog_row_metadata=FULL")
    if "PARTIAL_JSON" in v.get("binlog_row_value_options", "").upper():
        raise SourceMisconfigured("binlog_row_value_options is PARTIAL_JSON; set binlog_row_value_options=''")


_GRANT_ON_ALL = re.compile(r"^GRANT\s+(.*?)\s+ON\s+\*\.\*\s+TO\s", re.I | re.S)


def check_grants(grants: list[str]) -> None:
    """Raise MissingPrivilege unless the grants include replication and binlog monitoring."""
    privileges: set[str] = set()
    for line in grants:
        m = _GRANT_ON_ALL.match(line)
        if m:
            privileges |= {p.strip().upper() for p in m.group(1).split(",")}
    if "ALL PRIVILEGES" in privileges:
        return
    if any(not _GRANT_ON_ALL.match(g) and re.match(r"^GRANT\s+`", g) for g in grants):
        return  # privileges through roles: the binlog connection itself will tell
    missing = []
    if not privileges & {"REPLICATION SLAVE", "REPLICATION REPLICA"}:
        missing.append("REPLICATION SLAVE")
    if not privileges & {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"}:
        missing.append("REPLICATION CLIENT")
    if missing:
        raise MissingPrivilege(
            f"the source user lacks {' and '.join(missing)}; run GRANT {', '.join(missing)} ON *.* TO <user>"
        )


async def _rows(cur: Any, sql: str) -> list[tuple[Any, ...]]:
    await cur.execute(sql)
    return list(await cur.fetchall())


async def inspect_source(dsn: MysqlUrl) -> SourceInfo:
    """Connect, check settings and privileges, and read the current and earliest positions."""
    where = dsn.address
    try:
        conn = await asyncmy.connect(**dsn.asyncmy_settings(), autocommit=True)
    except (asyncmy.errors.MySQLError, OSError) as exc:
        raise map_mysql_error(exc, where) from exc
    try:
        async with conn.cursor() as cur:
            dsn.check_tls((await _rows(cur, TLS_CIPHER_SQL) or [("", "")])[0][1])
            names = ",".join(f"'{n}'" for n in _VARIABLES)
            variables = {str(k).lower(): str(val) for k, val in
                         await _rows(cur, f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")}
            check_settings(variables)
            check_grants([str(r[0]) for r in await _rows(cur, "SHOW GRANTS")])
            mariadb = "mariadb" in variables.get("version", "").lower()
            status = await _rows(cur, binlog_status_sql(variables.get("version", "")))
            logs = await _rows(cur, "SHOW BINARY LOGS")
    except asyncmy.errors.MySQLError as exc:
        raise map_mysql_error(exc, where) from exc
    finally:
        conn.close()
    if not status or not logs:
        raise SourceMisconfigured("the server reports no binary log status; enable log_bin and restart it")
    gtid_on = mariadb or variables.get("gtid_mode", "").upper() == "ON"
    if mariadb:
        gtid: str | None = variables.get("gtid_binlog_pos", "") or None
    else:  # SHOW BINARY LOG STATUS: File, Position, Do_DB, Ignore_DB, Executed_Gtid_Set
        gtid = str(status[0][4] or "").replace("\n", "") if gtid_on and len(status[0]) > 4 else None
    return SourceInfo(
        mariadb=mariadb, version=variables.get("version", ""),
        current=Resume(str(status[0][0]), int(status[0][1]), gtid),
        earliest=Resume(str(logs[0][0]), 4, None),
        binlogs=tuple(str(r[0]) for r in logs),
        lower_case_table_names=int(variables.get("lower_case_table_names") or 0),
        server_id=int(variables.get("server_id") or 0),
        server_uuid=variables.get("server_uuid") or None,
        gtids=gtid_on,
    )


async def gtid_state_at(dsn: MysqlUrl, file: str, offset: int) -> str | None:
    """MariaDB: the GTID state of the server's binlog at `file`:`offset` (None where it has no such
    file or no event boundary there). Reads that file up to `offset`; the parser asks once per run."""
    try:
        conn = await asyncmy.connect(**dsn.asyncmy_settings(), autocommit=True)
    except (asyncmy.errors.MySQLError, OSError) as exc:
        raise map_mysql_error(exc, dsn.address) from exc
    try:
        async with conn.cursor() as cur:
            await cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, offset))
            row = await cur.fetchone()
    except asyncmy.errors.MySQLError as exc:
        raise map_mysql_error(exc, dsn.address) from exc
    finally:
        conn.close()
    return None if row is None or row[0] is None else str(row[0])

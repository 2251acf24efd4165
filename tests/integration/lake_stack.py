"""The whole stack for lake tests: parser, sink, meta and store as processes, loaders on demand.

The lake is read without Spark here (pyiceberg on the hadoop warehouse): the commit table
for progress, the changelog for exactly-once checks, the current tables cell by cell.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import json
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats
import nats.js.errors
import pyarrow as pa
from pyiceberg.table import StaticTable

from services.launcher.processes import ServiceProcess
from services.loader.naming import BOOK_NAMESPACE, COMMITS_TABLE, HELD_TABLE, RESNAPSHOTS_TABLE, TableNames
from shared import keys
from shared.errors import NatsUnavailable
from shared.jetstream import server_urls
from shared.meta_client import MetaClient
from shared.mysql import display, mysql_quote
from shared.rpc import RpcError
from shared.store_client import StoreClient
from shared.subjects import Names
from tests.integration.support import StoredMsg, read_stream_sync, wait_until
from tests.servers import MariaDB

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ServiceFactory = Callable[..., ServiceProcess]
ROW_OPS = ("i", "u", "d")


async def _services_answer(nats_url: str) -> bool:
    nc = await nats.connect(server_urls(nats_url))
    try:
        await MetaClient(nc).get("probe")
        try:
            await StoreClient(nc, "probe").rollback()
        except RpcError as exc:
            if exc.code != "unknown_client":
                raise
        return True
    finally:
        await nc.close()


async def _cursor_values(nats_url: str, names: Sequence[str]) -> list[dict[str, Any] | None]:
    nc = await nats.connect(server_urls(nats_url))
    try:
        kv = await nc.jetstream().key_value(Names().cursors_bucket)
        out: list[dict[str, Any] | None] = []
        for name in names:
            try:
                entry = await kv.get(name)
            except nats.js.errors.KeyNotFoundError:
                out.append(None)
                continue
            value = json.loads(entry.value or b"null")
            out.append(value if isinstance(value, dict) else None)
        return out
    finally:
        await nc.close()


def cursor_values(nats_url: str, *names: str) -> list[dict[str, Any] | None]:
    """The JSON values at `names` in the cursors bucket (None where there is none)."""
    return asyncio.run(_cursor_values(nats_url, names))


def services_answer(nats_url: str) -> bool:
    try:
        return asyncio.run(_services_answer(nats_url))
    except (NatsUnavailable, RpcError, TimeoutError, nats.errors.Error):
        return False


def iceberg_table(folder: Path) -> StaticTable | None:
    """The newest committed state of a hadoop-catalog table folder (None if it does not exist)."""
    hint = folder / "metadata" / "version-hint.text"
    if not hint.exists():
        return None
    version = hint.read_text().strip()
    return StaticTable.from_metadata(str(folder / "metadata" / f"v{version}.metadata.json"))


def read_table(folder: Path) -> pa.Table | None:
    table = iceberg_table(folder)
    return None if table is None else table.scan().to_arrow()


@dataclass
class Stack:
    mariadb: MariaDB
    db: str
    nats_url: str
    data_dir: Path
    factory: ServiceFactory
    batch_rows: int = 3000
    env_extra: dict[str, str] = field(default_factory=dict)
    loaders: list[ServiceProcess] = field(default_factory=list)

    @property
    def warehouse(self) -> str:
        return str(self.data_dir / "lake")

    @property
    def env(self) -> dict[str, str]:
        return {"BINLAKE_DATA_DIR": str(self.data_dir), "BINLAKE_FLUSH_S": "1",
                "BINLAKE_BATCH_ROWS": str(self.batch_rows), "BINLAKE_METRICS_PORT": "-1",
                "BINLAKE_MASTER": "local[2]", "BINLAKE_MERGE_S": "5", **self.env_extra}

    def start_loader(self) -> ServiceProcess:
        proc = self.factory("services.loader", f"loader-{len(self.loaders) + 1}", **self.env)
        self.loaders.append(proc)
        return proc

    @property
    def loader(self) -> ServiceProcess:
        return self.loaders[-1]

    def names(self, table: str, db: str | None = None) -> TableNames:
        return TableNames("lake", db or self.db, table)

    def committed(self) -> int:
        """The newest batch the lake committed (0 before the first)."""
        rows = read_table(Path(self.warehouse) / BOOK_NAMESPACE / COMMITS_TABLE)
        if rows is None or rows.num_rows == 0:
            return 0
        return int(max(rows.column("seq").to_pylist()))

    def held(self) -> list[tuple[str, str, str]]:
        """(db, table, reason) of every table the loader has set aside."""
        rows = read_table(Path(self.warehouse) / BOOK_NAMESPACE / HELD_TABLE)
        if rows is None:
            return []
        return [(r["db"], r["table"], r["reason"]) for r in rows.to_pylist() if r["env"] is None]

    def current(self, table: str) -> pa.Table | None:
        n = self.names(table)
        return read_table(Path(n.path(self.warehouse, n.current_name)))

    def changelog(self, table: str) -> pa.Table | None:
        n = self.names(table)
        return read_table(Path(n.path(self.warehouse, n.changelog_name)))

    def cdc(self) -> list[StoredMsg]:
        """This test's row changes in BINLAKE_CDC, in stream order."""
        return [m for m in read_stream_sync(self.nats_url, "BINLAKE_CDC")
                if m.env.get("db") == self.db and m.env["op"] in ROW_OPS]

    def wait_cdc(self, rows: int, timeout: float = 300) -> list[StoredMsg]:
        """Until BINLAKE_CDC holds `rows` row changes of this test's database."""
        def enough() -> list[StoredMsg] | None:
            msgs = self.cdc()
            return msgs if sum(len(m.env["rows"]) for m in msgs) >= rows else None

        msgs: list[StoredMsg] = wait_until(enough, timeout, f"{rows} row changes in BINLAKE_CDC", interval=2)
        assert sum(len(m.env["rows"]) for m in msgs) == rows, "more row changes in BINLAKE_CDC than were made"
        return msgs

    def wait_loaded(self, upto: int, timeout: float = 600) -> None:
        """Until the lake has committed CDC sequence `upto`; the loader must stay up."""
        def caught_up() -> bool:
            assert self.loader.running, f"the loader died:\n{self.loader.output[-5000:]}"
            return self.committed() >= upto

        try:
            wait_until(caught_up, timeout, f"the lake to commit CDC sequence {upto}", interval=2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the lake recorded {self.committed()}; "
                                 f"the loader said:\n{self.loader.output[-6000:]}") from None

    def wait_resnapshots(self, timeout: float = 300) -> None:
        """Until every re-snapshot the lake asked for (a DDL it could not follow exactly) has run and the
        lake committed everything BINLAKE_CDC holds of this test's database: its rows come after the
        workload's last change."""
        def done() -> bool:
            rows = read_table(Path(self.warehouse) / BOOK_NAMESPACE / RESNAPSHOTS_TABLE)
            asked = [] if rows is None else rows.to_pylist()
            if not all(r["filed"] for r in asked):
                return False
            names = [keys.snapshot_request("main", r["id"]) for r in asked]
            names += [keys.snapshot_table("main", r["db"], r["tbl"]) for r in asked]
            states = [None if v is None else v.get("state") for v in cursor_values(self.nats_url, *names)]
            assert "failed" not in states, f"a re-snapshot failed: {list(zip(names, states, strict=True))}"
            return all(s not in (None, "new") for s in states[:len(asked)]) and \
                all(s == "done" for s in states[len(asked):])

        wait_until(done, timeout, "every re-snapshot the lake asked for", interval=2)
        self.wait_loaded(max((m.seq for m in read_stream_sync(self.nats_url, "BINLAKE_CDC")
                              if m.env.get("db") == self.db), default=0))

    def wait_merged(self, tables: list[str], timeout: float = 300) -> None:
        """Until no table has un-merged changes (the current tables alone equal the source)."""
        def merged() -> bool:
            assert self.loader.running, f"the loader died:\n{self.loader.output[-5000:]}"
            assert not (held := self.held()), f"tables set aside by the loader: {held}"
            for t in tables:
                n = self.names(t)
                cur, log = (iceberg_table(Path(n.path(self.warehouse, x))) for x in (n.current_name,
                                                                                    n.changelog_name))
                if log is None:
                    continue
                if cur is None:
                    return False
                def order(tbl: StaticTable) -> str:
                    snap = tbl.current_snapshot()
                    if snap is None or snap.summary is None:
                        return ""
                    return str(snap.summary.additional_properties.get("binlake.order", ""))
                a, m = order(log), order(cur)
                if a != m and _rows_after(log, m):
                    return False
            return True

        wait_until(merged, timeout, "the lake's current tables to be merged", interval=2)


def _rows_after(changelog: StaticTable, order: str) -> bool:
    scn, _, seq = (order or "0:0").partition(":")
    rows = changelog.scan(selected_fields=("_binlake_op", "_binlake_scn", "_binlake_seq")).to_arrow().to_pylist()
    return any(r["_binlake_op"] != "ddl" and (r["_binlake_scn"], r["_binlake_seq"]) > (int(scn), int(seq))
               for r in rows)


def commits(proc: ServiceProcess) -> list[int]:
    """The sequences a loader process logged as committed (`loader.committed`)."""
    return [int(e["seq"]) for e in events(proc, "loader.committed")]


def events(proc: ServiceProcess, name: str) -> list[dict[str, Any]]:
    out = []
    for line in proc.output.splitlines():
        if f'"{name}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _cell(value: Any) -> Any:
    """Source (PyMySQL) and lake (pyiceberg/Arrow) values in one comparable form."""
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, bytes) and len(value) == 1:  # BIT(1)
        return value[0]
    if isinstance(value, decimal.Decimal) and value == value.to_integral_value() and value.as_tuple().exponent == 0:
        return int(value)
    return value


def assert_cells_equal(stack: Stack, table: str) -> None:
    """Every row, every column of the current table equals the source (rows as a multiset)."""
    conn = stack.mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION time_zone = '+00:00'")
            cur.execute(f"SELECT * FROM {mysql_quote(stack.db)}.{mysql_quote(table)}")
            names = [d[0] for d in cur.description]
            source = Counter(tuple(_cell(v) for v in row) for row in cur.fetchall())
    finally:
        conn.close()
    lake = stack.current(table)
    assert lake is not None, f"no lake table for {table}"
    assert lake.column_names == names, f"{table}: lake columns {lake.column_names}, source {names}"
    got = Counter(tuple(_cell(r[c]) for c in names) for r in lake.to_pylist())
    assert got == source, f"{table}: {sum((got - source).values())} lake rows not in the source, " \
                          f"{sum((source - got).values())} source rows not in the lake; e.g. " \
                          f"{list(got - source)[:3]} / {list(source - got)[:3]}"


def assert_verify_equal(spark: SparkSession, stack: Stack, tables: Sequence[str] = ()) -> None:
    """`binlake verify`'s comparison in this test process's Spark session: every named table (default:
    every table the lake holds) equals the source. The command itself is tested in test_verify and test_up."""
    from services.loader.spark import CatalogConfig, register
    from services.loader.verify import connect, verify

    catalog = CatalogConfig(name=f"lake_{uuid.uuid4().hex[:12]}", warehouse=stack.warehouse,
                            options={"cache-enabled": "false"})
    register(spark, catalog)
    conn = connect(stack.mariadb.dsn())
    try:
        results = verify(spark, conn, catalog.name, [display(stack.db, t) for t in tables])
    finally:
        conn.close()
    report = "\n".join(line for r in results for line in r.lines())
    assert results and all(r.equal for r in results), report

"""The whole stack for lake tests: parser, sink, meta and store as processes, loaders on demand."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
from pyspark.sql import SparkSession

from services.loader.lake import COMMIT_FILE
from services.loader.verify import verify
from shared.errors import NatsUnavailable
from shared.meta_client import MetaClient
from shared.rpc import RpcError
from shared.store_client import StoreClient
from tests.integration.support import ServiceProcess, StoredMsg, read_stream_sync, wait_until
from tests.servers import MariaDB

ServiceFactory = Callable[..., ServiceProcess]
ROW_OPS = ("i", "u", "d")


# -- the stack --------------------------------------------------------------------------------


async def _services_answer(nats_url: str) -> bool:
    nc = await nats.connect(nats_url)
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


def services_answer(nats_url: str) -> bool:
    try:
        return asyncio.run(_services_answer(nats_url))
    except (NatsUnavailable, RpcError, TimeoutError, nats.errors.Error):
        return False


@dataclass
class Stack:
    mariadb: MariaDB
    db: str
    nats_url: str
    data_dir: Path
    factory: ServiceFactory
    batch_rows: int = 3000
    loaders: list[ServiceProcess] = field(default_factory=list)

    @property
    def warehouse(self) -> str:
        return str(self.data_dir / "warehouse")

    @property
    def env(self) -> dict[str, str]:
        return {"BINLAKE_DATA_DIR": str(self.data_dir), "BINLAKE_FLUSH_S": "1",
                "BINLAKE_BATCH_ROWS": str(self.batch_rows), "BINLAKE_METRICS_PORT": "-1",
                "BINLAKE_MASTER": "local[2]"}

    def start_loader(self) -> ServiceProcess:
        proc = self.factory("services.loader", f"loader-{len(self.loaders) + 1}", **self.env)
        self.loaders.append(proc)
        return proc

    @property
    def loader(self) -> ServiceProcess:
        return self.loaders[-1]

    def committed(self) -> int:
        """The lake's commit pointer (0 before the first commit)."""
        path = Path(self.warehouse) / COMMIT_FILE
        try:
            return int(json.loads(path.read_text())["seq"])
        except FileNotFoundError:
            return 0

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
        """Until the lake's commit pointer reaches CDC sequence `upto`; the loader must stay up."""
        def caught_up() -> bool:
            assert self.loader.running, f"the loader died:\n{self.loader.output[-5000:]}"
            return self.committed() >= upto

        wait_until(caught_up, timeout, f"the lake to commit CDC sequence {upto}", interval=2)


def commits(proc: ServiceProcess) -> list[int]:
    """The sequences a loader process logged as committed (`loader.committed`)."""
    out = []
    for line in proc.output.splitlines():
        if '"loader.committed"' in line:
            try:
                out.append(int(json.loads(line)["seq"]))
            except (ValueError, KeyError):
                pass
    return out



def assert_verify_equal(spark: SparkSession, stack: Stack, tables: list[str]) -> None:
    results = verify(spark, stack.mariadb.dsn(), stack.warehouse, [f"{stack.db}.{t}" for t in tables])
    assert [r.table for r in results] == [f"{stack.db}.{t}" for t in tables]
    bad = [r.line() for r in results if not r.equal]
    assert not bad, "\n".join(bad)



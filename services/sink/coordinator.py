"""Actor: run one PartitionWorker per owned partition and follow membership changes.

When the member view or the count of tables per partition changes, partitions this worker
no longer owns are cancelled and new ones started. Overlap during a rebalance is harmless
(the fence orders every subject); a partition halted by a dead letter stays stopped until
the process restarts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from services.sink.partition import PartitionHalted, PartitionWorker
from shared.actor import Latest, RestartPolicy, supervise_call
from shared.assignment import owned
from shared.health import Conditions
from shared.metrics import Registry


class Coordinator:
    def __init__(self, view: Latest[frozenset[str]], tables: Latest[dict[int, int]], me: str, partitions: int,
                 make_worker: Callable[[int], PartitionWorker], restart: RestartPolicy, registry: Registry,
                 health: Conditions | None = None) -> None:
        self._view = view
        self._tables = tables
        self._members: frozenset[str] | None = None
        self._me = me
        self._n = partitions
        self._make = make_worker
        self._restart = restart
        self._health = health
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.halted: set[int] = set()
        self._rebalances = registry.counter("sink_rebalances_total", "Changes of this worker's partition set")
        self._owned = registry.gauge("sink_partitions_owned", "Partitions this worker runs")
        self._halted_gauge = registry.gauge("sink_partition_halted", "1 while a dead letter stops the partition")
        self.log = structlog.get_logger().bind(actor="coordinator")

    async def run(self) -> None:
        view_task: asyncio.Task[frozenset[str]] | None = None
        tables_task: asyncio.Task[dict[int, int]] | None = None
        try:
            while True:
                view_task = view_task or asyncio.create_task(self._view.get())
                tables_task = tables_task or asyncio.create_task(self._tables.get())
                done, _ = await asyncio.wait([view_task, tables_task, *self._tasks.values()],
                                             return_when=asyncio.FIRST_COMPLETED)
                for p, task in list(self._tasks.items()):
                    if task in done:
                        del self._tasks[p]
                        task.result()  # a fatal error of a partition ends the process
                if view_task in done:
                    self._members = view_task.result()
                    view_task = None
                if tables_task in done:
                    tables_task = None
                if self._members is not None and (view_task is None or tables_task is None):
                    self._rebalance(self._members, self._tables.peek() or {})
        finally:
            for t in (view_task, tables_task):
                if t is not None:
                    t.cancel()
            await self._stop(set(self._tasks))

    def _rebalance(self, members: frozenset[str], tables: dict[int, int]) -> None:
        mine = owned(members, self._me, self._n, tables)
        lost = set(self._tasks) - mine
        gained = mine - set(self._tasks) - self.halted
        if lost or gained:
            self._rebalances.inc()
            self.log.info("sink.rebalance", members=len(members), owned=sorted(mine), lost=sorted(lost),
                          gained=sorted(gained), tables=sum(tables.get(p, 0) for p in mine))
        for p in lost:
            self._tasks.pop(p).cancel()
        for p in sorted(gained):
            self._tasks[p] = asyncio.create_task(self._partition(p), name=f"partition-{p}")
        self._owned.set(len(mine))

    async def _partition(self, p: int) -> None:
        worker = self._make(p)
        try:
            await supervise_call(worker.run, self._restart, worker.log, self._health, f"partition {p}")
        except asyncio.CancelledError:
            if self._health is not None:
                self._health.room()  # a full JetStream it waited for is reported by those that still write
            raise
        except PartitionHalted:
            self.halted.add(p)
            self._halted_gauge.set(1, partition=str(p))

    async def _stop(self, partitions: set[int]) -> None:
        tasks = [self._tasks.pop(p) for p in partitions]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

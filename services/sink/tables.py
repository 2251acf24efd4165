"""Actor: how many tables each raw partition holds, counted from BINLAKE_RAW's subjects.

The coordinator spreads tables, not partitions, over the workers: with round-robin, two
workers and eight tables, six tables may hash to one worker's partitions. Every worker counts
for itself. The counts change only when a table is first written or ages out of the stream,
so the workers agree again within one refresh; meanwhile a partition may run on two workers
for a moment, which the fence makes harmless.
"""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext

from shared.actor import Latest
from shared.assignment import tables_per_partition
from shared.subjects import Names


class PartitionTables:
    def __init__(self, js: JetStreamContext, names: Names, source: str, every_s: float,
                 out: Latest[dict[int, int]]) -> None:
        self._js = js
        self._names = names
        self._source = source
        self._every = every_s
        self._out = out
        self.log = structlog.get_logger().bind(actor="partition_tables")

    async def count(self) -> dict[int, int] | None:
        """Tables per partition now; None when BINLAKE_RAW cannot be asked (the last count stays)."""
        try:
            info = await self._js.stream_info(self._names.raw_stream,
                                              subjects_filter=self._names.raw_source_filter(self._source))
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            self.log.warning("sink.tables_not_counted", error=repr(exc), hint="the last split of tables is kept")
            return None
        return tables_per_partition(self._names, self._source, info.state.subjects or {})

    async def run(self) -> None:
        last = self._out.peek()
        while True:
            counts = await self.count()
            if counts is not None and counts != last:
                self._out.set(counts)
                last = counts
            await asyncio.sleep(self._every)

"""Table maintenance on a schedule: compact data and delete files, expire old snapshots.

Merge-on-read leaves many small files (one per append, a delete file per merge); readers
slow down as they pile up. Every `every_s` the loader compacts each table it writes and
expires snapshots older than `keep_s` (the time-travel window). Compaction commits a
`replace` snapshot; it is stamped with the table's marker, so the current snapshot always
carries `binlake.seq` and expiry can never take the last marked snapshot away.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from services.loader.lake import Lake
    from services.loader.tables import LakeTable

log = structlog.get_logger()


class Maintenance:
    def __init__(self, lake: Lake, every_s: float, keep_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._lake = lake
        self._every_s = every_s
        self._keep_s = keep_s
        self._clock = clock
        self._last = clock()

    def maybe_run(self) -> None:
        if self._every_s <= 0 or self._clock() - self._last < self._every_s:
            return
        self.run()

    def run(self) -> None:
        self._last = self._clock()
        for table in self._lake.loaded():
            self.table(table)

    def table(self, table: LakeTable) -> None:
        started = time.monotonic()
        ice = self._lake.ice
        actions = ice.actions()
        for ident, marker in ((table.names.changelog, table.appended), (table.names.current, table.merged)):
            if marker.batch == 0:
                continue
            jtable = ice.java_table(ident)
            props = marker.props()
            rewrite = actions.rewriteDataFiles(jtable).option("min-input-files", "5")
            for key, value in props.items():
                rewrite = rewrite.snapshotProperty(key, value)
            rewrite.execute()
            if ident == table.names.current:
                deletes = actions.rewritePositionDeletes(jtable).option("rewrite-all", "true")
                for key, value in props.items():
                    deletes = deletes.snapshotProperty(key, value)
                deletes.execute()
            older = int((time.time() - self._keep_s) * 1000)
            actions.expireSnapshots(ice.java_table(ident)).expireOlderThan(older).retainLast(2).execute()
            ice.refresh(ident)
        log.info("lake.maintained", table=f"{table.names.db}.{table.names.table}",
                 seconds=round(time.monotonic() - started, 2))

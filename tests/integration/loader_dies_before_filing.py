"""`python -m tests.integration.loader_dies_before_filing`: the loader, dying (exit 9, no cleanup) when
it is about to file the re-snapshot requests its lake recorded. That is the state a kill between a
DDL's Iceberg commit (and its ack) and the filing leaves behind; a timed kill cannot hit it."""

from __future__ import annotations

import os

from services.loader import __main__ as entry
from services.loader.loader import Loader

_file = Loader._file_resnapshots


async def _dies(self: Loader) -> None:
    if self._lake.resnapshot:
        os._exit(9)
    await _file(self)


setattr(Loader, "_file_resnapshots", _dies)  # noqa: B010 (mypy: a method is not assignable)

if __name__ == "__main__":
    entry.main()

"""Where binlake keeps what it prepares once per machine or image (the MySQL root, the Spark
class archive): ``$XDG_CACHE_HOME/binlake``, default ``~/.cache/binlake``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "binlake"

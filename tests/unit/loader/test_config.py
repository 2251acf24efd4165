"""LoaderConfig: bad settings fail at start with the variable to fix."""

from __future__ import annotations

import pytest

from services.loader.config import LoaderConfig
from shared.errors import ConfigError


@pytest.mark.parametrize(("env", "message"), [
    ({"BINLAKE_BATCH_ROWS": "0"}, "BINLAKE_BATCH_ROWS must be >= 1"),
    ({"BINLAKE_MERGE_ROWS": "0"}, "BINLAKE_MERGE_ROWS must be >= 1"),
    ({"BINLAKE_CATCH_UP_ROWS": "0"}, "BINLAKE_CATCH_UP_ROWS must be >= 1"),
    ({"BINLAKE_WRITE_THREADS": "0"}, "BINLAKE_WRITE_THREADS must be >= 1"),
    ({"BINLAKE_WRITE_THREADS": "1000000"}, "BINLAKE_WRITE_THREADS must be at most 64"),
    ({"BINLAKE_CATCH_UP_ROWS": str(10**20)}, "BINLAKE_CATCH_UP_ROWS must be at most 100,000,000"),
    ({"BINLAKE_BATCH_ROWS": str(10**9)}, "BINLAKE_BATCH_ROWS must be at most 100,000,000"),
    ({"BINLAKE_FLUSH_S": "0"}, "BINLAKE_FLUSH_S must be > 0"),
    ({"BINLAKE_FLUSH_S": "61"}, "BINLAKE_FLUSH_S must be at most 60"),
    ({"BINLAKE_MERGE_S": "-1"}, "BINLAKE_MERGE_S must be > 0"),
    ({"BINLAKE_CATALOG_TYPE": "rest"}, "BINLAKE_CATALOG_TYPE=rest needs BINLAKE_CATALOG_URI"),
])
def test_bad_settings_say_what_to_fix(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LoaderConfig.from_env(env)


def test_the_defaults_load() -> None:
    cfg = LoaderConfig.from_env({})
    assert cfg.flush_s <= 60 and cfg.catalog_type == "hadoop"

"""The loader's log4j2 file: this process's own, owner-only, at a name no other local user can plant;
and the lake's files, which Hadoop writes with the process's umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from services.loader.spark import quiet_log4j


def test_the_file_is_private_and_its_name_unguessable() -> None:
    path = quiet_log4j()
    assert quiet_log4j() == path  # one per process
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and os.stat(path).st_uid == os.getuid()
    with open(path) as f:
        assert "rootLogger.level" in f.read()
    other = subprocess.run([sys.executable, "-c", "from services.loader.spark import quiet_log4j; "
                            "p = quiet_log4j(); import os; print(p, os.path.exists(p))"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert other[0] != path and other[1] == "True"
    assert not os.path.exists(other[0])  # removed when that process ended


def test_hadoop_writes_with_the_process_umask() -> None:
    """What the loader's Spark gives Hadoop as `fs.permissions.umask-mode` (Hadoop's own default is 022)."""
    out = subprocess.run([sys.executable, "-c", "import os; os.umask(0o077); "
                          "from services.loader.spark import process_umask; print(process_umask())"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "077"

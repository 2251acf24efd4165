"""docs/configuration.md is generated from the config classes and lists every setting, and no
file of the project names a `BINLAKE_*` setting that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

from services.ops import config_reference
from shared.subjects import STREAMS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"\bBINLAKE_[A-Z0-9_]*[A-Z0-9]\b")
STREAM_NAMES = {f"BINLAKE_{s.upper()}" for s in STREAMS}
TEST_SWITCHES = {"BINLAKE_GOLDEN_UPDATE"}  # tests/unit/parser/test_ddl_golden.py writes its expected files


def test_the_reference_is_what_the_config_classes_say() -> None:
    assert PAGE.read_text() == config_reference.render(), \
        "docs/configuration.md is stale: python -m services.ops.config_reference > docs/configuration.md"


def test_every_setting_has_a_meaning_and_a_row() -> None:
    page = PAGE.read_text()
    for name in config_reference.settings():
        assert f"| `{name}` |" in page, name


def _named(paths: list[Path]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in paths:
        for name in NAME.findall(path.read_text(errors="replace")):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_no_file_names_a_setting_that_does_not_exist() -> None:
    files = [p for d in ("services", "shared", "deploy", "docs", "bench") for p in (ROOT / d).rglob("*")
             if p.is_file() and p.suffix in (".py", ".md", ".yml", ".yaml", ".sh", ".toml", ".conf", "")
             and "__pycache__" not in p.parts]
    files += [ROOT / "README.md", ROOT / "deploy" / "Dockerfile"]
    known = config_reference.settings()
    known |= {f"{n}_FILE" for n in known} | STREAM_NAMES | TEST_SWITCHES
    unknown = {name: where for name, where in _named(files).items() if name not in known}
    assert not unknown, f"settings that do not exist (or lack a config field / an entry in OTHERS): {unknown}"


def test_a_field_without_a_comment_is_refused() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Bare:
        documented: int = 1  # says what it is
        bare: int = 2

    docs = config_reference.field_docs(Bare)
    assert docs == {"documented": "says what it is", "bare": ""}

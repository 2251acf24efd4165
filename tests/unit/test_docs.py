"""The manual keeps up with the code: every error class binlake defines has its section in
docs/troubleshooting.md (and the page names no class that is gone), and every relative link in
README.md and docs/*.md points at a file, and a heading, that exists."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from shared.errors import BinlakeError

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TROUBLESHOOTING = DOCS / "troubleshooting.md"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", re.S)  # a run of backticks closes only a run as long
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def error_classes() -> set[str]:
    """The name of every class in services/ and shared/ that derives from BinlakeError, read with ast
    (importing every module would start pyspark): a class counts when one of its bases does."""
    bases: dict[str, set[str]] = {}
    for path in sorted([*(ROOT / "services").rglob("*.py"), *(ROOT / "shared").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                names = bases.setdefault(node.name, set())
                names.update(b.id if isinstance(b, ast.Name) else b.attr
                             for b in node.bases if isinstance(b, ast.Name | ast.Attribute))
    found = {BinlakeError.__name__}
    while more := {name for name, of in bases.items() if of & found} - found:
        found |= more
    return found


def subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    out: set[type[BaseException]] = set()
    for sub in cls.__subclasses__():
        out |= {sub, *subclasses(sub)}
    return out


def prose(text: str) -> str:
    """Markdown without its code blocks and code spans: a link or heading there is text."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def troubleshooting_headings() -> list[str]:
    return re.findall(r"^### +(\S+?)[ \t]*$", FENCE.sub("", TROUBLESHOOTING.read_text()), re.M)


def test_the_ast_scan_finds_every_error_class_python_knows() -> None:
    # The modules that define errors outside shared/errors.py and import nothing heavy.
    for module in ("shared.rpc", "shared.objects", "shared.meta_client", "services.store.batches",
                   "services.meta.backend", "services.parser.order_guard", "services.parser.failover"):
        importlib.import_module(module)
    assert {c.__name__ for c in subclasses(BinlakeError)} <= error_classes()


def test_every_error_class_has_its_section_in_troubleshooting() -> None:
    missing = error_classes() - set(troubleshooting_headings())
    assert not missing, f"docs/troubleshooting.md lacks a '### <ClassName>' section for {sorted(missing)}"


def test_troubleshooting_names_only_classes_that_exist() -> None:
    headings = troubleshooting_headings()
    gone = set(headings) - error_classes()
    assert not gone, f"docs/troubleshooting.md has '### ' sections for classes that do not exist: {sorted(gone)}"
    doubled = {h for h in headings if headings.count(h) > 1}
    assert not doubled, f"docs/troubleshooting.md has two sections for {sorted(doubled)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue  # http://, mailto: ...: not ours to check
        path = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        if not path.exists():
            broken.append(f"{target}: no file {path}")
        elif parts.fragment and path.suffix == ".md" and parts.fragment not in anchors(path):
            broken.append(f"{target}: no heading #{parts.fragment} in {path.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)

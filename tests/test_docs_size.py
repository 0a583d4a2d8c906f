"""The docs stay readable in an hour, and every link among them lands.

``docs/`` holds what a user or a contributor needs now; dated notebook material (the
replays behind a rule, what was tried and not kept, superseded tables) lives in
``lab/notes/`` and the dated log in ``lab/results.md``. These tests read the files only.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
ARCHITECTURE = REPO / "ARCHITECTURE.md"
DOCS_MAX_BYTES = 160_000  # docs/*.md together; move dated material to lab/notes/
ARCHITECTURE_MAX_BYTES = 15_000
ARCHITECTURE_MAX_LINE = 600  # characters

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def linked_files() -> list[Path]:
    """The Markdown whose relative links are checked: the docs, the log and the notebooks."""
    notes = sorted((REPO / "lab" / "notes").glob("*.md"))
    return [*sorted(DOCS.glob("*.md")), REPO / "lab" / "results.md", *notes]


def anchors(path: Path) -> set[str]:
    """The heading anchors GitHub gives a Markdown file (lower case, punctuation dropped,
    spaces as hyphens, ``-1``, ``-2`` … for repeats), headings inside fences left out."""
    found: set[str] = set()
    seen: Counter[str] = Counter()
    for match in re.finditer(r"^#{1,6} +(.*?)\s*#*\s*$", FENCE.sub("", path.read_text()), re.MULTILINE):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1)).lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no such heading)")
    return broken


def test_docs_markdown_is_within_its_budget() -> None:
    sizes = {p.name: p.stat().st_size for p in DOCS.glob("*.md")}
    total = sum(sizes.values())
    largest = ", ".join(f"{name} {size:,}" for name, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
    assert total <= DOCS_MAX_BYTES, (
        f"docs/*.md total {total:,} bytes, over {DOCS_MAX_BYTES:,} (largest: {largest}); "
        "move dated notebook material to lab/notes/ and leave the current statement"
    )


def test_architecture_is_short_with_readable_lines() -> None:
    text = ARCHITECTURE.read_text()
    size = len(text.encode())
    long_lines = [n for n, line in enumerate(text.splitlines(), start=1) if len(line) > ARCHITECTURE_MAX_LINE]
    assert size <= ARCHITECTURE_MAX_BYTES, f"ARCHITECTURE.md: {size:,} bytes, over {ARCHITECTURE_MAX_BYTES:,}"
    assert not long_lines, f"ARCHITECTURE.md lines over {ARCHITECTURE_MAX_LINE} characters: {long_lines}"


@pytest.mark.parametrize("path", linked_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_land(path: Path) -> None:
    broken = broken_links(path)
    assert not broken, f"{path.relative_to(REPO)} links to: {broken}"


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    """A check that cannot fail is a defect: a missing file and a missing heading are caught,
    a repeated heading's second anchor and a link inside a fence are not errors."""
    (tmp_path / "other.md").write_text("# Title\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[a](other.md#twice-1) [b](other.md#title) [c](https://example.com/x)\n"
        "[d](missing.md) [e](other.md#nowhere)\n```\n[f](inside-a-fence.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md (no such file)", "other.md#nowhere (no such heading)"]

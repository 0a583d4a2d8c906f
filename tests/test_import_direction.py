"""``lab/`` and ``tools/`` import one way only: a lab instrument may use a tool
(``lab.rpc_bench`` runs ``tools.netdelay``'s relay), a tool never imports the lab. Tools
are small scripts run by path (``python tools/netdelay.py``), where ``lab`` is not on the
path; a cycle between the two would also leave no order to read or move them in. Read
from the source with ``ast``, so an import inside a function counts as much as one at
the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"


def lab_imports(source: str, name: str = "<source>") -> list[str]:
    """Each import of ``lab`` (or a module under it) in ``source``, with its line."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        found += [f"line {node.lineno}: {m}" for m in modules if m.split(".")[0] == "lab"]
    return found


@pytest.mark.parametrize("path", sorted(TOOLS.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_tool_imports_the_lab(path: Path):
    found = lab_imports(path.read_text(encoding="utf-8"), str(path))
    assert not found, f"{path.relative_to(ROOT)} imports the lab: {found} (move what it needs into tools/)"


def test_the_checker_sees_what_it_is_meant_to_find():
    """A test that cannot fail is a defect: each way in is caught, look-alikes are not."""
    caught = [
        "from lab import llamacpp",
        "import lab.llamacpp",
        "import os, lab",
        "def f():\n    from lab.llamacpp import build\n",
    ]
    for source in caught:
        assert lab_imports(source), source
    missed = [
        "from tools.netdelay import Relay",
        "import laboratory",
        "from .lab import x",
        "text = 'from lab import llamacpp'",
    ]
    for source in missed:
        assert not lab_imports(source), source

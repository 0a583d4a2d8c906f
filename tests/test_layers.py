"""The package's layers: every import inside ``edgespec`` points down (or sideways within
its own layer), and no module imports itself back through others. Read from the source
with ``ast``, so an import inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "edgespec"

# Lower number = lower layer. A module may import from its own layer or any lower one.
LAYERS = {
    "edgespec.errors": 0,
    "edgespec.progress": 0,
    "edgespec.models": 1,
    "edgespec.runtime": 2,
    "edgespec.decoding": 3,
    "edgespec.api": 4,
    "edgespec.bench": 5,
    "edgespec.ui": 5,
    "edgespec.server": 6,
    "edgespec.cli": 7,
    "edgespec.__main__": 8,
}
# Stand apart: they run on the system Python before anything is installed, or around a
# process llama.cpp may kill. They import the standard library and each other only.
STANDALONE = {"edgespec.bootstrap", "edgespec.crashguard", "edgespec.host"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int | None:
    for prefix, rank in sorted(LAYERS.items(), key=lambda item: -len(item[0])):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def imports_of(path: Path) -> set[str]:
    """Every edgespec module ``path`` imports (``from edgespec.x import y`` names x, or x.y
    when y is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("edgespec"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edgespec"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                as_path = PACKAGE.parent / Path(*candidate.split("."))
                found.add(
                    candidate if as_path.with_suffix(".py").exists() or as_path.is_dir() else node.module
                )
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: imports_of(path) - {name} for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    unplaced = [m for m in MODULES if m != "edgespec" and m not in STANDALONE and layer_of(m) is None]
    assert not unplaced, f"add these to LAYERS: {unplaced}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "edgespec"))
def test_imports_point_down(module):
    if module in STANDALONE:
        others = GRAPH[module] - STANDALONE
        assert not others, f"{module} must use the standard library only: {others}"
        return
    rank = layer_of(module)
    upward = sorted(i for i in GRAPH[module] if i != "edgespec" and (layer_of(i) or 0) > rank)
    assert not upward, f"{module} (layer {rank}) imports from a layer above: {upward}"


def test_no_import_cycle():
    """Depth-first search for a back edge among modules (package __init__ re-exports
    count as edges too)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if nxt not in GRAPH or nxt == "edgespec":
                continue
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_the_checker_catches_an_upward_import_and_a_cycle(tmp_path):
    """The walk must see what it is meant to find (a test that cannot fail is a defect)."""
    fake = tmp_path / "edgespec" / "decoding"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text("def f():\n    from edgespec.api import EdgeSpec\n")
    found = imports_of(fake / "x.py")
    assert "edgespec.api" in found and layer_of("edgespec.api") > layer_of("edgespec.decoding.x")
    assert layer_of("edgespec.decoding.engine") == 3 and layer_of("edgespec.cli.main") == 7

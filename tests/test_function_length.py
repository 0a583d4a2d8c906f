"""No function in ``edgespec/`` runs over 60 lines, from its ``def`` line to its last line:
past that a function does more than one thing, and its parts want names of their own.
Read from the source with ``ast``: nested functions and methods count on their own, as
well as inside the function that holds them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "edgespec"
MAX_LINES = 60


def long_functions(source: str, name: str = "<source>") -> list[tuple[str, int, int]]:
    """(function, line of its ``def``, its length in lines) for each over ``MAX_LINES``."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # ``lineno`` is the ``def`` line: decorators above it do not count.
            length = node.end_lineno - node.lineno + 1
            if length > MAX_LINES:
                found.append((node.name, node.lineno, length))
    return found


def test_no_function_in_the_package_is_over_60_lines():
    found = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, line, length in long_functions(path.read_text(encoding="utf-8"), str(path))
    ]
    assert not found, f"split these into functions of {MAX_LINES} lines at most:\n" + "\n".join(found)


def test_the_checker_counts_from_def_to_the_last_line():
    """A test that cannot fail is a defect: 60 lines pass, 61 do not, decorators aside."""
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    assert not long_functions(f"@decorator\ndef fits():\n{body}")  # 60 lines
    indented = body.replace("    ", "        ")
    over = f"class C:\n    async def m(self):\n{indented}        y = 0\n"
    assert long_functions(over) == [("m", 2, 61)]

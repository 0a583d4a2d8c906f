"""One answer, one path: every front end asks for an answer with ``EdgeSpec.submit`` and
asks the API (never the engine or its table) about the answers there are. Read from the
source, so a second relay or a reach past the API fails here the day it is written."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import edgespec

PACKAGE = Path(edgespec.__file__).parent
FRONT_ENDS = ("server", "ui")
# What reaching past the API looks like: the pair's engine, its table, its loop.
PAST_THE_API = re.compile(r"\.engine\b|\.slots\b|\.turn\b|decoding\.(slots|turns|engine)\b")


def reaches_past_the_api(source: str) -> list[str]:
    """The lines of ``source`` that read the engine, the table or the loop."""
    return [line.strip() for line in source.splitlines() if PAST_THE_API.search(line)]


def submit_functions(source: str, where: str) -> list[str]:
    """Every function named ``submit`` defined in ``source``, as ``where:Class.submit``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            found += [
                f"{where}:{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == "submit"
            ]
    top = ast.parse(source).body
    found += [
        f"{where}:{n.name}"
        for n in top
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "submit"
    ]
    return found


def modules(*parts: str) -> list[Path]:
    return sorted((PACKAGE.joinpath(*parts)).rglob("*.py"))


def test_no_front_end_reads_the_engine_or_the_table():
    reaches = {}
    for front_end in FRONT_ENDS:
        for path in modules(front_end):
            found = reaches_past_the_api(path.read_text())
            if found:
                reaches[str(path.relative_to(PACKAGE))] = found
    assert not reaches, f"ask the API instead (EdgeSpec.occupancy, answers, call, ...): {reaches}"


def test_one_submit_between_the_front_ends_and_the_table():
    found = []
    for path in modules():
        found += submit_functions(path.read_text(), str(path.relative_to(PACKAGE)))
    assert found == ["api.py:EdgeSpec.submit"], found


def test_no_engine_queue_is_left():
    assert not [p for p in modules() if "EngineQueue" in p.read_text()]


def test_the_checks_catch_what_they_are_for():
    """Each check fails on the shapes it exists to catch (and passes on look-alikes)."""
    assert reaches_past_the_api("busy = lm.engine.slots.busy")
    assert reaches_past_the_api("from edgespec.decoding.slots import QueueFull")
    assert reaches_past_the_api("lm.engine.turn.run(call)")
    assert not reaches_past_the_api("total = lm.occupancy().total  # engine thread, slots")
    relay = "class EngineQueue:\n    def submit(self, job):\n        return job\n"
    assert submit_functions(relay, "server/queue.py") == ["server/queue.py:EngineQueue.submit"]
    assert submit_functions("def submit(job):\n    pass\n", "x.py") == ["x.py:submit"]
    assert submit_functions("demo.submit(fn)\n", "ui/layout.py") == []

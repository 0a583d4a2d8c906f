"""The package holds no lab: nothing under ``edgespec/`` imports ``lab`` (the instruments
that run from a checkout only) or names a program those instruments drive (npm and its
agents, a Chromium, cmake) as something to run. Read from the source with ``ast``: a name
in prose (a docstring, an error message) is not a command, a string that is one whole
program name or path is."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "edgespec"
# A program named as a command: the bare name (what subprocess or shutil.which is given),
# or a path ending in it.
DRIVEN = re.compile(r"(^|/)(npm|npx|node|cmake|chromium|chromium-browser|chrome|google-chrome)$")
DRIVER_MODULES = ("lab", "playwright", "selenium", "pyppeteer")


def drives(source: str, name: str = "<source>") -> list[str]:
    """What in ``source`` imports the lab or a browser driver, or names a driven program."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] if node.level == 0 else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            # import lab inside a string: code run by ``python -c``
            modules = re.findall(r"(?:^|\s|;)(?:from|import)\s+([\w.]+)", text)
            if DRIVEN.search(text):
                found.append(f"line {node.lineno}: runs {text!r}")
        else:
            continue
        found += [f"line {node.lineno}: imports {m}" for m in modules if m.split(".")[0] in DRIVER_MODULES]
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_drives_no_other_program_and_imports_no_lab(path: Path):
    found = drives(path.read_text(encoding="utf-8"), str(path))
    assert not found, f"{path.relative_to(ROOT)}: {found} (such instruments belong in lab/)"


def test_the_checker_sees_what_it_is_meant_to_find():
    """A test that cannot fail is a defect: each way in is caught, prose is not."""
    caught = [
        "from lab.llamacpp import build",
        "import lab",
        "def f():\n    from lab import agents\n",
        "from playwright.sync_api import sync_playwright",
        "import subprocess\nsubprocess.run(['cmake', '--build', 'b'])",
        "import shutil\nshutil.which('npm')",
        "CHROMIUM = '/usr/bin/chromium'",
        "code = 'from lab.llamacpp import vendored_source; vendored_source()'",
    ]
    for source in caught:
        assert drives(source), source
    prose = [
        '"""Built with cmake from the sources; agents come from npm."""',
        "message = 'run python -m lab.app_cost from a checkout'",
        "x = 'llamacpp:tokens_predicted_total'",
    ]
    for source in prose:
        assert not drives(source), source


def test_only_the_package_is_installed():
    """The lab and the tools stay in the checkout: the build finds ``edgespec*`` only."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["edgespec*"]
    assert (ROOT / "lab" / "__init__.py").is_file()
    assert not any(p.name == "lab" for p in PACKAGE.rglob("*") if p.is_dir())


TOOLS = ROOT / "tools"


def lab_imports(source: str, name: str = "<source>") -> list[str]:
    """What ``source`` imports of ``lab``: the one direction ``lab/`` and ``tools/`` may not
    take (``lab/`` imports ``tools/``, never the reverse)."""
    return [found for found in drives(source, name) if re.search(r"imports lab(\.|$)", found)]


@pytest.mark.parametrize("path", sorted(TOOLS.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_tool_imports_the_lab(path: Path):
    found = lab_imports(path.read_text(encoding="utf-8"), str(path))
    assert not found, f"{path.relative_to(ROOT)} imports the lab: {found} (move what it needs into tools/)"


def test_the_direction_check_sees_a_tool_importing_the_lab():
    assert lab_imports("def f():\n    from lab.llamacpp import build\n")
    assert lab_imports("import os, lab")
    assert not lab_imports("import labels\nfrom tools import netdelay\n")

"""llama.cpp's libraries are loaded before numpy's in a process that runs models: on an H200
machine a CUDA build crashed at model load whenever numpy came first (edgespec.runtime.preload).
Checked on the real command, supervised child included, from Python's own import log."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def finished_imports(args: list[str]) -> list[str]:
    """Module names in the order their imports finished (a supervised command: its child too)."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    command = [sys.executable, *args]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("import time:")]
    return [line.rsplit("|", 1)[1].strip() for line in lines]


@pytest.mark.parametrize(
    "args",
    [
        # resolves the default pair: its GGUFs must be in the cache
        pytest.param(["-m", "edgespec", "costs", "show"], marks=pytest.mark.needs_models),
        ["-m", "edgespec", "generate", "--help"],
        # the set-up's smoke check: a crash there would fail a good CUDA build
        ["-m", "edgespec.runtime.smoke", "--help"],
        # the Python API, imported first thing by a user's program
        ["-c", "from edgespec import EdgeSpec"],
    ],
)
def test_the_command_loads_llama_cpp_before_numpy(args):
    names = finished_imports(args)
    assert "llama_cpp.llama_cpp" in names and "numpy" in names
    # The module that loads libllama finished before numpy was even imported.
    assert names.index("llama_cpp.llama_cpp") < names.index("numpy")

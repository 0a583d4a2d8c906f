"""``make setup-test``'s steps after ``make setup``: what only the tests need, each skipped
with a line where it cannot be had (the tests that need it then skip too).

1. Debian's Chromium, for the browser tests (and ``python -m lab.app_cost``), where apt
   can install it;
2. llama.cpp's sources unpacked from the llama-cpp-python sdist (no build), for the
   tests that read its real chat templates.

    .venv/bin/python -m lab.setup_tests
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from edgespec.bootstrap import llama_cpp_source, say

CHROMIUM = Path("/usr/bin/chromium")


def ensure_browser() -> None:
    if CHROMIUM.exists():
        return
    if shutil.which("apt-get") is None:
        say("no apt-get here: the browser test will be skipped")
        return
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    say("installing Debian's chromium for the browser test")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in ([*prefix, "apt-get", "update", "-qq"],
                [*prefix, "apt-get", "install", "-y", "-qq", "chromium"]):  # fmt: skip
        if subprocess.run(cmd, env=env, check=False, stdout=subprocess.DEVNULL).returncode != 0:
            say(f"'{' '.join(cmd)}' failed: the browser test will be skipped")
            return


def ensure_llama_cpp_source() -> None:
    """The tests check the reasoning parser on the chat templates llama.cpp ships: its
    sources are unpacked into the cache once."""
    if (llama_cpp_source() / "CMakeLists.txt").is_file():
        return
    from lab.llamacpp import vendored_source

    try:
        vendored_source()
    except (subprocess.CalledProcessError, OSError, StopIteration, tarfile.TarError):
        say("llama.cpp's sources could not be fetched: the real-template tests will be skipped")


def main() -> None:
    ensure_browser()
    ensure_llama_cpp_source()


if __name__ == "__main__":
    main()

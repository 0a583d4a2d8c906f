"""Where edgespec keeps its files on this machine, how it writes them, and the CPU's feature
flags.

The standard library only: set-up (before anything is installed), the crash guard (around a
process llama.cpp may kill) and the runtime share this one definition of each.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def home() -> Path:
    """The cache of models, wheels, cost profiles and crash logs (``EDGESPEC_HOME``)."""
    return Path(os.environ.get("EDGESPEC_HOME") or Path.home() / ".cache" / "edgespec")


def cpuinfo_text() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def cpu_flags(text: str | None = None) -> frozenset[str]:
    """Every feature flag the kernel reports for the first CPU (x86 "flags", arm64
    "Features"); empty where there is no /proc/cpuinfo (macOS)."""
    text = cpuinfo_text() if text is None else text
    for line in text.splitlines():
        if line.startswith(("flags", "Features")) and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def write_atomically(path: Path, text: str | bytes) -> None:
    """A unique temporary file in the same directory, then a rename: readers see the old
    file or the new one, never a mixture, whatever else writes at the same time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

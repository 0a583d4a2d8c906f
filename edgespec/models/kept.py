"""Facts read from large model files, kept on disk (``EDGESPEC_HOME/facts``) and keyed by
the files' identity (resolved path, size, modification and change times): reading a
GGUF's header steps over its token and merge lists, 150k entries each, in Python, and
comparing a pair's token texts reads them again, about 0.7 s at every start of a process
on a 2-core CPU, while the facts change only with the files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from edgespec.host import home, write_atomically

T = TypeVar("T")
FORMAT = 1  # raised whenever what is kept changes its shape or meaning
# Smaller files are read as fast as a kept fact is: tests make many, and none is kept.
MIN_KEPT_BYTES = 16 << 20
# Copies of models come and go (a folder of GGUFs tried out, tests): the oldest facts go.
MOST_KEPT = 256


def file_identity(path: Path, st: os.stat_result | None = None) -> list:
    st = st or path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def kept(kind: str, files: list[list], compute: Callable[[], T]) -> T:
    """``compute()``, or what it gave before for the same files (``file_identity`` of each).
    A kept value that cannot be read is computed again; one that cannot be written is not
    kept. What ``compute`` raises is never kept."""
    if any(size < MIN_KEPT_BYTES for _, size, *_ in files):
        return compute()
    key = [FORMAT, kind, files]
    path = home() / "facts" / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]}.json"
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        record = json.loads(path.read_text())
        if record["key"] == key:
            return record["value"]
    value = compute()
    with contextlib.suppress(OSError):
        write_atomically(path, json.dumps({"key": key, "value": value}))
        _prune(path.parent)
    return value


def _prune(folder: Path) -> None:
    facts = []
    for entry in folder.glob("*.json"):
        with contextlib.suppress(OSError):
            facts.append((entry.stat().st_mtime_ns, entry))
    for _, entry in sorted(facts)[: max(0, len(facts) - MOST_KEPT)]:
        with contextlib.suppress(OSError):
            entry.unlink()

"""Decode rates measured here: once a model has answered on this machine, what it measured
beats any prediction (``speed.py`` predicts a model never loaded).

One small JSON file, ``EDGESPEC_HOME/rates.json``, maps a model file's identity (resolved
path, size, modification time: a re-pulled or replaced file starts afresh) to the decode
rates of its last answers. The figure shown is their median: one answer slowed by
another process, or sped up by a copy-heavy edit, moves it little. Short answers are not
kept: their rate is mostly the first steps' noise.

Recording a rate must never break an answer: a file that cannot be read is started over,
one that cannot be written is left as it was, and nothing here raises.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import threading
import time
from pathlib import Path

from edgespec.host import home, write_atomically

FORMAT = 1  # raised whenever what the file holds changes its shape or meaning
KEPT_ANSWERS = 9  # the median of this many recent answers is the figure
MIN_TOKENS = 16  # answers shorter than this say more about noise than about the model
MOST_FILES = 64  # model files come and go (folders of GGUFs tried out): the oldest go

_lock = threading.Lock()  # one process's threads write in turn (the file is rewritten whole)


def rates_file() -> Path:
    return home() / "rates.json"


def _key(model_file: Path) -> str | None:
    """The file's identity, or None where it cannot be read (it moved, or never was)."""
    try:
        st = model_file.stat()
        return f"{model_file.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    except OSError:
        return None


def _read() -> dict[str, dict]:
    """Every kept record by file identity; empty when the file is missing or garbled."""
    try:
        data = json.loads(rates_file().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
        return {}
    return {k: v for k, v in data["files"].items() if _valid(v)}


def _valid(record: object) -> bool:
    if not isinstance(record, dict) or not isinstance(record.get("rates"), list):
        return False
    return all(_usable(r) for r in record["rates"]) and isinstance(record.get("updated", 0), (int, float))


def _usable(rate: object) -> bool:
    return isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0


def record_rate(model_file: Path, tokens_per_second: float, tokens: int) -> None:
    """Keep one answer's decode-phase rate (tokens after the first over the time after the
    first: ``Stats.decode_tokens_per_second``) for ``model_file``, the target that
    answered. Answers of fewer than ``MIN_TOKENS`` tokens, and rates that are not a
    positive number, are ignored. Never raises."""
    if not _usable(tokens_per_second) or not isinstance(tokens, int) or tokens < MIN_TOKENS:
        return
    key = _key(Path(model_file))
    if key is None:
        return
    with _lock, contextlib.suppress(OSError, ValueError, TypeError):
        files = _read()
        record = files.pop(key, {"rates": []})
        rates = [*record["rates"], float(tokens_per_second)][-KEPT_ANSWERS:]
        files[key] = {"rates": rates, "updated": time.time()}
        newest = sorted(files.items(), key=lambda item: item[1].get("updated", 0))[-MOST_FILES:]
        write_atomically(rates_file(), json.dumps({"format": FORMAT, "files": dict(newest)}, indent=1))


def measured_rate(model_file: Path) -> float | None:
    """The median decode rate of ``model_file``'s last answers here (tokens/s), or None
    where it has not answered (or its file changed since)."""
    key = _key(Path(model_file))
    record = _read().get(key) if key is not None else None
    if not record or not record["rates"]:
        return None
    return float(statistics.median(record["rates"]))


__all__ = ["KEPT_ANSWERS", "MIN_TOKENS", "measured_rate", "rates_file", "record_rate"]

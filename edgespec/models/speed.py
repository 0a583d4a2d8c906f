"""How fast a model decodes on this machine, predicted without loading it.

On a CPU, decoding one token reads every weight of the model once, and memory bandwidth,
not arithmetic, sets the pace: a target's time per token is about its file's bytes times
the seconds this machine takes per byte. That figure comes from what was measured here —
a cost profile of a model large enough for its bytes to set its pace (its time per pass
over its file's size; a tiny model's pass is mostly fixed cost), else a short probe that
reads a buffer with every core. Speculation speeds decoding up from there; a
recommendation does not count on it.

The rate floors (what counts as usable for chat, for quality, for speed) and the probe's
calibration are data, in ``data/speed.toml``.
"""

from __future__ import annotations

import math
import os
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from edgespec.models.catalog import CatalogModel

SPEED_FILE = Path(__file__).parent / "data" / "speed.toml"
PROBE_BYTES = 256 << 20  # eight times a large L3 cache: the probe reads memory, not cache
PROBE_ROUNDS = 5  # timed passes; the fastest is kept (a disturbance only slows one down)


@dataclass(frozen=True)
class Speed:
    """Seconds this machine takes per byte of weights for one decoded token, and where that
    figure comes from (one phrase for the output: "qwen2.5-coder-1.5b's cost profile")."""

    seconds_per_byte: float
    source: str

    def rate(self, model: CatalogModel) -> float | None:
        """Tokens per second ``model`` decodes alone, before speculation; None when its size
        is unknown."""
        return self.rate_for_bytes(model.size)

    def rate_for_bytes(self, model_bytes: int) -> float | None:
        """Tokens per second a model file of ``model_bytes`` decodes alone; None when the
        size is unknown. A pass costs a fixed time (``pass_overhead_s``) plus the time to
        read the weights: a tiny model's bytes alone would predict it far too fast."""
        if not model_bytes > 0 or not self.seconds_per_byte > 0:
            return None
        return 1.0 / (pass_overhead_s() + model_bytes * self.seconds_per_byte)


@dataclass(frozen=True)
class Floors:
    """The slowest decode rate (tokens/s, before speculation) a recommendation accepts,
    by what the user wants: ``rates`` by purpose, ``default`` the purpose without one."""

    rates: dict[str, float]
    default: str
    meaning: dict[str, str]  # purpose → one phrase for the help and the output


@dataclass(frozen=True)
class Calibration:
    """What turns the probe's bandwidth into llama.cpp's seconds per byte: one model's
    measured time per token beside the probe's bandwidth, on the same machine."""

    cpu: str
    model: str
    model_bytes: int
    seconds_per_token: float
    probe_bytes_per_second: float

    @property
    def efficiency(self) -> float:
        """llama.cpp's effective bandwidth while decoding (its time per token less a pass's
        fixed cost), as a share of the probe's."""
        reading = self.seconds_per_token - pass_overhead_s()
        return self.model_bytes / reading / self.probe_bytes_per_second


@cache
def _data() -> dict:
    with SPEED_FILE.open("rb") as fh:
        return tomllib.load(fh)


def floors() -> Floors:
    data = _data()["floors"]
    return Floors(
        rates={k: float(v) for k, v in data["rates"].items()},
        default=data["default"],
        meaning=dict(data["meaning"]),
    )


def calibration() -> Calibration:
    return Calibration(**_data()["calibration"])


def pass_overhead_s() -> float:
    """What a decode pass costs besides reading the weights (``[small_models]`` in
    ``data/speed.toml``)."""
    return float(_data()["small_models"]["pass_overhead_s"])


def min_profile_bytes() -> int:
    """The smallest model whose measured time per token predicts other models' (see
    ``[profiles]`` in ``data/speed.toml``)."""
    return int(_data()["profiles"]["min_bytes"])


def from_pass(seconds: float, model_bytes: int, source: str) -> Speed | None:
    """The speed one measured single-token pass over a model file of ``model_bytes`` implies
    (its time less a pass's fixed cost, over its bytes); None where the model is too small
    for its pass to be bound by its bytes (its time is mostly the fixed cost of a pass, and
    would predict larger models several times too slow)."""
    if not (math.isfinite(seconds) and seconds > 0 and model_bytes >= max(1, min_profile_bytes())):
        return None
    return Speed(max(seconds - pass_overhead_s(), seconds / 2) / model_bytes, source)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def probe_bandwidth(nbytes: int = PROBE_BYTES, rounds: int = PROBE_ROUNDS) -> float | None:
    """Bytes per second this machine reads from memory with every core, as llama.cpp's
    threads do: a float32 sum over ``nbytes`` split into one slice per core (numpy lets go
    of the GIL while it sums), the fastest of ``rounds`` passes after one untimed pass. None
    when the buffer cannot be had. Under a second on a 2-core machine."""
    import numpy as np  # here, not at the top: a process that loads a model imports llama.cpp first

    try:
        buffer = np.ones(nbytes // 4, dtype=np.float32)
    except MemoryError:
        return None
    cores = _cores()
    slices = np.array_split(buffer, cores)
    best = math.inf
    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(np.sum, slices))  # the first pass pays for the threads' start
        for _ in range(rounds):
            start = time.perf_counter()
            list(pool.map(np.sum, slices))
            best = min(best, time.perf_counter() - start)
    return buffer.nbytes / best if best > 0 else None


def probe_speed(bandwidth: float | None = None) -> Speed | None:
    """The speed the probe's bandwidth predicts, through the calibration; the probe runs
    unless its ``bandwidth`` is given."""
    bandwidth = probe_bandwidth() if bandwidth is None else bandwidth
    if not bandwidth or not math.isfinite(bandwidth):
        return None
    known = calibration()
    source = f"a memory probe ({bandwidth / 1e9:.0f} GB/s, calibrated on {known.model} on an {known.cpu})"
    return Speed(1.0 / (bandwidth * known.efficiency), source)


def format_rate(rate: float) -> str:
    """A rate as the output says it: "1.4", "12"."""
    return f"{rate:.1f}" if rate < 10 else f"{rate:.0f}"

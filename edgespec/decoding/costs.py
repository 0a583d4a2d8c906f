"""What speculation costs on this machine, measured: the online cost model.

* ``target``: seconds of one target pass as a function of the tokens it verifies
  (k = γ + 1). On a CPU the curve is steep (k tokens cost nearly k times one token);
  on a GPU it is nearly flat. It is measured, never assumed.
* ``draft``: seconds of one draft-model decode as a function of its batch size (1 while
  drafting; more when the draft's cache catches up with the committed text).
* ``overhead``: seconds of Python work per step outside llama.cpp.

A warm-up measures every batch size once; every step then updates the points it used
(exponential averages, so the model follows a machine whose speed drifts). Profiles are
kept on disk per model, device and thread count, so the next load starts warm.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.models import store
from edgespec.progress import count_bar
from edgespec.runtime.model import Model

_EMA = 0.3  # weight of a new measurement
_LEVEL_SHARE = 0.3  # of a multi-token pass's surprise, the part blamed on the machine's speed


class CostCurve:
    """Seconds per decode for batch sizes 1..k_max; unmeasured sizes are interpolated.

    An estimate is ``level × shape[k]``. ``level`` follows the machine's speed, which
    drifts (other processes, thermal limits, a VM's stolen time) and moves every batch size
    alike; ``shape`` is the curve's form. Were each point learned on its own, a machine that
    slows down while only single-token passes are observed would price one token above five
    (stale) ones, and the controller would start drafting exactly when it can least afford
    to. So a single-token observation moves only the level, and a larger one mostly its own
    point and a little of the level."""

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.shape = np.full(k_max + 1, np.nan)
        self.level = 1.0
        self._table: np.ndarray | None = None  # estimates for every k, rebuilt after a change

    def observe(self, k: int, seconds: float) -> None:
        if not 1 <= k <= self.k_max or not seconds > 0:
            return
        if math.isnan(self.shape[k]):
            self.shape[k] = seconds / self.level
        else:
            ratio = seconds / (self.level * self.shape[k])
            to_level = 1.0 if k == 1 else _LEVEL_SHARE
            self.level *= ratio ** (_EMA * to_level)
            self.shape[k] *= ratio ** (_EMA * (1 - to_level))
        self._table = None

    def measured(self, k: int) -> bool:
        return 1 <= k <= self.k_max and not math.isnan(self.shape[k])

    def set(self, k: int, seconds: float) -> None:
        """Make the estimate for k exactly ``seconds`` (warm-up, and tests that inject costs)."""
        self.shape[k] = seconds / self.level
        self._table = None

    def table(self) -> np.ndarray:
        """Estimates for k = 0..k_max (index k), computed once per change and in one
        vectorised pass: the controller prices every γ at every step, and this runs after
        every observation, so it must cost microseconds."""
        if self._table is None:
            self._table = self._estimates(np.arange(self.k_max + 1))
        return self._table

    def estimate(self, k: int) -> float:
        if 0 <= k <= self.k_max:
            return float(self.table()[k])
        return float(self._estimates(np.array([k]))[0])

    def _estimates(self, ks: np.ndarray) -> np.ndarray:
        known = np.flatnonzero(~np.isnan(self.shape))
        if known.size == 0:
            return np.full(ks.shape, math.nan)
        values = self.level * self.shape[known]
        if known.size == 1:  # one point: assume cost proportional to k (pessimistic on GPUs)
            return values[0] * ks / known[0]
        # Inside the measured range: linear interpolation (exact at measured points).
        # Below the first point np.interp would hold the first value flat, which is what we
        # want for k = 0..first (never used for pricing). Beyond the last point: extrapolate
        # along the last segment, never downward.
        estimates = np.interp(ks, known, values)
        a, b = known[-2], known[-1]
        slope = max(0.0, (values[-1] - values[-2]) / (b - a))
        beyond = ks > b
        estimates[beyond] = values[-1] + slope * (ks[beyond] - b)
        return estimates.astype(float)

    def to_json(self) -> dict[str, float]:
        return {str(k): float(self.level * s) for k, s in enumerate(self.shape) if not math.isnan(s)}

    def load_json(self, data: dict[str, float]) -> None:
        for k, s in data.items():
            if 1 <= int(k) <= self.k_max:
                self.shape[int(k)] = s / self.level
        self._table = None


@dataclass
class CostModel:
    target: CostCurve
    draft: CostCurve
    overhead: float = 0.002
    profile_path: Path | None = None
    measured_at: float = field(default_factory=time.time)

    @classmethod
    def empty(cls, k_max: int) -> CostModel:
        return cls(target=CostCurve(k_max), draft=CostCurve(k_max))

    def observe_overhead(self, seconds: float) -> None:
        if seconds >= 0:
            self.overhead = (1 - _EMA) * self.overhead + _EMA * seconds

    # -- persistence --------------------------------------------------------------------

    def save(self) -> None:
        """Write the measured points, keeping those of the profile on disk that this model
        does not cover (an engine allowing a larger γ measured them)."""
        if self.profile_path is None:
            return
        data = self._read() or {}
        target, draft = data.get("target", {}), data.get("draft", {})
        target.update(self.target.to_json())
        draft.update(self.draft.to_json())
        self.profile_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.profile_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"target": target, "draft": draft, "overhead": self.overhead}))
        tmp.replace(self.profile_path)

    def _read(self) -> dict | None:
        if self.profile_path is None or not self.profile_path.is_file():
            return None
        try:
            data = json.loads(self.profile_path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def load(self) -> bool:
        data = self._read()
        if data is None:
            return False
        try:
            self.target.load_json(data["target"])
            self.draft.load_json(data["draft"])
            self.overhead = float(data.get("overhead", self.overhead))
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
        return True


def profile_path(target: Model, draft: Model | None) -> Path:
    """One profile per model pair, device placement and thread count."""

    def tag(m: Model) -> str:
        return f"{m.name}-{m.path.stat().st_size}-ngl{m.options.n_gpu_layers}-t{m.options.n_threads or 'all'}"

    name = tag(target) + (f"__{tag(draft)}" if draft else "")
    return store.home() / "costs" / f"{name}.json"


# The draft model decodes one token per call while drafting, and a few when it catches up.
DRAFT_WARMUP = (1, 2, 4)


def target_warmup_sizes(k_max: int) -> tuple[int, ...]:
    """Every verification size is measured: on a CPU the curve is not smooth (llama.cpp's
    kernels change at some batch sizes, so 16 tokens can cost less than 15, and 33 far more
    than 32), and a price interpolated across such a step would pick exactly the wrong γ.
    The profile is kept on disk, so this costs seconds once per machine and model."""
    return tuple(range(1, k_max + 1))


def warm_up(
    model: Model, curve: CostCurve, sizes: tuple[int, ...], *, all_logits: bool, quiet: bool = False
) -> None:
    """Time decodes of the batch sizes not yet measured on an empty cache, then empty it.
    Verification asks logits for every position; drafting only for the last."""
    sizes = tuple(
        k for k in sizes if k <= min(curve.k_max, model.options.max_outputs) and not curve.measured(k)
    )
    if not sizes:
        return
    filler = model.tokenize(" the quick brown fox jumps over the lazy dog" * 8, add_special=False)
    model.reset()
    model.decode(filler[:8], 1)  # first use allocates llama.cpp's buffers: not a cost to learn
    bar = None if quiet else count_bar(f"measuring {model.name} on this machine", len(sizes))
    for k in sizes:
        model.reset()
        model.decode(filler[:4], 0)  # a short context, as in a real step
        start = time.perf_counter()
        model.decode(filler[4 : 4 + k], k if all_logits else 1)
        curve.set(k, time.perf_counter() - start)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    model.reset()

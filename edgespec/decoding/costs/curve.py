"""Cost curves: seconds per decode by batch size, learned online, and the test of a
measured curve that cannot be right. Pure arithmetic: no model, no file, no clock."""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection

import numpy as np

EMA = 0.3  # weight of a new measurement
_LEVEL_SHARE = 0.3  # of a multi-token pass's surprise, the part blamed on the machine's speed
_MULTI_SHARE = 0.4  # ... and the part shared by every multi-token size (the rest is its own)
_DRIFT_EMA = 0.15  # weight of one observation in a size's running disagreement with the profile
_DRIFT_LIMIT = math.log(1.35)  # a size whose cost is 35 % off the profile's shape disagrees
_DRIFT_EVIDENCE = 8  # observations of a size before its disagreement counts


class CostCurve:
    """Seconds per decode for batch sizes 1..k_max; unmeasured sizes are interpolated.

    An estimate is ``level × shape[k]`` for one token and ``level × multi × shape[k]`` for
    more. ``level`` follows the machine's speed, which drifts (other processes, thermal
    limits, time a hypervisor steals) and moves every batch size alike; ``shape`` is the
    curve's form. Were each point learned on its own, a machine that slows down while only
    single-token passes are observed would price one token above five (stale) ones, and the
    controller would start drafting exactly when it can least afford to. So a single-token
    observation moves only the level. A larger one moves a little of the level, its own
    point, and ``multi``: what every multi-token pass costs in a real answer beyond the
    profile (a longer context than the measurement's, jitter that stalls long passes more
    often than short ones). Verification sizes are many and each is seen rarely, so
    without a shared factor a profile that is optimistic for batches would be corrected
    one size at a time while drafting lost at every other. Each size also keeps a running
    disagreement with the shape it started from: ``disagrees()`` says when the profile no
    longer fits."""

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.shape = np.full(k_max + 1, np.nan)
        self.level = 1.0
        self.multi = 1.0  # what multi-token passes cost beyond the profile's shape, learned online
        # Estimates for every k at level 1, rebuilt after a change of shape or multi (a
        # single-token pass, the common one, moves only the level, which scales them all)
        self._unit_table: np.ndarray | None = None
        self._table: np.ndarray | None = None  # ... and at the current level
        self._table_level = math.nan
        self._tail: tuple[int, float, float] = (0, math.nan, math.nan)
        self._drift = np.zeros(k_max + 1)  # EMA of log(observed / profile) relative to size 1
        self._seen = np.zeros(k_max + 1, dtype=int)
        self._baseline: np.ndarray | None = None  # the shape as loaded or measured

    def observe(self, k: int, seconds: float, *, repeated: bool = False) -> None:
        """A pass over ``k`` tokens took ``seconds``; ``repeated``: the pass before it had
        the same size. On a GPU a repeated multi-token pass costs less than the profile,
        which times each size as a step after plain steps (llama.cpp reuses its graph for a
        repeated size). It still moves the estimates, but it is no evidence that the
        profile's shape is wrong: counted as such, runs of equal drafts would mark a good
        profile stale."""
        if not 1 <= k <= self.k_max or not seconds > 0:
            return
        scale = self._scale(k)
        if math.isnan(self.shape[k]):
            self.shape[k] = seconds / scale
        else:
            ratio = seconds / (scale * self.shape[k])
            to_level, to_multi = (1.0, 0.0) if k == 1 else (_LEVEL_SHARE, _MULTI_SHARE)
            self.level *= ratio ** (EMA * to_level)
            if k == 1:
                self._track_drift(k, seconds)
                return  # the level alone moved
            self.multi *= ratio ** (EMA * to_multi)
            self.shape[k] *= ratio ** (EMA * (1 - to_level - to_multi))
            if not repeated:
                self._track_drift(k, seconds)
        self._unit_table = None

    def _scale(self, k: int) -> float:
        return self.level * (self.multi if k >= 2 else 1.0)

    def _track_drift(self, k: int, seconds: float) -> None:
        base = self._baseline
        if base is None or math.isnan(base[k]) or math.isnan(base[1]):
            return
        # Disagreement in shape, not level: compared with what size 1 costs right now.
        expected = self.level * self.shape[1] * base[k] / base[1]
        self._drift[k] = (1 - _DRIFT_EMA) * self._drift[k] + _DRIFT_EMA * math.log(seconds / expected)
        self._seen[k] += 1

    def disagrees(self) -> list[int]:
        """Sizes whose observed cost has stayed far from the profile's shape."""
        ks = np.flatnonzero((self._seen >= _DRIFT_EVIDENCE) & (np.abs(self._drift) > _DRIFT_LIMIT))
        return [int(k) for k in ks if k >= 2]

    def freeze_baseline(self) -> None:
        """The current shape is the profile's: online observations are compared with it."""
        self._baseline = self.shape.copy()
        self._drift[:] = 0.0
        self._seen[:] = 0

    def measured(self, k: int) -> bool:
        return 1 <= k <= self.k_max and not math.isnan(self.shape[k])

    def set(self, k: int, seconds: float) -> None:
        """Make the estimate for k exactly ``seconds`` (warm-up, and tests that inject costs)."""
        self.shape[k] = seconds / self._scale(k)
        self._unit_table = None

    def table(self) -> np.ndarray:
        """Estimates for k = 0..k_max (index k), computed once per change and in one
        vectorised pass: the controller prices every γ at every step, and this runs after
        every observation, so it must cost microseconds."""
        if self._unit_table is None:
            self._unit_table, self._tail = self._estimates(np.arange(self.k_max + 1))
            self._table = None
        if self._table is None or self._table_level != self.level:
            self._table = self.level * self._unit_table
            self._table_level = self.level
        return self._table

    def estimate(self, k: int) -> float:
        if 0 <= k <= self.k_max:
            return float(self.table()[k])
        self.table()  # (rebuilds the tail after a change)
        last, value, slope = self._tail
        return self.level * (value + slope * (k - last))

    def estimates(self, ks: np.ndarray) -> np.ndarray:
        """``estimate`` for every k in ``ks`` (non-negative), in one vectorised pass: those
        beyond k_max along the line of the last known sizes."""
        table = self.table()
        last, value, slope = self._tail
        beyond = self.level * (value + slope * (ks - last))
        return np.where(ks <= self.k_max, table[np.minimum(ks, self.k_max)], beyond)

    def _estimates(self, ks: np.ndarray) -> tuple[np.ndarray, tuple[int, float, float]]:
        """Estimates at level 1 (the caller scales them by the level), and the line
        (last known size, its value, slope) that prices every size beyond the last."""
        known = np.flatnonzero(~np.isnan(self.shape))
        if known.size == 0:
            return np.full(ks.shape, math.nan), (0, math.nan, math.nan)
        values = self.shape[known] * np.where(known >= 2, self.multi, 1.0)
        b = int(known[-1])
        if known.size == 1:  # one point: assume cost proportional to k (pessimistic on GPUs)
            return values[0] * ks / b, (b, float(values[0]), float(values[0] / b))
        # Inside the measured range: linear interpolation (exact at measured points).
        # Below the first point np.interp would hold the first value flat, which is what we
        # want for k = 0..first (never used for pricing). Beyond the last point: extrapolate
        # along the last segment, never downward, and never dearer per token than the last
        # point itself (a large batch costs a fixed part plus a part per token): sizes seen
        # online join the measured ones, and a noisy one next to the last (64 beside 65)
        # would otherwise make every longer catch-up (the draft reading a prompt) look
        # several times dearer than it is.
        estimates = np.interp(ks, known, values)
        a = int(known[-2])
        slope = min(max(0.0, (values[-1] - values[-2]) / (b - a)), values[-1] / b)
        beyond = ks > b
        estimates[beyond] = values[-1] + slope * (ks[beyond] - b)
        return estimates.astype(float), (b, float(values[-1]), float(slope))

    def to_json(self) -> dict[str, float]:
        return {str(k): float(self._scale(k) * s) for k, s in enumerate(self.shape) if not math.isnan(s)}

    def load_json(self, data: dict[str, float]) -> None:
        for k, s in data.items():
            if 1 <= int(k) <= self.k_max and float(s) > 0:
                self.shape[int(k)] = float(s) / self._scale(int(k))
        self._unit_table = None


_DIP = 0.75  # a pass priced below this share of one over fewer tokens is a dip
_SAME_DIP = 1.15  # two dips at the same sizes whose depths differ by at most this factor are one


def dips(points: dict[int, float]) -> list[tuple[int, int, float]]:
    """Where a pass over more tokens costs much less than one over fewer, between
    neighbouring measured sizes: (the fewer tokens, the more, the more's cost over the
    fewer's). Kernels change at some sizes, so a dip of a few percent is real; a fall by
    a quarter is a disturbed measurement, or (when measuring again finds it again) a size
    the machine's kernels favour: ``same_dips``."""
    pairs = itertools.pairwise(sorted(points))
    return [(a, b, points[b] / points[a]) for a, b in pairs if 0 < points[b] < _DIP * points[a]]


def _positive(points: dict[int, float]) -> bool:
    return bool(points) and all(math.isfinite(s) and s > 0 for s in points.values())


def implausible(points: dict[int, float], accepted: Collection[tuple[int, int]] = ()) -> str | None:
    """Why a measured target curve cannot be right, or None: a cost that is not a positive
    number, or a dip (``dips``) other than the pairs of sizes in ``accepted`` (those two
    measurements in a row found on this machine). How much more two tokens may cost than
    one is no test: on a GPU the first pass of a new size pays for a new graph, so two
    tokens after single-token passes can cost nearly three single ones, and any such bound
    would have a good profile measured again at every start."""
    if not _positive(points):
        return "a cost that is not a positive number"
    for a, b, ratio in dips(points):
        if (a, b) not in accepted:
            return f"{b} tokens priced at {ratio:.2f}× of {a} tokens"
    return None


def same_dips(first: dict[int, float], second: dict[int, float]) -> bool:
    """Whether a curve measured again (``second``) falls only where the first one did: at
    least one dip, each at the same pair of sizes as one of the first's and as deep within
    15 %. A disturbance lifts the size it hits in one measurement (each size keeps the
    median of rounds that interleave every size, so it must hit that size in most rounds):
    it does not come back at the same sizes and depth. A size the kernels favour does (on
    a 2-core Xeon, 16 tokens at 0.67× of 15 in both). The first's other dips do not matter:
    the second curve is the one kept, and every dip it has was seen twice."""
    if not (_positive(first) and _positive(second)):
        return False
    before = {(a, b): ratio for a, b, ratio in dips(first)}
    found = dips(second)
    return bool(found) and all(
        (a, b) in before and max(ratio, before[a, b]) <= _SAME_DIP * min(ratio, before[a, b])
        for a, b, ratio in found
    )


CHEAP_UP_TO = 17  # cheap sizes are looked for among the sizes every size is measured at


def cheap_sizes(points: dict[int, float], most: int = CHEAP_UP_TO) -> list[int]:
    """The pass sizes below ``most`` that no mix of other sizes beats: the corners of the
    curve's lower convex hull there. Between two of them every size costs at least the
    straight line joining them, so a long draft pays best verified at a cheap size; on a
    curve where 9-15 tokens cost nearly what 16 do, 16 is cheap and 9-15 are not."""
    hull: list[tuple[int, float]] = []
    for k in sorted(k for k in points if k <= most):
        seconds = points[k]
        # pop the last corner while it lies on or above the line from the one before to k
        while len(hull) >= 2:
            (k0, s0), (k1, s1) = hull[-2], hull[-1]
            if (s1 - s0) * (k - k0) >= (seconds - s0) * (k1 - k0):
                hull.pop()
            else:
                break
        hull.append((k, seconds))
    # the window's last size is a corner whatever it costs: not a finding
    return [k for k, _ in hull if k < most]

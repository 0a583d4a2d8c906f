"""What speculation costs on this machine, measured: the cost model and its profile.

* ``target``: seconds of one target pass as a function of the tokens it verifies
  (k = γ + 1). On a CPU the curve is steep (k tokens cost several times one token); on a
  GPU it is nearly flat. It is measured, never assumed.
* ``draft``: seconds of one draft-model decode as a function of its batch size (1 while
  drafting; more when the draft's cache catches up with the committed text).
* ``overhead``, ``plain_overhead``: seconds of Python work outside llama.cpp per drafting
  step and per plain step, learned apart (on an H200 host a drafting step's lookups and
  pricing took 0.24-0.57 ms where a plain step's took 0.08, beside 1.8 ms of GPU time).

The profile on disk is keyed by everything that changes these figures: the CPU model, the
thread count, the llama.cpp build, the exact model files and where their layers run. It
is measured robustly (sizes interleaved over rounds so a slow second hits every size
alike, the median of the rounds, a plausibility check that re-measures a curve that falls
as tokens grow, a note when the machine was busy), written atomically, and re-measured
when it is corrupt, implausible, provisional (measured on a busy machine) or when what
the engine sees online disagrees with its shape.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.models import store
from edgespec.progress import count_bar
from edgespec.runtime.model import Model
from edgespec.runtime.system import build_fingerprint, cpu_flags, cpu_model, isa_of_interest

PROFILE_VERSION = 4  # the layout and method of the profile on disk: another version is measured again
_EMA = 0.3  # weight of a new measurement
_LEVEL_SHARE = 0.3  # of a multi-token pass's surprise, the part blamed on the machine's speed
_MULTI_SHARE = 0.4  # ... and the part shared by every multi-token size (the rest is its own)
_DRIFT_EMA = 0.15  # weight of one observation in a size's running disagreement with the profile
_DRIFT_LIMIT = math.log(1.35)  # a size whose cost is 35 % off the profile's shape disagrees
_DRIFT_EVIDENCE = 8  # observations of a size before its disagreement counts
_ROUNDS = 3  # measurements of every size; the middle one is kept
PROVISIONAL = "measured while the machine was busy or disturbed"  # why a profile is re-measured
_BUSY_CORES = 0.5  # CPU taken by other processes above which a measurement is provisional


class CostCurve:
    """Seconds per decode for batch sizes 1..k_max; unmeasured sizes are interpolated.

    An estimate is ``level × shape[k]`` for one token and ``level × multi × shape[k]`` for
    more. ``level`` follows the machine's speed, which drifts (other processes, thermal
    limits, a VM's stolen time) and moves every batch size alike; ``shape`` is the curve's
    form. Were each point learned on its own, a machine that slows down while only
    single-token passes are observed would price one token above five (stale) ones, and the
    controller would start drafting exactly when it can least afford to. So a single-token
    observation moves only the level. A larger one moves a little of the level, its own
    point, and ``multi``: what every multi-token pass costs in a real answer beyond the
    profile (a longer context than the measurement's, a VM whose jitter stalls long passes
    more often than short ones). Verification sizes are many and each is seen rarely, so
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
        which times each size as a step after plain steps (llama.cpp reuses its graph: on
        an H200, 3 tokens took 2.4 ms after another 3 and 5.0 ms after a single token). It
        still moves the estimates, but it is no evidence that the profile's shape is wrong:
        counted as such, runs of equal drafts marked a good profile stale."""
        if not 1 <= k <= self.k_max or not seconds > 0:
            return
        scale = self._scale(k)
        if math.isnan(self.shape[k]):
            self.shape[k] = seconds / scale
        else:
            ratio = seconds / (scale * self.shape[k])
            to_level, to_multi = (1.0, 0.0) if k == 1 else (_LEVEL_SHARE, _MULTI_SHARE)
            self.level *= ratio ** (_EMA * to_level)
            if k == 1:
                self._track_drift(k, seconds)
                return  # the level alone moved
            self.multi *= ratio ** (_EMA * to_multi)
            self.shape[k] *= ratio ** (_EMA * (1 - to_level - to_multi))
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


def implausible(points: dict[int, float]) -> str | None:
    """Why a measured target curve cannot be right, or None. A pass over more tokens never
    costs much less than one over fewer (kernels change at some sizes, so a dip of a few
    percent is real; a fall by a quarter is a disturbed measurement). How much more two
    tokens may cost than one is no test: on a GPU a 2-token pass after single-token ones
    took 2.75 single tokens (an H200: llama.cpp rebuilds its graph for the new size), and
    a bound at 2.5 had every such profile measured again at every start."""
    ks = sorted(points)
    if not ks or any(not math.isfinite(points[k]) or points[k] <= 0 for k in ks):
        return "a cost that is not a positive number"
    for a, b in itertools.pairwise(ks):
        if points[b] < 0.75 * points[a]:
            return f"{b} tokens priced at {points[b] / points[a]:.2f}× of {a} tokens"
    return None


@dataclass
class CostModel:
    target: CostCurve
    draft: CostCurve
    overhead: float = 0.002
    plain_overhead: float = 0.002
    profile_path: Path | None = None
    measured_at: float = field(default_factory=time.time)
    provisional: bool = False  # measured on a busy machine, or disturbed twice: re-measured at the next load
    facts: dict[str, str] = field(default_factory=dict)  # what the profile is keyed by

    @classmethod
    def empty(cls, k_max: int) -> CostModel:
        return cls(target=CostCurve(k_max), draft=CostCurve(k_max))

    def observe_overhead(self, seconds: float, *, plain: bool = False) -> None:
        if seconds < 0:
            return
        if plain:
            self.plain_overhead = (1 - _EMA) * self.plain_overhead + _EMA * seconds
        else:
            self.overhead = (1 - _EMA) * self.overhead + _EMA * seconds

    # -- persistence --------------------------------------------------------------------

    def save(self, *, merge: bool = True) -> None:
        """Write the measured points atomically, keeping (with ``merge``) those of the
        profile on disk that this model does not cover (an engine allowing a larger γ
        measured them). Two processes saving at once each replace the file whole: the last
        one wins, and the file is never half written."""
        if self.profile_path is None:
            return
        data = (read_profile(self.profile_path) if merge else None) or {}
        if data.get("version") != PROFILE_VERSION:
            data = {}
        target, draft = dict(data.get("target", {})), dict(data.get("draft", {}))
        target.update(self.target.to_json())
        draft.update(self.draft.to_json())
        record = {
            "version": PROFILE_VERSION,
            "facts": self.facts,
            "measured_at": self.measured_at,
            "provisional": self.provisional,
            "stale": False,
            "target": target,
            "draft": draft,
            "overhead": self.overhead,
            "plain_overhead": self.plain_overhead,
        }
        write_atomically(self.profile_path, json.dumps(record, indent=1))

    def load(self) -> str | None:
        """Load the profile on disk; the reason it cannot be used, or None when it was
        loaded (a missing file is "missing")."""
        if self.profile_path is None or not self.profile_path.is_file():
            return "missing"
        data = read_profile(self.profile_path)
        if data is None or data.get("version") != PROFILE_VERSION:
            return "unreadable or from an older version"
        try:
            target = {int(k): float(v) for k, v in data["target"].items()}
            self.target.load_json(data["target"])
            self.draft.load_json(data["draft"])
            self.overhead = float(data.get("overhead", self.overhead))
            self.plain_overhead = float(data.get("plain_overhead", self.overhead))
            self.measured_at = float(data.get("measured_at", 0.0))
        except (ValueError, KeyError, TypeError, AttributeError):
            return "corrupt"
        if data.get("stale"):
            return "marked stale: costs seen while generating disagreed with it"
        if data.get("provisional"):
            return PROVISIONAL
        reason = implausible(target)
        if reason:
            return f"implausible ({reason})"
        self.target.freeze_baseline()
        return None

    def mark_stale(self) -> None:
        """Costs seen online disagree with the profile: the next load re-measures it."""
        if self.profile_path is None:
            return
        data = read_profile(self.profile_path)
        if data is not None and not data.get("stale"):
            data["stale"] = True
            write_atomically(self.profile_path, json.dumps(data, indent=1))


def read_profile(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_atomically(path: Path, text: str) -> None:
    """A unique temporary file in the same directory, then a rename: readers see the old
    file or the new one, never a mixture, whatever else writes at the same time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- what a profile is keyed by ------------------------------------------------------------


def file_identity(path: Path) -> str:
    """The exact file: its verified sha256 where the cache has one, else size and mtime."""
    stamp = store.read_stamp(path)
    if stamp is not None and stamp.matches(path):
        return stamp.sha256[:16]
    stat = path.stat()
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def describe_model(name: str, path: Path, n_gpu_layers: int, n_threads: int | None) -> str:
    """One model's part of a profile's key: which file, where its layers run, how many threads."""
    return f"{name} {file_identity(path)} ngl={n_gpu_layers} threads={n_threads or 'all'}"


def profile_facts_for(target: str, draft: str | None) -> dict[str, str]:
    """What a profile is keyed by, from the models' descriptions (``describe_model``)."""
    return {
        "cpu": cpu_model(),
        # Virtual machines often name only the vendor ("AMD EPYC" on both an AVX2 and an
        # AVX-512 host, whose cost curves differ): the instruction sets tell them apart.
        "isa": " ".join(isa_of_interest(cpu_flags())),
        "cores": str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()),
        "llama.cpp": build_fingerprint(),
        "target": target,
        "draft": draft or "none",
    }


def profile_facts(target: Model, draft: Model | None) -> dict[str, str]:
    def about(m: Model) -> str:
        return describe_model(m.name, m.path, m.options.n_gpu_layers, m.options.n_threads)

    return profile_facts_for(about(target), about(draft) if draft is not None else None)


def profile_path_for(facts: dict[str, str], target_name: str, draft_name: str | None) -> Path:
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]
    name = target_name + (f"__{draft_name}" if draft_name else "")
    return store.home() / "costs" / f"{name}-{key}.json"


def profile_path(target: Model, draft: Model | None) -> Path:
    """One profile per model pair, machine, llama.cpp build, placement and thread count."""
    return profile_path_for(profile_facts(target, draft), target.name, draft.name if draft else None)


# -- measuring -----------------------------------------------------------------------------


def draft_warmup_sizes(k_max: int) -> tuple[int, ...]:
    """The draft model decodes one token per call while drafting and a few when it catches
    up after a step; its first catch-up in an answer reads the whole prompt, priced by
    extrapolation beyond the largest size measured. Along the slope of tiny batches, a
    400-token prompt was priced at 1.8× what it took (F16 stand-in, AVX2 EPYC), and whether
    a trial of the draft is worth its prefill rests on that price: the largest batch is
    measured too."""
    return (*(k for k in (1, 2, 4) if k < k_max), k_max)


def target_warmup_sizes(k_max: int) -> tuple[int, ...]:
    """Every verification size up to 17 is measured: on a CPU the curve is not smooth
    (llama.cpp's kernels change at some batch sizes, so 16 tokens can cost less than 15),
    and a price interpolated across such a step would pick exactly the wrong γ. Beyond, long
    copies are drafted in long blocks whose cost grows smoothly: every fourth size, then
    every eighth, interpolated between."""
    sizes = [*range(1, 18), *range(20, 33, 4), *range(40, 65, 8), 65]
    return tuple(k for k in sizes if k <= k_max) + ((k_max,) if k_max not in sizes else ())


class OtherLoad:
    """CPU that other processes use while this one works, from the kernel's counters of all
    CPU time minus this process's own (the load average would count this process's own
    work and lag by a minute). Linux only; elsewhere it reports nothing."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
            ticks = [float(x) for x in fields]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)
            own = os.times()
            return sum(ticks) - idle, sum(ticks), (own.user + own.system) * os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, AttributeError):
            return None

    def cores(self) -> float | None:
        """Cores' worth of CPU other processes used since this object was made."""
        end = self._sample()
        if self._start is None or end is None or end[1] <= self._start[1]:
            return None
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        others = max(0.0, (end[0] - self._start[0]) - (end[2] - self._start[2]))
        return others / (end[1] - self._start[1]) * cores


def machine_busy(window_s: float = 0.3) -> float | None:
    """Cores' worth of CPU other processes use right now, when it is enough to disturb
    timings (None when quiet or unknown)."""
    watch = OtherLoad()
    time.sleep(window_s)
    others = watch.cores()
    return others if others is not None and others > _BUSY_CORES else None


def warm_up(
    model: Model, curve: CostCurve, sizes: tuple[int, ...], *, all_logits: bool, quiet: bool = False
) -> None:
    """Time decodes of the batch sizes not yet measured on an almost empty cache, then
    empty it. Verification asks logits for every position; drafting only for the last.
    Sizes are measured in rounds (each round visits every size), and each keeps the median
    of its rounds: a disturbance hits one round of every size, not every round of one, so
    the median drops it; and a step pays a pass's typical cost, not its best one (on a VM,
    the fastest of three rounds priced a 4-token pass 30 % below what answers then paid,
    while a single token's was within 10 %: a jitter stalls a long pass more often)."""
    most = curve.k_max if not all_logits else min(curve.k_max, model.options.max_outputs)
    sizes = tuple(k for k in sizes if k <= most and not curve.measured(k))
    if not sizes:
        return
    filler = model.tokenize(" the quick brown fox jumps over the lazy dog" * 12, add_special=False)
    model.reset()
    model.decode(filler[:8], 1)  # first use allocates llama.cpp's buffers: not a cost to learn
    samples: dict[int, list[float]] = {k: [] for k in sizes}
    bar = None if quiet else count_bar(f"measuring {model.name} on this machine", len(sizes) * _ROUNDS)
    for _ in range(_ROUNDS):
        for k in sizes:
            samples[k].append(_time_decode(model, filler, k, all_logits))
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    for k in sizes:
        curve.set(k, float(np.median(samples[k])))
    model.reset()


def _time_decode(model: Model, filler: list[int], k: int, all_logits: bool) -> float:
    """One pass over ``k`` tokens on a short context, right after two single-token passes,
    as a step comes after plain steps. On a GPU a pass costs more when the ones before had
    another shape (llama.cpp rebuilds its graph; CUDA captures it again): on an H200 the
    first two single-token passes after a 4-token pass took 2.6-6 ms, the third 1.8 ms,
    as every plain step of an answer. Timed after a 4-token pass, the profile priced plain
    decoding 50 % above what answers then measured, and answers marked it stale. (On a
    CPU the shape of the pass before does not matter.)"""
    model.reset()
    model.decode(filler[:2], 0)  # a short context, as in a real step
    model.decode(filler[2:3], 1)
    model.decode(filler[3:4], 1)
    start = time.perf_counter()
    model.decode(filler[4 : 4 + k], k if all_logits else 1)
    return time.perf_counter() - start


def load_or_measure(
    target: Model,
    draft: Model | None,
    k_max: int,
    *,
    quiet: bool = False,
    force: bool = False,
    busy: Callable[[], float | None] = machine_busy,
) -> CostModel:
    """The cost model of this pair on this machine: the profile on disk when it is
    trustworthy, else measured now (with a progress bar unless ``quiet``) and saved. What a
    loaded profile lacks (a larger γ than it covers) is measured and added. ``busy`` says
    how many cores other processes keep busy (None when quiet)."""
    costs = CostModel.empty(k_max)
    costs.profile_path = profile_path(target, draft)
    costs.facts = profile_facts(target, draft)
    problem = "re-measure requested" if force else costs.load()
    others = busy() if problem is not None else None
    if problem == PROVISIONAL and others is not None:
        problem = None  # still busy: keep the provisional figures rather than worse ones
        costs.provisional = True
        costs.target.freeze_baseline()
    if problem is not None:
        if problem != "missing" and not quiet:
            note = f"edgespec: cost profile {costs.profile_path.name}: {problem}; measuring again"
            print(note, file=sys.stderr)
        costs = CostModel.empty(k_max)
        costs.profile_path = profile_path(target, draft)
        costs.facts = profile_facts(target, draft)
    known = (costs.target.to_json(), costs.draft.to_json())
    watch = OtherLoad()  # what else ran while we measured
    sizes = target_warmup_sizes(k_max)
    for attempt in range(2):
        warm_up(target, costs.target, sizes, all_logits=True, quiet=quiet)
        reason = implausible({k: costs.target.estimate(k) for k in sizes if costs.target.measured(k)})
        if reason is None:
            break
        if attempt == 0:
            if not quiet:
                note = f"edgespec: cost measurement looks disturbed ({reason}); measuring again"
                print(note, file=sys.stderr)
            costs.target = CostCurve(k_max)
        else:
            costs.provisional = True  # kept for now; re-measured at the next load
    if draft is not None:
        warm_up(draft, costs.draft, draft_warmup_sizes(k_max), all_logits=False, quiet=quiet)
    if (costs.target.to_json(), costs.draft.to_json()) != known:
        during = watch.cores() if busy is machine_busy else None
        if during is not None and during > _BUSY_CORES:
            others = max(others or 0.0, during)
        if others is None and problem is None:
            others = busy()  # only sizes a loaded profile lacked were measured
        if others is not None:
            costs.provisional = True
            if not quiet:
                print(
                    f"edgespec: other processes kept {others:.1f} CPU cores busy while costs were measured; "
                    "they will be measured again when the machine is quiet",
                    file=sys.stderr,
                )
        costs.measured_at = time.time()
        costs.save(merge=problem is None or problem == "missing")
    costs.target.freeze_baseline()
    return costs

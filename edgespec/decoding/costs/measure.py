"""Measuring the cost model on this machine, and deciding when the profile on disk is
good enough to skip that.

Sizes are interleaved over rounds so that a slow second hits every size alike, each keeps
the median of its rounds, a curve that falls as tokens grow is measured again (and kept
when it falls again at the same sizes, as deeply: the machine's own), and a measurement
while other processes keep the CPU busy is kept only as provisional. A profile is measured
again when it is missing, corrupt, implausible, provisional, or when what the engine sees
online disagrees with its shape. Notes about this go to the caller's
``notify``: this layer prints nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgespec.decoding.costs.costmodel import PROVISIONAL, CostModel
from edgespec.decoding.costs.curve import CostCurve, dips, implausible, same_dips
from edgespec.decoding.costs.profile import profile_facts, profile_path
from edgespec.progress import count_bar
from edgespec.runtime import local_workers, rpc_faults
from edgespec.runtime.model import Model

_ROUNDS = 3  # measurements of every size; the middle one is kept
_BUSY_CORES = 0.5  # CPU taken by other processes above which a measurement is provisional


def draft_warmup_sizes(k_max: int) -> tuple[int, ...]:
    """The draft model decodes one token per call while drafting and a few when it catches
    up after a step; its first catch-up in an answer reads the whole prompt, priced by
    extrapolation beyond the largest size measured. Along the slope of tiny batches that
    extrapolation prices a long prompt far above what it takes, and whether a trial of
    the draft is worth its prefill rests on that price: the largest batch is measured too."""
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
    """CPU that other processes use, while this one works, on the cores this process may
    run on: from the kernel's per-core counters of all CPU time minus this process's own
    (the load average would count this process's own work and lag by a minute). A process
    pinned to some cores (``taskset``, one test worker per core) is not slowed by work on
    the others. A worker of this process's split target that runs on this machine computes
    this process's passes: its CPU is counted as this process's own. Linux only; elsewhere
    it reports nothing."""

    def __init__(self) -> None:
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._workers = local_workers.pids(rpc_faults.workers())
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        try:
            busy, total = cpu_ticks(Path("/proc/stat").read_text(), self._cpus)
            own = os.times()
            ticks = (own.user + own.system) * os.sysconf("SC_CLK_TCK")
            return busy, total, ticks + local_workers.cpu_ticks(self._workers)
        except (OSError, ValueError, IndexError, AttributeError):
            return None

    def cores(self) -> float | None:
        """Cores' worth of CPU other processes used on this process's cores since this
        object was made."""
        end = self._sample()
        if self._start is None or end is None or end[1] <= self._start[1]:
            return None
        others = max(0.0, (end[0] - self._start[0]) - (end[2] - self._start[2]))
        return others / (end[1] - self._start[1]) * len(self._cpus)


def cpu_ticks(stat: str, cpus: list[int]) -> tuple[float, float]:
    """Busy and all ticks, summed over the cores ``cpus`` of a ``/proc/stat`` text (idle
    and waiting for I/O are not busy)."""
    wanted = {f"cpu{n}" for n in cpus}
    busy = total = 0.0
    for line in stat.splitlines():
        name, *fields = line.split()
        if name not in wanted:
            continue
        ticks = [float(x) for x in fields[:8]]  # guest time is counted in user time already
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)
        busy, total = busy + sum(ticks) - idle, total + sum(ticks)
    if not total:
        raise ValueError("none of this process's cores is in /proc/stat")
    return busy, total


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
    the median drops it; and a step pays a pass's typical cost, not its best one (jitter
    stalls a long pass more often than a short one, so the fastest round would price
    multi-token passes below what answers pay)."""
    most = curve.k_max if not all_logits else min(curve.k_max, model.options.max_outputs)
    sizes = tuple(k for k in sizes if k <= most and not curve.measured(k))
    if not sizes:
        return
    filler = model.tokenize(" the quick brown fox jumps over the lazy dog" * 12, add_special=False)
    model.sequence(0).reset()
    model.sequence(0).decode(filler[:8], 1)  # first use allocates llama.cpp's buffers: not a cost to learn
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
    model.sequence(0).reset()


def _time_decode(model: Model, filler: list[int], k: int, all_logits: bool) -> float:
    """One pass over ``k`` tokens on a short context, right after two single-token passes,
    as a step comes after plain steps. On a GPU a pass costs more when the ones before had
    another shape (llama.cpp rebuilds its graph; CUDA captures it again), and it takes a
    few single-token passes after a larger one to reach a plain step's cost: timed after
    a larger pass, the profile would price plain decoding well above what answers pay,
    and answers would mark it stale. (On a CPU the shape of the pass before does not
    matter.)"""
    sequence = model.sequence(0)
    sequence.reset()
    sequence.decode(filler[:2], 0)  # a short context, as in a real step
    sequence.decode(filler[2:3], 1)
    sequence.decode(filler[3:4], 1)
    start = time.perf_counter()
    sequence.decode(filler[4 : 4 + k], k if all_logits else 1)
    return time.perf_counter() - start


def load_or_measure(
    target: Model,
    draft: Model | None,
    k_max: int,
    *,
    quiet: bool = False,
    force: bool = False,
    busy: Callable[[], float | None] = machine_busy,
    notify: Callable[[str], None] | None = None,
) -> CostModel:
    """The cost model of this pair on this machine: the profile on disk when it is
    trustworthy, else measured now (with a progress bar unless ``quiet``) and saved. What a
    loaded profile lacks (a larger γ than it covers) is measured and added. ``busy`` says
    how many cores other processes keep busy (None when quiet). ``notify`` receives one
    line for each thing the user should know (a profile measured again and why, a busy
    machine) unless ``quiet``; without it they are dropped."""

    def note(text: str) -> None:
        if notify is not None and not quiet:
            notify(text)

    costs, problem, others = _from_profile(target, draft, k_max, force=force, busy=busy, note=note)
    known = (costs.target.to_json(), costs.draft.to_json())
    watch = OtherLoad()  # what else runs while we measure
    _measure_target(target, costs, k_max, quiet=quiet, note=note)
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
            note(
                f"edgespec: other processes kept {others:.1f} CPU cores busy while costs were measured; "
                "they will be measured again when the machine is quiet"
            )
        costs.measured_at = time.time()
        costs.save(merge=problem is None or problem == "missing")
    costs.target.freeze_baseline()
    return costs


def _empty_for(target: Model, draft: Model | None, k_max: int) -> CostModel:
    costs = CostModel.empty(k_max)
    costs.profile_path = profile_path(target, draft)
    costs.facts = profile_facts(target, draft)
    return costs


def _from_profile(
    target: Model,
    draft: Model | None,
    k_max: int,
    *,
    force: bool,
    busy: Callable[[], float | None],
    note: Callable[[str], None],
) -> tuple[CostModel, str | None, float | None]:
    """What to measure from: the profile on disk, or an empty model where it cannot be
    used; why not (None when it is used); how busy the machine is, asked only when the
    profile is not used as it is."""
    costs = _empty_for(target, draft, k_max)
    problem = "re-measure requested" if force else costs.load()
    others = busy() if problem is not None else None
    if problem == PROVISIONAL and others is not None:
        problem = None  # still busy: keep the provisional figures rather than worse ones
        costs.provisional = True
        costs.target.freeze_baseline()
    if problem is not None:
        if problem != "missing":
            note(f"edgespec: cost profile {costs.profile_path.name}: {problem}; measuring again")
        costs = _empty_for(target, draft, k_max)
    return costs, problem, others


def _measure_target(
    target: Model, costs: CostModel, k_max: int, *, quiet: bool, note: Callable[[str], None]
) -> None:
    """Measure the verification sizes the target's curve lacks. A curve that cannot be
    right is measured once more from scratch. Where the second curve falls only where the
    first did, as deeply (``same_dips``), the dip is the machine's own (on a 2-core Xeon,
    where llama.cpp's kernels tile by 16, 16 tokens cost 0.67× of 15 in every
    measurement): the curve is kept as measured, and the profile records the dip so that
    loading it accepts it. Any other second curve that cannot be right is kept as
    provisional (re-measured at the next load), since a third try is unlikely to do
    better now."""
    sizes = target_warmup_sizes(k_max)
    first: dict[int, float] = {}
    for attempt in range(2):
        warm_up(target, costs.target, sizes, all_logits=True, quiet=quiet)
        points = {k: costs.target.estimate(k) for k in sizes if costs.target.measured(k)}
        reason = implausible(points, costs.dips)
        if reason is None:
            return
        if attempt == 0:
            note(f"edgespec: cost measurement looks disturbed ({reason}); measuring again")
            first = points
            costs.target = CostCurve(k_max)
            costs.dips = ()  # a dip a loaded profile accepted must be found again as well
        elif same_dips(first, points):
            costs.dips = tuple((a, b) for a, b, _ in dips(points))
            note(f"edgespec: measured again, {reason} again: kept as this machine's own cost curve")
        else:
            costs.provisional = True

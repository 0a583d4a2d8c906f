"""The cost curves and the cost model (edgespec.decoding.costs), fed synthetic timings: how
they interpolate, learn while generating, and tell a profile whose shape is wrong. (The
profile measured on a real model and kept on disk: tests/test_profile.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from synthetic_costs import CPU_TARGET, costs, plan, policy

from edgespec.cli.costs import _status
from edgespec.decoding.costs import CostCurve, implausible, load_or_measure, measure
from edgespec.decoding.costs.curve import cheap_sizes, same_dips
from edgespec.decoding.costs.measure import cpu_ticks
from edgespec.runtime.model import LoadOptions


def test_cost_curve_interpolates_and_learns():
    curve = CostCurve(33)
    assert np.isnan(curve.estimate(3))
    curve.set(1, 0.04)
    assert curve.estimate(4) == pytest.approx(0.16)  # one point: proportional
    curve.set(5, 0.2)
    assert curve.estimate(3) == pytest.approx(0.12)
    assert curve.estimate(9) == pytest.approx(0.36)  # extrapolated along the last segment
    curve.observe(5, 0.3)
    assert 0.2 < curve.estimate(5) < 0.3


def test_a_size_seen_online_beside_the_last_does_not_make_long_catch_ups_dear():
    """The draft's profile has 1, 2, 4 and 65 tokens; a catch-up of 64 seen online, a little
    cheaper than the profile's 65, must not turn the extrapolation for a 300-token prompt
    into the slope between 64 and 65 (which priced a prompt at 15 s instead of 3)."""
    curve = CostCurve(65)
    for k, seconds in {1: 0.031, 2: 0.046, 4: 0.070, 65: 0.684}.items():
        curve.set(k, seconds)
    curve.observe(64, 0.55)
    assert curve.estimate(65) == pytest.approx(0.684, rel=0.05)
    assert curve.estimate(300) <= curve.estimate(65) / 65 * 300 * 1.01
    assert curve.estimate(300) > curve.estimate(65)


def test_a_machine_that_slows_down_does_not_make_drafting_look_cheap():
    """Only single-token passes are observed while the machine runs 3× slower: every batch
    size must be re-priced alike, so plain decoding stays the choice."""
    model = costs(CPU_TARGET, draft_ms=22)
    adaptive = policy(model, ("model",), gamma_cap=8)
    adaptive.stats.model = 0.6  # the draft is right 60 % of the time, as measured here
    ratio_before = model.target.estimate(5) / model.target.estimate(1)
    for _ in range(20):
        model.target.observe(1, 3 * CPU_TARGET[1] / 1000)
    assert model.target.estimate(1) == pytest.approx(3 * CPU_TARGET[1] / 1000, rel=0.05)
    assert model.target.estimate(5) / model.target.estimate(1) == pytest.approx(ratio_before, rel=0.05)
    assert plan(adaptive, [1, 2, 3]).drafter == "none"


def test_batches_dearer_than_the_profile_reprice_every_batch_size():
    """Answers pay 40 % more than the profile for 5-token passes while single tokens cost
    what it says: sizes never verified must be re-priced too (not one size at a time), and
    a single token must not be."""
    curve = CostCurve(17)
    for k, ms in CPU_TARGET.items():
        curve.set(k, ms / 1000)
    curve.freeze_baseline()
    for _ in range(12):
        curve.observe(5, 1.4 * CPU_TARGET[5] / 1000)
        curve.observe(1, CPU_TARGET[1] / 1000)
    assert curve.estimate(5) == pytest.approx(1.4 * CPU_TARGET[5] / 1000, rel=0.1)
    assert curve.estimate(1) == pytest.approx(CPU_TARGET[1] / 1000, rel=0.05)
    for k in (2, 9, 17):  # never observed
        assert curve.estimate(k) > 1.15 * CPU_TARGET[k] / 1000, k
    # and the factor is learned back when batches turn cheap again
    for _ in range(60):
        curve.observe(5, CPU_TARGET[5] / 1000)
        curve.observe(1, CPU_TARGET[1] / 1000)
    assert curve.estimate(9) == pytest.approx(CPU_TARGET[9] / 1000, rel=0.05)


def test_repeated_passes_cheaper_than_the_profile_do_not_make_it_stale():
    """On a GPU a pass after another of the same size reuses llama.cpp's graph and costs
    less than the profile, which times every size after plain steps. Runs of equal drafts
    still teach the estimates, but only passes after another size can show that the
    profile's shape is wrong."""

    def answer(repeated: bool) -> CostCurve:
        curve = CostCurve(17)
        for k, ms in CPU_TARGET.items():
            curve.set(k, ms / 1000)
        curve.freeze_baseline()
        for _ in range(12):
            curve.observe(1, CPU_TARGET[1] / 1000)
            curve.observe(5, 0.5 * CPU_TARGET[5] / 1000, repeated=repeated)
        return curve

    assert answer(repeated=False).disagrees() == [5]
    repeated = answer(repeated=True)
    assert repeated.disagrees() == []
    assert repeated.estimate(5) < 0.75 * CPU_TARGET[5] / 1000  # learned all the same


def test_a_gpu_profile_is_plausible_and_a_falling_one_is_not():
    """Costs measured on an H200 (ms): after single tokens, 2 tokens cost 2.75 single ones."""
    assert implausible({1: 1.81, 2: 4.98, 3: 5.0, 5: 4.22, 9: 5.33, 17: 5.85}) is None
    assert implausible({1: 57.0, 2: 100.0, 3: 131.0, 4: 30.0}) == "4 tokens priced at 0.23× of 3 tokens"


# A 2-core Sapphire Rapids VM (llama.cpp without AMX) measured, ms: llama.cpp's kernels tile
# by 16, so 16 tokens cost 298 ms where 9 cost 285, 15 about 445 and 17 415. Sizes around
# them grow smoothly here.
XEON = {k: 60.0 + 25.0 * k for k in range(1, 18)} | {9: 285.0, 15: 445.0, 16: 298.0, 17: 415.0}
SMOOTH = XEON | {16: 430.0}  # the same machine had the dip been a disturbance


def test_a_dip_found_again_at_the_same_sizes_and_depth_is_the_machines_own():
    again = {k: 1.05 * ms for k, ms in XEON.items()} | {16: 1.1 * 298.0}  # slower, 16 at 0.74× of 15
    assert implausible(XEON) == "16 tokens priced at 0.67× of 15 tokens"
    assert implausible(XEON, accepted=[(15, 16)]) is None
    assert same_dips(XEON, again)
    assert not same_dips(SMOOTH, XEON)  # seen once
    assert not same_dips(XEON, XEON | {16: 200.0})  # 0.45× of 15: not as deep
    assert not same_dips(XEON, SMOOTH | {9: 300.0, 10: 200.0})  # elsewhere
    assert not same_dips(XEON, SMOOTH)  # no dip: nothing to trust
    assert not same_dips(XEON | {3: 0.0}, XEON)


class StandInModel:
    """What the measurement and the profile's key ask of a model, with no model behind it:
    the passes' times come from ``machine`` (``measure._time_decode`` replaced)."""

    def __init__(self, path: Path):
        self.name, self.path, self.options = "stand-in", path, LoadOptions()

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return list(range(len(text)))

    def sequence(self, seq: int) -> StandInModel:
        return self  # (one sequence: the measurement's)

    def reset(self) -> None:
        pass

    def decode(self, tokens: list[int], n_outputs: int = 1) -> None:
        pass


@pytest.fixture()
def machine(tmp_path, monkeypatch):
    """A stand-in target whose passes take, in each measurement of the whole curve, the
    times of the next curve of ``machine.curves`` (ms by size); ``machine.timed`` counts the
    passes timed by size."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    weights = tmp_path / "stand-in.gguf"
    weights.write_bytes(b"GGUF")
    model = StandInModel(weights)
    model.curves, model.timed = [], Counter()

    def timed(_model, _filler: list[int], k: int, _all_logits: bool) -> float:
        model.timed[k] += 1
        return model.curves[(model.timed[k] - 1) // measure._ROUNDS][k] / 1000

    monkeypatch.setattr(measure, "_time_decode", timed)
    return model


def quiet_machine() -> None:
    return None


def test_a_dip_measured_twice_is_kept_as_measured_and_not_measured_again(machine):
    """Each start of the app on that Xeon measured the curve twice (3 minutes), found the
    same dip, kept it as provisional, and measured it again at the next start."""
    machine.curves = [XEON, {k: 1.03 * ms for k, ms in XEON.items()}]
    notes: list[str] = []
    costs = load_or_measure(machine, None, 17, busy=quiet_machine, notify=notes.append)
    assert set(machine.timed.values()) == {2 * measure._ROUNDS}  # measured twice ...
    assert not costs.provisional and costs.dips == ((15, 16),)  # ... and kept as measured
    assert costs.target.estimate(16) == pytest.approx(1.03 * 0.298)
    assert "measuring again" in notes[0] and "kept" in notes[1], notes
    data = json.loads(costs.profile_path.read_text())
    assert data["provisional"] is False and data["dips"] == [[15, 16]]
    assert "implausible" not in _status(costs.profile_path)  # `edgespec costs show`

    machine.timed.clear()  # the next start uses it as it is ...
    again = load_or_measure(machine, None, 17, quiet=True, busy=quiet_machine)
    assert not machine.timed and not again.provisional
    assert again.target.estimate(16) == pytest.approx(costs.target.estimate(16))
    machine.curves = [XEON | {20: 560.0, 21: 585.0}]  # ... and a larger γ measures only what it lacks
    load_or_measure(machine, None, 21, quiet=True, busy=quiet_machine)
    assert set(machine.timed) == {20, 21}
    assert json.loads(costs.profile_path.read_text())["dips"] == [[15, 16]]


@pytest.mark.parametrize(
    "second, provisional",
    [
        (SMOOTH, False),  # a disturbance: gone when measured again
        (XEON | {16: 200.0}, True),  # falls at the same sizes, but 0.45× of 15 against 0.67×
        (SMOOTH | {9: 330.0, 10: 230.0}, True),  # falls elsewhere
    ],
)
def test_a_dip_not_found_again_alike_is_a_disturbance(machine, second, provisional):
    machine.curves = [XEON, second]
    costs = load_or_measure(machine, None, 17, quiet=True, busy=quiet_machine)
    assert set(machine.timed.values()) == {2 * measure._ROUNDS}
    assert costs.provisional is provisional and costs.dips == ()
    assert costs.target.estimate(16) == pytest.approx(second[16] / 1000)
    data = json.loads(costs.profile_path.read_text())
    assert data["provisional"] is provisional and data["dips"] == []


def test_a_dip_measured_twice_on_a_busy_machine_is_provisional(machine):
    machine.curves = [XEON, XEON, XEON]
    notes: list[str] = []
    costs = load_or_measure(machine, None, 17, busy=lambda: 1.5, notify=notes.append)
    assert costs.provisional and any("busy" in note for note in notes)
    assert json.loads(costs.profile_path.read_text())["provisional"] is True
    machine.timed.clear()  # quiet at the next start: measured again, and kept
    costs = load_or_measure(machine, None, 17, quiet=True, busy=quiet_machine)
    assert set(machine.timed.values()) == {2 * measure._ROUNDS}
    assert not costs.provisional and costs.dips == ((15, 16),)


WRITER = """
import sys
from collections import Counter
from pathlib import Path
from edgespec.host import write_atomically
path, tag = Path(sys.argv[1]), sys.argv[2]
for i in range(300):
    write_atomically(path, '{"writer": "%s", "i": %d, "pad": "%s"}' % (tag, i, "x" * 20000))
"""


def test_two_processes_writing_a_profile_at_once_leave_a_valid_file(tmp_path):
    path = tmp_path / "costs" / "profile.json"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), tag]) for tag in ("a", "b")]
    seen = set()
    while any(w.poll() is None for w in writers):
        if path.exists():
            seen.add(json.loads(path.read_text())["writer"])  # never half written
    assert all(w.wait() == 0 for w in writers)
    assert json.loads(path.read_text())["i"] == 299
    assert not list(path.parent.glob("*.tmp")), "no temporary file may be left behind"


STAT = """cpu  300 0 100 500 100 0 0 0 0 0
cpu0 200 0 50 100 50 0 0 0 40 0
cpu1 100 0 50 400 50 0 0 0 0 0
intr 12345
"""


def test_only_the_cores_a_process_may_run_on_count():
    assert cpu_ticks(STAT, [0]) == (250.0, 400.0)  # guest time is in user time already
    assert cpu_ticks(STAT, [1]) == (150.0, 600.0)
    assert cpu_ticks(STAT, [0, 1]) == (400.0, 1000.0)
    with pytest.raises(ValueError):
        cpu_ticks(STAT, [2])


# A child pinned to one core sleeps while a busy loop runs beside it, on another core, or
# nowhere (-1), and prints how many cores' worth of CPU OtherLoad saw others use on its
# own core.
WATCH = """
import os, subprocess, sys, time
from edgespec.decoding.costs import OtherLoad
os.sched_setaffinity(0, [int(sys.argv[1])])
SPIN = "import os, sys; os.sched_setaffinity(0, [int(sys.argv[1])])\\nwhile True: pass"
spin = None if sys.argv[2] == "-1" else subprocess.Popen([sys.executable, "-c", SPIN, sys.argv[2]])
time.sleep(0.3)
watch = OtherLoad()
time.sleep(0.6)
print(watch.cores())
if spin is not None:
    spin.kill()
"""
BUSY_CORE = 0.5  # others' load on the child's core with no loop anywhere: too busy to tell


def usable_cores() -> list[int]:
    """The cores this test may use, with those of the process that started it: a test
    worker is pinned to its own core (tests/conftest.py), and this test needs two."""
    if not hasattr(os, "sched_getaffinity") or not Path("/proc/stat").exists():
        return []
    return sorted(os.sched_getaffinity(0) | os.sched_getaffinity(os.getppid()))


@pytest.mark.skipif(len(usable_cores()) < 2, reason="needs Linux and two cores")
def test_a_pinned_process_is_disturbed_by_work_on_its_own_core_only():
    """Each loop's load is read over what the core carried without it, in the same try:
    other work on the machine (a benchmark, another test worker's decode) moves all three
    alike. A try whose core was busy with no loop at all can tell nothing and is made
    again; where every try was, the test says so."""
    mine = min(os.sched_getaffinity(0))
    other = next(core for core in usable_cores() if core != mine)

    def seen(spin_on: int) -> float:
        out = subprocess.run([sys.executable, "-c", WATCH, str(mine), str(spin_on)],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        return float(out.stdout)

    tries = []
    for _ in range(3):
        quiet = seen(-1)
        if quiet > BUSY_CORE:
            tries.append(f"busy ({quiet:.2f} cores without a loop)")
            continue
        beside, elsewhere = seen(mine) - quiet, seen(other) - quiet
        if beside > 0.5 and elsewhere < 0.3:
            return
        tries.append(f"a loop beside it added {beside:.2f} cores, on another core {elsewhere:.2f}")
    if all(t.startswith("busy") for t in tries):
        pytest.skip(f"the core was busy in every try: {tries}")
    pytest.fail(f"OtherLoad does not tell a loop on its own core from one elsewhere: {tries}")


def test_cheap_sizes_are_the_corners_no_mix_of_other_sizes_beats():
    """The family-26 EPYC's curve: 9-15 tokens cost nearly what 16 do, so 16 is cheap
    and they are not; a smooth steep curve has no cheap size but one token."""
    epyc = {1: 1.0, 2: 2.0, 4: 3.12, 5: 3.89, 8: 6.2, 9: 6.12, 16: 6.72, 17: 8.09}
    assert cheap_sizes(epyc) == [1, 16]
    linear = {k: float(k) for k in range(1, 18)}
    assert cheap_sizes(linear) == [1]
    # a dip at 16 on a curve measured at every size (a 2-core Xeon's profile)
    xeon = {1: 1.0, 2: 1.55, 3: 1.78, 4: 1.58, 8: 3.19, 9: 3.43, 15: 4.82, 16: 3.86, 17: 4.48}
    assert cheap_sizes(xeon) == [1, 16]

"""The cost profile, measured on a real small model (SmolLM2-135M) and kept on disk: what
is measured and when, what it is keyed by, and how a bad, busy or stale one is measured
again."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.decoding.auto import PairState
from edgespec.decoding.costs import (
    implausible,
    load_or_measure,
    measure,
    profile_facts,
    profile_path,
    profile_path_for,
)

pytestmark = pytest.mark.needs_models


def quiet_machine() -> None:
    """The busy probe for tests: other tests' processes must not make these flaky."""
    return None


@pytest.fixture()
def smol(smol_path, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    small = EdgeSpec(str(smol_path), None, RuntimeOptions(n_ctx=160, max_gamma=5), quiet=True)
    yield small
    small.close()


@pytest.fixture()
def steady_timing(monkeypatch) -> list[int]:
    """Every timed pass still runs on the model, but takes a fixed time that grows with
    its size: neither jitter nor other processes can make a curve look disturbed, which
    would have it measured again. Returns the sizes timed, in order."""
    timed: list[int] = []
    real = measure._time_decode

    def steady(model, filler: list[int], k: int, all_logits: bool) -> float:
        real(model, filler, k, all_logits)
        timed.append(k)
        return 0.01 + 0.002 * k

    monkeypatch.setattr(measure, "_time_decode", steady)
    return timed


def test_warm_up_measures_every_size_once_and_the_profile_keeps_what_others_measured(smol, steady_timing):
    costs = load_or_measure(smol.target, None, 4, quiet=True, busy=quiet_machine)
    assert set(steady_timing) == {1, 2, 3, 4}  # every verification size ...
    assert len(set(Counter(steady_timing).values())) == 1  # ... in as many rounds each
    assert all(costs.target.measured(k) for k in range(1, 5))
    path = costs.profile_path
    data = json.loads(path.read_text())
    assert set(data["target"]) == {"1", "2", "3", "4"} and data["provisional"] is False
    stored = data["target"]

    # A larger γ measures only what the profile lacks ...
    steady_timing.clear()
    costs = load_or_measure(smol.target, None, 6, quiet=True, busy=quiet_machine)
    assert set(steady_timing) == {5, 6}  # the loaded sizes are not timed again
    assert costs.target.estimate(2) == pytest.approx(stored["2"])
    assert set(json.loads(path.read_text())["target"]) == {str(k) for k in range(1, 7)}

    # ... and a smaller one neither re-measures nor forgets the larger sizes.
    steady_timing.clear()
    before = path.read_text()
    load_or_measure(smol.target, None, 3, quiet=True, busy=quiet_machine)
    assert steady_timing == [] and path.read_text() == before


def test_each_size_is_timed_right_after_single_token_passes(smol, monkeypatch):
    """As a step follows plain steps. On a GPU a pass after others of another shape costs
    more (llama.cpp rebuilds its graph): timed after a 4-token pass, a single token cost
    50 % more on an H200 than in every answer, which then marked the profile stale."""
    calls: list[tuple[int, int] | str] = []
    model = smol.target
    sequence = model.sequence(0)  # (where the profile is measured)
    decode, reset = sequence.decode, sequence.reset
    monkeypatch.setattr(
        sequence, "decode", lambda tokens, n=1: (calls.append((len(tokens), n)), decode(tokens, n))[1]
    )
    monkeypatch.setattr(sequence, "reset", lambda: (calls.append("reset"), reset())[1])
    load_or_measure(model, None, 4, quiet=True, busy=quiet_machine)
    runs, run = [], []
    for call in [*calls, "reset"]:
        if call == "reset":
            if len(run) >= 2:
                runs.append(run)
            run = []
        else:
            run.append(call)
    timed = {run[-1][0] for run in runs}
    assert timed == {1, 2, 3, 4}  # every verification size ...
    assert all(run[-3:-1] == [(1, 1), (1, 1)] for run in runs)  # ... right after two single tokens


def test_the_profile_is_keyed_by_machine_build_and_exact_files(smol):
    facts = profile_facts(smol.target, None)
    assert {"cpu", "isa", "cores", "llama.cpp", "target", "draft"} <= set(facts)
    # two hosts a VM names alike ("AMD EPYC") but with other instruction sets keep apart
    other = facts | {"isa": "avx avx2" if facts["isa"] != "avx avx2" else "avx avx2 avx512f"}
    assert profile_path_for(other, "t", None) != profile_path_for(facts, "t", None)
    assert facts["cpu"] and facts["llama.cpp"].startswith(llama_cpp_version())
    assert smol.target.name in profile_path(smol.target, None).name


def llama_cpp_version() -> str:
    import llama_cpp

    return llama_cpp.__version__


@pytest.mark.parametrize(
    "damage",
    ["corrupt", "implausible", "stale", "older version"],
)
def test_a_bad_profile_is_detected_and_measured_again(smol, damage):
    costs = load_or_measure(smol.target, None, 4, quiet=True, busy=quiet_machine)
    path = costs.profile_path
    data = json.loads(path.read_text())
    if damage == "corrupt":
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
    elif damage == "implausible":
        data["target"]["4"] = data["target"]["3"] / 10  # cost falling as tokens grow
        path.write_text(json.dumps(data))
    elif damage == "stale":
        data["stale"] = True
        path.write_text(json.dumps(data))
    else:
        data["version"] = 1
        path.write_text(json.dumps(data))
    notes: list[str] = []
    costs = load_or_measure(smol.target, None, 4, busy=quiet_machine, notify=notes.append)
    warning = [line for line in notes if "cost profile" in line]
    assert len(warning) == 1 and "measuring again" in warning[0], warning
    fresh = json.loads(path.read_text())
    # Measured anew: plausible (but for a dip two measurements found alike: the machine's
    # own), or (on a machine too disturbed to measure) kept provisional, which makes the
    # next load measure it again.
    points = {int(k): v for k, v in fresh["target"].items()}
    assert fresh["provisional"] or implausible(points, [tuple(pair) for pair in fresh["dips"]]) is None
    assert not fresh["stale"] and set(fresh["target"]) == {"1", "2", "3", "4"}


def test_a_profile_measured_on_a_busy_machine_is_provisional(smol, steady_timing):
    notes: list[str] = []
    costs = load_or_measure(smol.target, None, 3, busy=lambda: 1.5, notify=notes.append)
    assert costs.provisional and any("busy" in note for note in notes)
    path = costs.profile_path
    assert json.loads(path.read_text())["provisional"] is True
    # Still busy at the next load: the provisional figures are kept, not re-measured.
    before = path.read_text()
    load_or_measure(smol.target, None, 3, quiet=True, busy=lambda: 1.5)
    assert path.read_text() == before
    # Quiet now: measured again, and no longer provisional (and ``quiet`` keeps its note back).
    load_or_measure(smol.target, None, 3, quiet=True, busy=quiet_machine, notify=notes.append)
    assert json.loads(path.read_text())["provisional"] is False and len(notes) == 1


def test_costs_seen_online_that_disagree_with_the_shape_mark_the_profile_stale(smol):
    state = PairState(load_or_measure(smol.target, None, 4, quiet=True, busy=quiet_machine))
    curve = state.costs.target
    one = curve.estimate(1)
    assert state.check_costs() == []
    for _ in range(12):  # 4-token passes keep costing 3× what the profile's shape says
        curve.observe(1, one)
        curve.observe(4, 3 * curve.estimate(4))
    assert 4 in state.check_costs()
    assert json.loads(state.costs.profile_path.read_text())["stale"] is True

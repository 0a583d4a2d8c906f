"""The same answer, and the same session, take the same decisions however the machine's
passes wobble.

An answer counts its steps at the prices it started with (``auto.state.Prices``), not on
the clock: counted on the clock, a pass the machine happened to make slow moved the
answer's surplus over plain decoding, and with it which bets fitted, so the same prompt
in two fresh processes took other decisions and ended 10-20 % apart. Here each copy-heavy
answer of the test half is replayed alone (a fresh pair, as a new process has) twice, on
a curve whose every pass costs its price times a log-normal factor (σ = 12 %, what these
machines show) drawn from two seeds, with the profile measured quietly on the curve
itself: the decisions must be the same step for step, on every curve whose passes cost
by their size alone. Counted on the clock, most of them are not."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from replay_set import recorded_halves

from edgespec.bench.recording import Recording
from edgespec.bench.replay import CURVES, Curve, replay
from edgespec.decoding.auto import DEFAULT, Tuning

pytestmark = pytest.mark.needs_models  # the replayed models ask the real one for its vocabulary

COPY_HEAVY = ("edit-", "sum-", "rag-", "complete-")
SIGMA = 0.12


class Wobbly:
    """``curve`` whose target passes cost its price times ``speed`` times a log-normal
    factor of mean 1 (``speed``: the machine runs slower or faster than when its profile
    was measured, every size alike)."""

    def __init__(self, curve: Curve, seed: int, speed: float = 1.0):
        self.curve = curve
        self.rng = random.Random(seed)
        self.speed = speed

    def __getattr__(self, name: str):
        return getattr(self.curve, name)

    def target_seconds(self, k: int) -> float:
        wobble = math.exp(self.rng.gauss(0.0, SIGMA) - SIGMA**2 / 2)
        return self.curve.target_seconds(k) * self.speed * wobble


@pytest.fixture(scope="module")
def copying(pair) -> list[Recording]:
    return [rec for rec in recorded_halves(pair)["test"] if rec.id.startswith(COPY_HEAVY)]


def differing(
    pair, recordings: list[Recording], curve: str, tuning: Tuning = DEFAULT, speed: float = 1.0
) -> list[str]:
    """The answers whose decisions differ between two wobbles of ``curve``."""
    out, quiet = [], CURVES[curve]
    for rec in recordings:
        traces = [
            replay([rec], pair.target, pair.draft, Wobbly(quiet, seed, speed), ("auto",), tuning, quiet)  # type: ignore[arg-type]
            for seed in (1, 2)
        ]
        assert all(t[rec.id]["auto"].exact for t in traces)
        if traces[0][rec.id]["auto"].trace != traces[1][rec.id]["auto"].trace:
            out.append(rec.id)
    return out


# Steep and flat CPUs, a GPU and an H200: every curve whose passes cost by their size alone
# passes this. (On ``h200-history`` a pass costs by the passes before it: what the first
# answer learns of the return to single tokens, 1.5 plain steps there, crosses the margin
# several times as it grows, at steps the noise decides.)
@pytest.mark.parametrize("curve", ["xeon", "epyc-f26", "cpu-f16", "gpu", "h200"])
def test_an_answer_takes_the_same_decisions_however_the_passes_wobble(pair, copying, curve):
    assert len(copying) >= 20
    assert differing(pair, copying, curve) == []


@pytest.mark.parametrize("curve", ["xeon", "epyc-f26", "cpu-f16", "gpu", "h200"])
def test_a_session_takes_the_same_decisions_however_the_passes_wobble(pair, copying, curve):
    """The copy-heavy half as one session, as ``edgespec bench`` or a server answers it:
    every answer after the first starts at the prices the first started at, while what
    the pair learned since fits them (``PairState.prices``), so no pass the noise made
    slow in one answer moves the next one's decisions. Taken afresh at every answer, the
    prices carried each session's noise: 15-21 of these 22 answers decided otherwise under
    another wobble."""
    quiet = CURVES[curve]
    runs = [
        replay(copying, pair.target, pair.draft, Wobbly(quiet, seed), ("auto",), DEFAULT, quiet)  # type: ignore[arg-type]
        for seed in (1, 2)
    ]
    differ = [rec.id for rec in copying if runs[0][rec.id]["auto"].trace != runs[1][rec.id]["auto"].trace]
    assert differ == [], curve


@pytest.mark.parametrize("speed", [0.7, 1.4])
def test_a_machine_faster_or_slower_than_its_profile_takes_the_same_decisions(pair, copying, speed):
    """A VM runs a third faster or slower from one hour to the next, every size alike: what
    the pair learns of it moves every price together, which changes no decision, so the
    prices are judged by their shape and the answer keeps them."""
    assert differing(pair, copying, "epyc-f26", speed=speed) == []


def test_counted_on_the_clock_the_decisions_wobble_with_the_passes(pair, copying):
    """The test above can fail: with no margin, every step is off its price and counted on
    the clock, as before, and most answers decide otherwise under another wobble."""
    on_the_clock = dataclasses.replace(DEFAULT, price_margin=1.0)
    assert len(differing(pair, copying, "xeon", on_the_clock)) > len(copying) // 2

"""Four recorded answers at once, replayed on a cost curve (``bench.replay_parallel``):
the real engine thread and controller, their target passes (and draft decodes) decoded as
one pass of the curve over all their tokens. On the steep CPUs the issue named, ``auto``
at once must be no slower than ``--drafter none`` at once; where a pass costs about the
same whatever it holds, drafting together must pay."""

from __future__ import annotations

import pytest
from replay_set import recorded_halves

from edgespec.bench.recording import Recording
from edgespec.bench.replay import CURVES
from edgespec.bench.replay_parallel import ParallelReplay, compare, groups

pytestmark = pytest.mark.needs_models  # the replayed models ask the real one for its vocabulary


@pytest.fixture(scope="module")
def corpus(pair) -> dict[str, list[Recording]]:
    return recorded_halves(pair)


def at_once_ratios(pair, recordings: list[Recording], curve: str) -> list[float]:
    replay = ParallelReplay(pair.target, pair.draft, CURVES[curve], 4)
    ratios = []
    for group in groups(recordings, 4):
        runs = compare(replay, group)
        assert all(run.exact for by_side in runs.values() for run in by_side.values()), (curve, group)
        ratios.append(runs["auto"]["at once"].rate / runs["target only"]["at once"].rate)
    return ratios


@pytest.mark.parametrize("curve", ["epyc-f26", "cpu", "cpu-avx2", "h200-history"])
def test_four_answers_at_once_are_never_slower_with_auto_on_steep_cpus(pair, corpus, curve):
    for split, recordings in corpus.items():
        ratios = at_once_ratios(pair, recordings, curve)
        assert len(ratios) >= 10 and min(ratios) >= 0.97, (curve, split, [round(r, 3) for r in ratios])


def test_drafting_together_pays_where_a_pass_costs_the_same_whatever_it_holds(pair, corpus):
    """(Where every answer weighed its draft at the margin alone, none would start, and
    four answers at once on a GPU would draft no more than plain decoding.)"""
    ratios = at_once_ratios(pair, corpus["dev"], "gpu")
    assert sum(ratios) / len(ratios) > 1.05


def test_a_replay_at_once_decides_the_same_in_every_run(pair, corpus):
    """The rounds are the curve's, not the threads' timing: the same group gives the same
    clock in two runs."""
    replay = ParallelReplay(pair.target, pair.draft, CURVES["epyc-f26"], 4)
    group = groups(corpus["test"], 4)[0]
    first, again = (replay.run(group, "auto", at_once=True) for _ in range(2))
    assert (first.tokens, first.exact) == (again.tokens, again.exact)
    assert first.seconds == pytest.approx(again.seconds, rel=1e-9)  # (the clock runs on from the first)

"""Four recorded answers at once, replayed on a cost curve (``bench.replay_parallel``):
the real engine thread and controller, their target passes (and draft decodes) decoded as
one pass of the curve over all their tokens. On the steep CPUs the issue named, ``auto``
at once must be no slower than ``--drafter none`` at once; where a pass costs about the
same whatever it holds, drafting together must pay."""

from __future__ import annotations

import dataclasses

import pytest
from replay_set import recorded_halves

from edgespec.bench.curves import Curve
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


@pytest.mark.parametrize("curve", ["epyc-f26", "epyc-f25", "cpu", "cpu-avx2", "h200-history"])
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


def aggregate_at_once(pair, recordings: list[Recording], curve: Curve, observe: bool = True) -> float:
    """``auto`` against ``--drafter none``, four answers at once, all the groups' tokens
    over all their seconds; ``observe``: the pair learns what its shared decodes cost."""
    replay = ParallelReplay(pair.target, pair.draft, curve, 4, observe_shared=observe)
    tokens = {"auto": 0, "target only": 0}
    seconds = {"auto": 0.0, "target only": 0.0}
    for group in groups(recordings, 4):
        for label in tokens:
            run = replay.run(group, label, at_once=True)
            assert run.exact, (curve.name, label, [r.id for r in group])
            tokens[label] += run.tokens
            seconds[label] += run.seconds
    return (tokens["auto"] / seconds["auto"]) / (tokens["target only"] / seconds["target only"])


@pytest.mark.parametrize("curve", list(CURVES))
def test_four_answers_at_once_are_no_slower_with_auto_in_aggregate_on_every_curve(pair, corpus, curve):
    for split, recordings in corpus.items():
        ratio = aggregate_at_once(pair, recordings, CURVES[curve])
        assert ratio >= 0.97, (curve, split, round(ratio, 3))


# A machine where one sequence's pass of many tokens costs about one token's (a GPU) but a
# decode of several sequences' passes pays nearly a whole token for each token beyond one
# per pass: priced by the one-sequence curve, drafts at once look free and are not.
DEAR_AT_ONCE = dataclasses.replace(CURVES["gpu"], name="gpu-dear-at-once", shared_token=1.0)


def test_a_shared_decode_is_priced_as_measured_not_by_one_sequences_curve(pair, corpus):
    """What the pair measured its shared decodes at keeps ``auto`` at once level with plain
    steps at once where the one-sequence curve would have it draft; without it, the same
    answers at once fall behind."""
    recordings = corpus["test"]
    assert aggregate_at_once(pair, recordings, DEAR_AT_ONCE) >= 0.97
    assert aggregate_at_once(pair, recordings, DEAR_AT_ONCE, observe=False) < 0.97

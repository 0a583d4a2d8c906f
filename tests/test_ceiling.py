"""The ceiling (bench.ceiling): the fastest schedule in hindsight over auto's drafters.

The dynamic program is checked against an exhaustive search over every step a replay could
take (drafts that hold, drafts that fail, any drafter, any length) on small synthetic
answers and curves, a measured curve's dips included; on real recordings it must bound
the replayed auto from above on every curve."""

from __future__ import annotations

import functools
import random

import pytest

from edgespec.bench.ceiling import (
    ceiling_ratios,
    fastest_seconds,
    held_runs,
    lookup_proposals,
    lookup_runs,
    model_runs,
)
from edgespec.bench.holds import Holds
from edgespec.bench.replay import BEST_FIXED, CURVES, FIXED_GRID, add_best_fixed, add_ceiling, replay


def exhaustive_seconds(lookup, model, verify_s, draft_token_s, longest):
    """Every step from every position: a draft of any γ ≤ longest by either drafter commits
    what of it holds plus one token; the least total time over all of them."""
    n = len(lookup)

    @functools.cache
    def best(i: int) -> float:
        if i >= n:
            return 0.0
        left = n - 1 - i
        options = []
        for gamma in range(0, longest + 1):
            commits = min(gamma, lookup[i], left) + 1
            options.append(verify_s(gamma + 1) + best(i + commits))
            if model is not None:
                commits = min(gamma, model[i], left) + 1
                options.append(verify_s(gamma + 1) + gamma * draft_token_s + best(i + commits))
        return min(options)

    return best(1)


@pytest.mark.parametrize("seed", range(40))
def test_the_fastest_schedule_is_the_least_time_over_every_schedule(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 14)
    longest = rng.randint(1, 6)
    lookup = [0] + [rng.choice([0, 0, 1, 2, 3, 5, 9]) for _ in range(n - 1)]
    model = [0] + [rng.choice([0, 1, 2, 4]) for _ in range(n - 1)] if seed % 2 else None
    # a steep or a flat curve, with a dip now and then (a measured profile has them)
    steep = rng.uniform(0.1, 1.0)
    table = {k: 1.0 + steep * (k - 1) * rng.uniform(0.6, 1.2) for k in range(1, longest + 2)}
    draft_token_s = rng.uniform(0.05, 0.6)
    got = fastest_seconds(lookup, model, table.__getitem__, draft_token_s, longest)
    want = exhaustive_seconds(lookup, model, table.__getitem__, draft_token_s, longest)
    assert got == pytest.approx(want)


def test_a_held_copy_on_a_flat_curve_is_drafted_whole_and_a_steep_curve_declines_it():
    lookup = [0, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0]  # positions 1..9 copy to the end
    flat = fastest_seconds(lookup, None, lambda k: 1.0 + 0.01 * (k - 1), 0.0, 16)
    assert flat == pytest.approx(1.0 + 0.01 * 9)  # one pass verifies all nine
    steep = fastest_seconds(lookup, None, lambda k: 1.2 * k, 0.0, 16)
    assert steep == pytest.approx(1.2 * 10)  # every drafted token costs more than a plain step
    # where no drafter holds, the ceiling is plain decoding
    assert fastest_seconds([0] * 6, [0] * 6, lambda k: float(k), 0.1, 4) == pytest.approx(5.0)


def test_runs_count_what_the_answer_confirms():
    assert held_runs([5, 6, 7], [1, 5, 6, 8], 1) == 2
    assert held_runs([5, 6], [1, 5], 1) == 1  # the answer ends
    assert held_runs([], [1, 2], 1) == 0
    # the draft model: its guesses agree with the answer at positions 1, 2, 3 and 5
    assert model_runs([9, 2, 3, 4, 0, 6], [1, 2, 3, 4, 5, 6]) == [0, 3, 2, 1, 0, 1]


def test_the_lookups_find_a_copy_of_the_prompt(pair):
    prompt = pair.target.tokenize("Repeat exactly: the quick brown fox jumps over the lazy dog.\n")
    answer = pair.target.tokenize("the quick brown fox jumps over the lazy dog.", add_special=False)
    runs = lookup_runs(lookup_proposals(pair.target, prompt, answer, 64), answer)
    assert runs[0] == 0
    # once the answer has started copying, the rest is proposed right to its end
    assert runs[2:] == [len(answer) - i for i in range(2, len(answer))]
    ratio, _ = ceiling_ratios(pair.target, prompt, answer, None, lambda k: 1.0 + 0.05 * k, 0.0, 64)
    assert ratio > 2.0


@pytest.mark.parametrize("curve", ["cpu-avx2", "cpu", "xeon-f16", "gpu", "h200-history"])
def test_no_replayed_configuration_beats_the_ceiling(pair, replay_recordings, curve):
    recordings = replay_recordings
    configs = ("target only", "auto", "model γ=2", "model γ=4", "copy γ=8")
    results = replay(recordings, pair.target, pair.draft, CURVES[curve], configs)
    assert add_ceiling(recordings, pair.target, CURVES[curve], results) == ["ceiling", "ceiling lookups"]
    for runs in results.values():
        for label in configs:
            assert runs[label].decode_tps <= runs["ceiling"].decode_tps * 1.0001, (curve, label)
        # a schedule of lookup drafts alone is bounded by the lookups' own ceiling
        assert runs["copy γ=8"].decode_tps <= runs["ceiling lookups"].decode_tps * 1.0001, curve
        assert runs["ceiling lookups"].decode_tps <= runs["ceiling"].decode_tps * 1.0001, curve
    # ... and the ceiling is no mere bound: on a flat curve the rename copies far past auto
    if curve == "gpu":
        edit = results["edit-rename-py-1"]
        assert edit["ceiling"].decode_tps > 1.3 * edit["auto"].decode_tps
        # ... and where a draft token is cheap, the draft model's guesses known in hindsight
        # win time that the lookups' ceiling leaves out
        chat = results["chat-explain-interest-2"]
        assert chat["ceiling lookups"].decode_tps < 0.95 * chat["ceiling"].decode_tps


@pytest.mark.parametrize("curve", ["xeon", "gpu"])
def test_the_best_fixed_configuration_per_answer_lies_between_each_fixed_one_and_the_ceiling(
    pair, replay_recordings, curve
):
    """ "best fixed" is a yardstick a causal controller could reach: one configuration per
    answer, picked in hindsight. Every schedule it picks is one the ceiling considers."""
    configs = ("target only", *FIXED_GRID)
    results = replay(replay_recordings, pair.target, pair.draft, CURVES[curve], configs)
    assert add_best_fixed(results) == BEST_FIXED
    add_ceiling(replay_recordings, pair.target, CURVES[curve], results)
    picked = set()
    for runs in results.values():
        best = runs[BEST_FIXED].decode_tps
        assert best <= runs["ceiling"].decode_tps * 1.0001, curve
        assert all(runs[label].decode_tps <= best for label in configs)
        picked.add(next(label for label in configs if runs[label].decode_tps == best))
    # picked per answer: the edit copies, the chat and the math take the draft model or
    # decode plainly, so no one configuration is every answer's fastest
    assert len(picked) > 1, (curve, picked)


def test_holds_count_each_span_only_where_it_could_have_held():
    """A proposal counts toward "the next k tokens hold" only where the proposal and the
    answer both have k tokens left; its tokens are judged up to the first wrong one."""
    holds = Holds()
    holds.add("ngram", 12, [1] * 20, 100, 20)  # held all 20
    holds.add("ngram", 10, [1] * 20, 100, 5)  # broke after 5
    holds.add("ngram", 9, [1] * 4, 100, 4)  # too short to count for 8 or more
    key = ("ngram", holds.bucket(12))
    assert holds.bucket(9) == holds.bucket(12) != holds.bucket(13)
    assert dict(holds.seen[key]) == {1: 3, 4: 3, 8: 2, 16: 2}
    assert dict(holds.held[key]) == {1: 3, 4: 3, 8: 1, 16: 1}
    assert holds.tokens[key] == [20 + 5 + 4, 20 + 6 + 4]
    row = next(line for line in holds.table().splitlines() if line.startswith("ngram"))
    assert row.split()[1:4] == ["9-12", "3", "0.97"]

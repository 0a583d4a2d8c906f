"""The best token tree per answer (bench.best_tree): several proposals verified in one pass.

The pricing is checked where the answer is known exactly: on a curve where every token of
a pass costs a full pass no tree beats plain decoding; on a flat curve a whole copy goes
in passes of 33 tokens; two lookups that each hold on half an answer win together what
neither wins alone. On synthetic answers and on real recordings the best tree lies
between the best single configuration and the ceiling."""

from __future__ import annotations

import random

import pytest

from edgespec.bench.best_tree import Tree, best_ratios, tree_seconds, tree_size, trees
from edgespec.bench.ceiling import ceiling_ratios, fastest_seconds, lookup_proposals, lookup_runs, model_runs
from edgespec.bench.replay import CURVES

ANSWER = list(range(100, 160))


def proposing(answer: list[int], holds: dict[str, list[int]], width: int = 32) -> list[dict[str, list[int]]]:
    """Per position, each lookup's proposal: ``holds[name][i]`` right tokens, then a wrong one."""
    along: list[dict[str, list[int]]] = [{}]
    for i in range(1, len(answer)):
        by_name = {}
        for name, held in holds.items():
            right = answer[i : i + held[i]]
            by_name[name] = [*right, -1 - i][:width] if held[i] < len(answer) - i else right
        along.append(by_name)
    return along


def test_a_prefix_two_proposals_share_is_verified_once():
    assert tree_size([[1, 2, 3], [1, 2, 4], [5]]) == 5
    assert tree_size([[1, 2], [1, 2]]) == 2
    assert tree_size([]) == 0


def test_the_grid_tells_single_proposals_from_trees():
    grid = trees(["copy", "ngram"])
    assert Tree(None, 0, 0) in grid  # plain decoding
    assert Tree(frozenset(["copy"]), 8, 0).single
    assert Tree(None, 0, 4).single  # the draft model alone
    assert not Tree(None, 8, 0).single  # both lookups at once
    assert not Tree(frozenset(["copy"]), 8, 4).single  # a lookup beside the draft model
    assert all(t.lookup_tokens or t.lookups is None for t in grid)


def test_where_each_token_costs_a_pass_no_tree_beats_plain_decoding():
    n = len(ANSWER)
    along = proposing(ANSWER, {"copy": [n] * n, "ngram": [3] * n})
    model = [n] * n
    single, tree = best_ratios(along, ANSWER, model, lambda k: float(k), 0.0)
    assert single == pytest.approx(1.0) and tree == pytest.approx(1.0)


def test_a_whole_copy_on_a_flat_curve_goes_33_tokens_a_pass():
    n = len(ANSWER)
    along = proposing(ANSWER, {"copy": [n] * n})
    seconds = tree_seconds(Tree(None, 32, 0), along, ANSWER, [0] * n, lambda k: 1.0, 0.0)
    assert seconds == 2.0  # positions 1..33, then 34..59
    single, tree = best_ratios(along, ANSWER, [0] * n, lambda k: 1.0, 0.0)
    assert single == tree == pytest.approx((n - 1) / 2)


def test_two_lookups_holding_on_either_half_win_together():
    n = len(ANSWER)
    first = [4 if i < n // 2 else 0 for i in range(n)]
    second = [0 if i < n // 2 else 4 for i in range(n)]
    along = proposing(ANSWER, {"copy": first, "ngram": second})
    single, tree = best_ratios(along, ANSWER, [0] * n, lambda k: 1.0 + 0.01 * k, 0.0)
    assert tree > 1.5 * single
    assert tree == pytest.approx(4.5, rel=0.1)


def test_the_draft_model_is_charged_one_token_past_its_first_wrong_guess():
    n = 12
    answer = ANSWER[:n]
    model = [0] + [2] * (n - 1)  # two right guesses everywhere, then a wrong one
    seconds = tree_seconds(Tree(None, 0, 8), [{}] * n, answer, model, lambda k: 1.0, 0.25)
    steps = 4  # positions 1, 4, 7, 10: three tokens each, the last two
    assert seconds == pytest.approx(steps * (1.0 + 3 * 0.25))


@pytest.mark.parametrize("seed", range(20))
def test_the_best_tree_lies_between_the_best_single_configuration_and_the_ceiling(seed):
    rng = random.Random(seed)
    n = rng.randint(8, 40)
    answer = ANSWER[:n]
    holds = {
        name: [0] + [rng.choice([0, 0, 1, 3, 8, 20]) for _ in range(n - 1)] for name in ("copy", "ngram")
    }
    holds = {name: [min(h, n - i) for i, h in enumerate(held)] for name, held in holds.items()}
    along = proposing(answer, holds)
    model = [0] + [rng.choice([0, 1, 2, 5]) for _ in range(n - 1)]
    steep = rng.uniform(0.0, 0.8)
    step_s = lambda k: 1.0 + steep * (k - 1)  # noqa: E731
    draft_token_s = rng.uniform(0.0, 0.4)
    single, tree = best_ratios(along, answer, model, step_s, draft_token_s)
    lookup = lookup_runs(along, answer)
    ceiling = (n - 1) * step_s(1) / fastest_seconds(lookup, model, step_s, draft_token_s, 63)
    assert 1.0 - 1e-9 <= single <= tree <= ceiling * (1 + 1e-9)


@pytest.mark.parametrize("curve", ["xeon", "gpu"])
def test_on_real_answers_the_best_tree_stays_under_the_ceiling(pair, replay_recordings, curve):
    c = CURVES[curve]
    above_single = 0
    for rec in replay_recordings:
        sequence = rec.answer + ([pair.target.eos] if rec.ended else [])
        along = lookup_proposals(pair.target, rec.prompt, sequence, 32)
        single, tree = best_ratios(along, sequence, model_runs(rec.guesses, sequence), c.step_seconds,
                                   c.draft_seconds(1))  # fmt: skip
        ceiling, _ = ceiling_ratios(
            pair.target, rec.prompt, rec.answer, rec.guesses, c.step_seconds, c.draft_seconds(1), 63,
            pair.target.eos if rec.ended else None,
        )  # fmt: skip
        assert single <= tree <= ceiling * 1.0001, (rec.id, curve)
        above_single += tree > single * 1.001
    # on a flat curve a tree wins somewhere: the proposals do not all hold at the same steps
    assert above_single >= (1 if curve == "gpu" else 0)

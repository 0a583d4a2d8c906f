"""The ceiling ``edgespec bench --parallel`` states: the answers' own passes in lockstep
rounds, priced on a cost curve (pure, on synthetic curves)."""

from __future__ import annotations

import pytest

from edgespec.bench.parallel import lockstep_ceiling


def test_plain_answers_gain_what_the_curve_gives_a_wider_pass():
    # 4 answers of 10 plain steps; a pass of k tokens costs 40 ms + 20 ms per token beyond one.
    price = lambda k: 0.040 + 0.020 * (k - 1)  # noqa: E731
    passes = [[1] * 10] * 4
    wall = 40 * 0.040  # nothing but the passes
    assert lockstep_ceiling(passes, wall, price) == pytest.approx(4 * 0.040 / 0.100)


def test_a_flat_curve_gains_the_count_and_a_linear_one_nothing():
    passes = [[5, 5, 1], [3], [2, 2]]
    assert lockstep_ceiling(passes, 6.0, lambda k: 1.0) == pytest.approx(6.0 / 3.0)
    assert lockstep_ceiling(passes, 18.0, lambda k: float(k)) == pytest.approx(1.0)


def test_time_outside_the_passes_is_kept_as_it_was():
    # Rounds: [1+1], [1]: 2 + 1 = 3 s against 3 alone plus 3 s of prompts and drafting.
    price = lambda k: 1.0 if k == 1 else 2.0  # noqa: E731
    assert lockstep_ceiling([[1, 1], [1]], 6.0, price) == pytest.approx(6.0 / 6.0)
    assert lockstep_ceiling([[1], [1], [1]], 6.0, price) == pytest.approx(6.0 / 5.0)
    assert lockstep_ceiling([[], []], 2.0, price) == pytest.approx(1.0)

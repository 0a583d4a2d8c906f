"""What a decode of several answers' passes costs (``decoding.costs.shared``), and how a
shared step is priced by it (``auto.pricing``): pure arithmetic on a synthetic curve."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.auto.pricing import plain_seconds, sharing, step_rates, verify_seconds
from edgespec.decoding.costs import CostCurve, CostModel
from edgespec.decoding.costs.shared import TRUSTED, SharedDecodes

ONE = 0.03  # a single-token pass


def linear_costs() -> CostModel:
    """One sequence's pass of k tokens costs 0.6 k + 0.4 single-token passes."""
    costs = CostModel(target=CostCurve(65), draft=CostCurve(65), overhead=0.0, plain_overhead=0.0)
    for k in range(1, 66):
        costs.target.set(k, ONE * (0.6 * k + 0.4))
        costs.draft.set(k, ONE * 0.3 * k)
    return costs


def test_a_size_seen_often_enough_is_priced_as_measured():
    costs, decodes = linear_costs(), SharedDecodes()
    assert decodes.seconds(4, 6, costs.target) == pytest.approx(costs.target.estimate(6))
    for _ in range(TRUSTED):
        decodes.observe(4, 6, 5 * ONE, costs.target)
    assert decodes.seconds(4, 6, costs.target) == pytest.approx(5 * ONE)
    assert decodes.sizes_seen() == 1


def test_an_unseen_size_with_a_draft_costs_what_drafted_tokens_added_to_decodes_seen():
    costs, decodes = linear_costs(), SharedDecodes()
    plain = costs.target.estimate(4)  # four single tokens, not seen yet: one pass of four
    decodes.observe(4, 6, plain + 2 * ONE, costs.target)  # seen once: not its own figure
    assert decodes.seconds(4, 6, costs.target) == pytest.approx(plain + 2 * ONE)
    assert decodes.seconds(4, 9, costs.target) == pytest.approx(plain + 5 * ONE)
    # a plain decode (a token per pass) is not moved by it; three passes take what four showed
    assert decodes.seconds(4, 4, costs.target) == pytest.approx(plain)
    assert decodes.seconds(3, 6, costs.target) == pytest.approx(costs.target.estimate(3) + 3 * ONE)
    row = decodes.seconds_row(4, np.array([4, 6, 9]), costs.target)
    assert row == pytest.approx([decodes.seconds(4, n, costs.target) for n in (4, 6, 9)])


def test_one_pass_alone_and_nonsense_teach_nothing():
    costs, decodes = linear_costs(), SharedDecodes()
    for sequences, tokens, seconds in ((1, 3, 9.0), (4, 3, 9.0), (4, 6, 0.0), (4, 6, float("nan"))):
        decodes.observe(sequences, tokens, seconds, costs.target)
    assert decodes.sizes_seen() == 0
    assert decodes.seconds(4, 6, costs.target) == pytest.approx(costs.target.estimate(6))


def test_a_draft_at_once_is_priced_by_the_decode_with_and_without_it():
    """Four answers at once: three others' single tokens, and this answer's pass. By one
    sequence's curve a drafted token adds 0.6 of a pass, as a plain one does; measured, the
    decode with a draft costs a whole pass per drafted token, and a draft that holds every
    token it proposes no longer beats a plain step at once."""
    costs, decodes = linear_costs(), SharedDecodes()
    for tokens in range(3, 12):
        drafted = max(tokens - 4, 0)
        seconds = costs.target.estimate(min(tokens, 4)) + drafted * ONE * 1.0
        for _ in range(TRUSTED):
            decodes.observe(3 if tokens == 3 else 4, tokens, seconds, costs.target)
    gammas = np.arange(1, 8)
    sure = gammas + 1.0  # every drafted token holds
    by_curve = sharing(costs, 3, 3)
    measured = sharing(costs, 3, 3, decodes)
    assert by_curve is not None and measured is not None
    assert measured.plain_s == pytest.approx(by_curve.plain_s)  # a plain token: 0.6 either way
    plain_rate = 1.0 / plain_seconds(costs)  # plain decoding, on the scale rates are given in
    rates_by_curve = step_rates(sure, verify_seconds(costs, gammas, by_curve), by_curve)
    rates_measured = step_rates(sure, verify_seconds(costs, gammas, measured), measured)
    assert (rates_by_curve >= plain_rate * 0.999).all()  # by the curve, drafting looks as good
    assert (rates_measured < plain_rate * 0.76).all()  # measured, it loses at once

"""The cost-aware controller behind ``--drafter auto --gamma auto``, split by concern:

* ``tuning``: every tuning value, in one frozen ``Tuning``;
* ``stats``: the drafters' measured acceptance (learned across answers);
* ``realized``: what the chosen steps delivered, and bans of options that fell short;
* ``pricing``: pure functions pricing each way of taking a step;
* ``state``: the state by lifetime (``PairState`` across answers, ``AnswerState``,
  ``StepScratch``);
* ``policy``: ``AdaptivePolicy``, the plan/observe glue.
"""

from __future__ import annotations

import math

from edgespec.decoding.auto.policy import AdaptivePolicy
from edgespec.decoding.auto.pricing import Choice
from edgespec.decoding.auto.state import AnswerState, PairState, StepScratch
from edgespec.decoding.auto.stats import AcceptanceStats, LookupStats, expected_tokens, posterior_mean
from edgespec.decoding.auto.tuning import DEFAULT, Tuning
from edgespec.decoding.costs import CostModel

__all__ = [
    "DEFAULT",
    "AcceptanceStats",
    "AdaptivePolicy",
    "AnswerState",
    "Choice",
    "LookupStats",
    "PairState",
    "StepScratch",
    "Tuning",
    "describe",
    "expected_tokens",
    "posterior_mean",
]


def describe(costs: CostModel) -> str:
    """One line of what was measured, for --verbose and the bench header."""
    t = costs.target
    points = [
        f"T({k})={1000 * t.estimate(k):.0f}ms"
        for k in (1, 2, 5, 9, 17, 33, 65)
        if k <= t.k_max and not math.isnan(t.estimate(k))
    ]
    d = costs.draft.estimate(1)
    return " ".join(points) + (f" draft={1000 * d:.0f}ms/token" if not math.isnan(d) else "")

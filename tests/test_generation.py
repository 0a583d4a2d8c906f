"""One answer's own objects, without models: its live control, a step's proposals
(computed once, handed over as values), and pricing that changes nothing."""

from __future__ import annotations

import copy

import pytest
from synthetic_costs import CPU_TARGET, FLAT_TARGET, costs, policy, view

from edgespec.decoding.drafters import NgramDrafter, Proposal
from edgespec.decoding.generation import LiveControl, StepProposals
from edgespec.errors import RequestError


def test_live_control_checks_lenience_and_stops_once() -> None:
    live = LiveControl(0.8)
    assert live.lenience == 0.8 and not live.stopped
    live.set_lenience(0.5)
    assert live.lenience == 0.5
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(RequestError) as caught:
            live.set_lenience(bad)
        assert caught.value.param == "lenience"
    assert live.lenience == 0.5  # a refused value changes nothing
    live.stop()
    assert live.stopped and live.cancel.is_set()


class CountingNgram(NgramDrafter):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[int] = []

    def lookup(self, context: list[int], max_tokens: int) -> tuple[list[int], int]:
        self.asked.append(max_tokens)
        return super().lookup(context, max_tokens)


def test_a_step_computes_each_proposal_once_and_again_only_for_more_tokens() -> None:
    drafter = CountingNgram()
    context = [1, 2, 3, 4, 5, 1, 2, 3]
    proposals = StepProposals({"ngram": drafter}, context)
    first = proposals.get("ngram", 2)
    assert first == Proposal("ngram", (4, 5), 3, False, 2)
    assert proposals.get("ngram", 1).tokens == (4,)  # cut from the one computed
    assert drafter.asked == [2]
    assert proposals.get("ngram", 8).tokens == (4, 5, 1, 2, 3)
    assert drafter.asked == [2, 8]
    assert proposals.taken("ngram", 8) is not None and proposals.taken("ngram", 9) is None
    # a drafter the answer lacks, and one that is not free, propose nothing
    assert proposals.get("copy", 4) == Proposal("copy")
    assert proposals.catch_up("model") == 0


@pytest.mark.parametrize("curve", [CPU_TARGET, FLAT_TARGET])
def test_pricing_a_step_changes_nothing(curve) -> None:
    adaptive = policy(costs(curve, draft_ms=30), ("ngram", "model"))
    step = view([7, 8, 9, 7, 8, 9, 7, 8], catch_up=40)
    before = copy.deepcopy(adaptive.answer)
    first = adaptive.choices(step)
    again = adaptive.choices(step)
    assert [(c.drafter, c.gamma, c.rate) for c in first.options] == [
        (c.drafter, c.gamma, c.rate) for c in again.options
    ]
    assert first.model == again.model and first.model is not None
    assert len(adaptive.answer.open) == len(before.open) and adaptive.answer.model_price == before.model_price

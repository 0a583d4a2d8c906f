"""Who drafts and how much, decided before every step.

A policy never sees the engine or its drafters: as an answer starts its generation calls
``begin``; before each step it hands the policy a ``StepView`` (the committed context, the
token budget, the sampling parameters, and the free drafters' proposals as ``Proposal``
values, computed once per step and only when asked for), and after the step a
``StepOutcome``. A policy serves one answer.
``FixedPolicy`` always asks the same drafter for the same γ (the classic loop, and
``--drafter none`` for target-only baselines). The cost-aware ``AdaptivePolicy`` lives in
``edgespec.decoding.auto`` and implements the same calls. ``edgespec.decoding.choice``
turns a user's (drafter, γ) into one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from edgespec.decoding.drafters import DECODING_DRAFTERS, FIXED_CHOICES, NONE, Draft, Proposal
from edgespec.decoding.sampling import SamplingParams

UNIT_END, LINE_BREAK = 1, 2  # what StepView.boundaries says of a token (0: neither)


def _nothing_proposed(name: str, max_tokens: int) -> Proposal:
    return Proposal(name)


def _no_catch_up(name: str) -> int:
    return 0


@dataclass(frozen=True)
class Plan:
    drafter: str  # a registered drafter's name, or "none"
    gamma: int  # most tokens to draft (0 = plain decoding)
    keep_going: Callable[[int, float], bool] | None = None  # early stop, see DraftRequest
    reason: str = ""
    wants_confidence: bool = False  # the policy learns from the draft's confidences


@dataclass(frozen=True)
class StepView:
    """What a policy sees of the step it decides: a value the engine hands out."""

    context: list[int]  # committed tokens: the prompt and the answer so far
    budget: int  # most tokens the step may draft (context room, max tokens, largest batch)
    params: SamplingParams
    remaining: int = 0  # answer tokens still allowed (max tokens less those generated)
    # Where a copy tends to stop (or not): for each token, 0 if it ends no sentence or line,
    # 1 if it does, 2 if it also carries a line break (UNIT_END, LINE_BREAK).
    boundaries: Callable[[list[int]], list[int]] | None = None
    # A free drafter's proposal for this step, of at most the tokens asked: computed at
    # most once a step, and drafted from as it is when the plan chooses it.
    proposal: Callable[[str, int], Proposal] = _nothing_proposed
    # Context tokens a drafter would decode before its first draft token.
    catch_up: Callable[[str], int] = _no_catch_up
    # The other answers' passes decoded with this answer's last one, and their tokens:
    # what its next pass is likely to be decoded with (threaded, several answers at once).
    others: int = 0
    others_tokens: int = 0


@dataclass(frozen=True)
class StepOutcome:
    drafter: str
    gamma: int  # tokens actually drafted and verified
    accepted: int
    draft: Draft
    verify_s: float
    overhead_s: float  # Python time of the step outside llama.cpp
    new_tokens: list[int]  # what the step committed (accepted drafts + the target's token)
    shared_with: int = 0  # the other answers' passes its target pass was decoded with

    @property
    def shared(self) -> bool:
        return self.shared_with > 0


class Policy(Protocol):
    prefill_draft: bool  # prefill the draft model right after the first token

    def begin(self) -> None: ...

    def plan(self, view: StepView) -> Plan: ...

    def observe(self, outcome: StepOutcome) -> None: ...


class FixedPolicy:
    """Always the same drafter and γ (``decoding.choice`` checked them)."""

    def __init__(self, drafter: str, gamma: int):
        assert drafter in FIXED_CHOICES and gamma >= 0, (drafter, gamma)
        self.drafter = drafter if gamma > 0 else NONE
        self.gamma = gamma if drafter != NONE else 0
        self.prefill_draft = self.drafter in DECODING_DRAFTERS  # the draft reads the prompt

    def begin(self) -> None:
        pass

    def plan(self, view: StepView) -> Plan:
        return Plan(self.drafter, min(self.gamma, view.budget))

    def observe(self, outcome: StepOutcome) -> None:
        pass

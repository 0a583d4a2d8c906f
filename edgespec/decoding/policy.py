"""Who drafts and how much, decided before every step.

A policy never sees the engine or its drafters: as an answer starts the engine calls
``begin``; before each step it hands the policy a ``StepView`` (the committed context, the
token budget, the sampling parameters, and the lookups' proposals, gathered by the engine
once per step and only when asked for), and after the step a ``StepOutcome``.
``FixedPolicy`` always asks the same drafter for the same γ (the classic loop, and
``--drafter none`` for target-only baselines). The cost-aware ``AdaptivePolicy`` lives in
``edgespec.decoding.auto`` and implements the same calls. ``edgespec.decoding.choice``
turns a user's (drafter, γ) into one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from edgespec.decoding.drafters import CHOICES, FIXED_CHOICES, NONE, Draft
from edgespec.decoding.sampling import SamplingParams
from edgespec.errors import EdgespecError

UNIT_END, LINE_BREAK = 1, 2  # what StepView.boundaries says of a token (0: neither)


def _nothing_proposed(name: str, max_tokens: int) -> tuple[list[int], int]:
    return [], 0


def _not_predicted(name: str) -> bool:
    return False


def _no_catch_up() -> int:
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
    # A lookup drafter's proposal for this step, up to max tokens: (tokens, matched length).
    # The engine computes each at most once a step, and drafts the chosen one from it.
    lookup: Callable[[str, int], tuple[list[int], int]] = _nothing_proposed
    # Context tokens the draft model would decode before its first draft token.
    draft_catch_up: Callable[[], int] = _no_catch_up
    # Does a lookup's proposal (as last asked) copy the request's Predicted Output?
    from_prediction: Callable[[str], bool] = _not_predicted


@dataclass(frozen=True)
class StepOutcome:
    drafter: str
    gamma: int  # tokens actually drafted and verified
    accepted: int
    draft: Draft
    verify_s: float
    overhead_s: float  # Python time of the step outside llama.cpp
    new_tokens: list[int]  # what the step committed (accepted drafts + the target's token)


class Policy(Protocol):
    prefill_draft: bool  # prefill the draft model right after the first token

    def check(self, drafters: Collection[str], max_gamma: int) -> None: ...

    def begin(self) -> None: ...

    def plan(self, view: StepView) -> Plan: ...

    def observe(self, outcome: StepOutcome) -> None: ...


class FixedPolicy:
    def __init__(self, drafter: str, gamma: int):
        if drafter not in FIXED_CHOICES:
            raise EdgespecError(f"unknown drafter {drafter!r} (choose {', '.join(CHOICES)})")
        if gamma < 0:
            raise EdgespecError(f"gamma must be >= 0 (got {gamma})")
        self.drafter = drafter if gamma > 0 else NONE
        self.gamma = gamma if drafter != NONE else 0
        self.prefill_draft = self.drafter == "model"

    def check(self, drafters: Collection[str], max_gamma: int) -> None:
        if self.drafter != "none" and self.drafter not in drafters:
            raise EdgespecError(f"drafter '{self.drafter}' needs a draft model, and none is loaded")
        if self.gamma > max_gamma:
            raise EdgespecError(f"gamma {self.gamma} is larger than this engine allows ({max_gamma})")

    def begin(self) -> None:
        pass

    def plan(self, view: StepView) -> Plan:
        return Plan(self.drafter, min(self.gamma, view.budget))

    def observe(self, outcome: StepOutcome) -> None:
        pass

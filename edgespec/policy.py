"""Who drafts and how much, decided before every step.

``FixedPolicy`` always asks the same drafter for the same γ (the classic loop, and
``--drafter none`` for target-only baselines). The cost-aware ``AdaptivePolicy`` lives in
``edgespec.controller`` and implements the same three calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from edgespec.drafters import Draft
from edgespec.errors import EdgespecError
from edgespec.sampling import SamplingParams

if TYPE_CHECKING:
    from edgespec.engine import Engine

FIXED_DRAFTERS = ("model", "ngram", "reflow", "none")
DRAFTER_CHOICES = (*FIXED_DRAFTERS, "auto")


@dataclass(frozen=True)
class Plan:
    drafter: str  # "model", "ngram", "reflow" or "none"
    gamma: int  # most tokens to draft (0 = plain decoding)
    keep_going: Callable[[int, float], bool] | None = None  # early stop, see DraftRequest
    reason: str = ""
    wants_confidence: bool = False  # the policy learns from the draft's confidences


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

    def check(self, engine: Engine) -> None: ...

    def plan(self, engine: Engine, context: list[int], budget: int, params: SamplingParams) -> Plan: ...

    def observe(self, outcome: StepOutcome) -> None: ...


class FixedPolicy:
    def __init__(self, drafter: str, gamma: int):
        if drafter not in FIXED_DRAFTERS:
            raise EdgespecError(f"unknown drafter {drafter!r} (choose {', '.join(DRAFTER_CHOICES)})")
        if gamma < 0:
            raise EdgespecError(f"gamma must be >= 0 (got {gamma})")
        self.drafter = drafter if gamma > 0 else "none"
        self.gamma = gamma if drafter != "none" else 0
        self.prefill_draft = self.drafter == "model"

    def check(self, engine: Engine) -> None:
        if self.drafter != "none" and self.drafter not in engine.drafters:
            raise EdgespecError(f"drafter '{self.drafter}' needs a draft model, and none is loaded")
        if self.gamma > engine.max_gamma:
            raise EdgespecError(f"gamma {self.gamma} is larger than this engine allows ({engine.max_gamma})")

    def plan(self, engine: Engine, context: list[int], budget: int, params: SamplingParams) -> Plan:
        return Plan(self.drafter, min(self.gamma, budget))

    def observe(self, outcome: StepOutcome) -> None:
        pass

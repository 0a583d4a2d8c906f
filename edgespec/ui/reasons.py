"""Why a step drafted what it did, in words. The adaptive controller records its choice as
``Step.reason``: the options it priced, ``drafter:γ@rate/s`` joined by commas (the first
is plain decoding, ``none:0``), the word ``idle`` when it skipped pricing, or nothing under
fixed settings. The step itself says which option ran."""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgespec.decoding.drafters import NONE
from edgespec.decoding.events import Step

IDLE = "idle"
FIXED_WORDS = "fixed setting"
IDLE_WORDS = "skipped pricing (nothing came near paying)"
_OPTION = re.compile(r"^\s*(?P<drafter>[\w-]+):(?P<gamma>\d+)@(?P<rate>[\d.]+(?:e[+-]?\d+)?|inf|nan)/s\s*$")


@dataclass(frozen=True)
class Option:
    drafter: str
    gamma: int
    rate: float  # the controller's estimate, tokens per second


def parse_reason(reason: str) -> list[Option] | None:
    """The priced options of a reason, in its order; None when it is not such a list."""
    options = []
    for part in reason.split(","):
        match = _OPTION.match(part)
        if match is None:
            return None
        options.append(Option(match["drafter"], int(match["gamma"]), float(match["rate"])))
    return options or None


def _rate(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def reason_words(step: Step) -> str:
    """The step's reason for a person: what was chosen, and the estimate it beat."""
    reason = step.reason.strip()
    if not reason:
        return FIXED_WORDS
    if reason == IDLE:
        return IDLE_WORDS
    options = parse_reason(reason)
    plain = next((o for o in options or () if o.drafter == NONE), None)
    if options is None or plain is None:
        return reason  # a form this page does not know: shown as it came
    drafts = [o for o in options if o.drafter != NONE]
    versus = f"vs {_rate(plain.rate)} plain"
    if step.drafter == NONE and step.planned_gamma == 0:
        if not drafts:
            return f"no draft: no drafting option to price (est. {_rate(plain.rate)} tok/s plain)"
        best = max(drafts, key=lambda o: o.rate)
        # Drafting must beat plain decoding clearly (its estimates are noisy), and a drafter
        # that lost time lately sits out: a slightly higher estimate can still lose.
        margin = " (not clearly faster)" if best.rate > plain.rate else ""
        return (
            f"no draft: est. {_rate(plain.rate)} tok/s plain, "
            f"best draft {best.drafter}, {_tokens(best.gamma)}, est. {_rate(best.rate)}{margin}"
        )
    if step.drafter == NONE:
        # A drafter was asked for tokens and proposed none: the step names no drafter, so
        # the option is the best priced one of the planned length, when there is one.
        asked = [o for o in drafts if o.gamma == step.planned_gamma]
        if not asked:
            return f"asked for {_tokens(step.planned_gamma)}; the drafter found nothing to propose"
        chosen = max(asked, key=lambda o: o.rate)
        return (
            f"chose {chosen.drafter}, {_tokens(step.planned_gamma)}: est. {_rate(chosen.rate)} tok/s "
            f"{versus}; it found nothing to propose"
        )
    priced = [o for o in drafts if o.drafter == step.drafter]
    if not priced:
        return f"chose {step.drafter}, {_tokens(step.planned_gamma)} (not priced: {reason})"
    chosen = priced[0]
    if chosen.rate <= plain.rate or chosen.rate < max(o.rate for o in drafts):
        # Not the best estimate: a trial, so that a drafter never chosen is still measured.
        return (
            f"tried {step.drafter}, {_tokens(step.planned_gamma)} (to keep measuring it): "
            f"est. {_rate(chosen.rate)} tok/s {versus}"
        )
    return f"chose {step.drafter}, {_tokens(step.planned_gamma)}: est. {_rate(chosen.rate)} tok/s {versus}"

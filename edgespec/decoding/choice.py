"""The one place that turns a user's (drafter, γ) into a policy, with one default
(``auto`` for both) and one validation (``check_choice``, γ's one parser ``parse_gamma``),
shared by the Python API, the CLI, the server and the app; ``make_policy`` trusts what the
validation let through."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from edgespec.decoding.drafters import AUTO, CHOICES, NONE, REGISTRY
from edgespec.decoding.policy import FixedPolicy, Policy
from edgespec.errors import RequestError

if TYPE_CHECKING:
    from edgespec.decoding.auto import PairState

# The longest draft verified in one pass: a long verbatim copy pays more the further it is
# drafted (a pass over 64 tokens costs far less than 64 single passes even on a CPU), and
# llama.cpp keeps a logits row per verified token, so the bound also bounds that buffer.
MAX_GAMMA = 64
DEFAULT_DRAFTER = AUTO
DEFAULT_GAMMA: int | str = AUTO


def parse_gamma(value: object, max_gamma: int = MAX_GAMMA) -> int | str:
    """γ as any front end is given it (a flag, a request body's field, the app's control):
    'auto' or a whole number from 0 to ``max_gamma``. The one γ parser, so that every front
    end refuses a value with the same words; a refusal is one line naming the field."""
    if isinstance(value, str) and value.strip() == AUTO:
        return AUTO
    gamma = _whole_number(value)
    if gamma is None:
        raise RequestError(f"gamma must be 'auto' or a whole number (got {value!r})", "gamma")
    if gamma < 0:
        raise RequestError(f"gamma must be 'auto' or from 0 to {max_gamma} (got {gamma})", "gamma")
    if gamma > max_gamma:
        raise RequestError(
            f"gamma {gamma} is more than the {max_gamma} tokens verified in one pass at most", "gamma"
        )
    return gamma


def _whole_number(value: object) -> int | None:
    # bool is an int to Python, but `true` is no γ; 2.5 or 4.0 is a client's mistake too.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def check_drafter(drafter: object, *, has_draft: bool) -> str:
    """A known drafter, the draft model only where one is loaded."""
    if not isinstance(drafter, str) or drafter not in CHOICES:
        raise RequestError(f"unknown drafter {drafter!r}; choose one of {', '.join(CHOICES)}", "drafter")
    if drafter in REGISTRY and REGISTRY[drafter].needs_model and not has_draft:
        raise RequestError(f"drafter '{drafter}' needs a draft model, and none is loaded", "drafter")
    return drafter


def check_choice(
    drafter: object, gamma: object, *, has_draft: bool, max_gamma: int = MAX_GAMMA
) -> tuple[str, int | str]:
    """(drafter, γ) validated: what the request builder (and the CLI, before it loads a
    model) runs, once; ``make_policy`` trusts its result."""
    return check_drafter(drafter, has_draft=has_draft), parse_gamma(gamma, max_gamma)


def make_policy(
    drafter: str,
    gamma: int | str,
    *,
    loaded: Collection[str],
    max_gamma: int,
    pair_state: Callable[[], PairState],
) -> Policy:
    """The policy for a checked (drafter, γ) (``check_choice``'s result, as a ``Request``
    holds it) over the drafters ``loaded``: a fixed one when neither is auto (or the
    drafter is none), else the adaptive controller, which learns into the pair's state
    (``pair_state`` is called only then: it may measure the cost profile first)."""
    # A programming error, not a user's: the request builder refused bad values already.
    usable = drafter in (AUTO, NONE) or drafter in loaded
    in_range = gamma == AUTO or (isinstance(gamma, int) and 0 <= gamma <= max_gamma)
    assert usable and in_range, f"make_policy takes a checked choice (got {drafter!r}, {gamma!r})"
    if drafter == NONE:
        return FixedPolicy(NONE, 0)  # target only: nothing to price, no profile to measure
    if gamma != AUTO and drafter != AUTO:
        return FixedPolicy(drafter, int(gamma))
    from edgespec.decoding.auto import AdaptivePolicy

    names = tuple(name for name in REGISTRY if name in loaded) if drafter == AUTO else (drafter,)
    fixed = None if gamma == AUTO else int(gamma)
    return AdaptivePolicy(pair_state(), names, gamma_cap=max_gamma, fixed_gamma=fixed)

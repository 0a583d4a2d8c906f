"""The one place that turns a user's (drafter, γ) into a policy, with one default
(``auto`` for both) and one validation, shared by the Python API, the CLI, the server and
the app."""

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


def parse_gamma(value: object) -> int | str:
    """γ as given on a command line or in a request body: 'auto' or a whole number."""
    if value == AUTO:
        return AUTO
    if isinstance(value, bool):
        raise RequestError(f"gamma must be 'auto' or a whole number (got {value!r})", "gamma")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise RequestError(f"gamma must be 'auto' or a whole number (got {value!r})", "gamma")


def check_choice(
    drafter: object, gamma: object, *, has_draft: bool, max_gamma: int = MAX_GAMMA
) -> tuple[str, int | str]:
    """(drafter, γ) validated: a known drafter, the draft model only where one is loaded,
    γ 'auto' or 0..max_gamma. Every refusal is one line naming the field."""
    if not isinstance(drafter, str) or drafter not in CHOICES:
        raise RequestError(f"unknown drafter {drafter!r}; choose one of {', '.join(CHOICES)}", "drafter")
    if drafter in REGISTRY and REGISTRY[drafter].needs_model and not has_draft:
        raise RequestError(f"drafter '{drafter}' needs a draft model, and none is loaded", "drafter")
    gamma = parse_gamma(gamma)
    if gamma != AUTO:
        assert isinstance(gamma, int)
        if gamma < 0:
            raise RequestError(f"gamma must be 'auto' or from 0 to {max_gamma} (got {gamma})", "gamma")
        if gamma > max_gamma:
            raise RequestError(
                f"gamma {gamma} is more than the {max_gamma} tokens verified in one pass at most", "gamma"
            )
    return drafter, gamma


def make_policy(
    drafter: object,
    gamma: object,
    *,
    loaded: Collection[str],
    max_gamma: int,
    pair_state: Callable[[], PairState],
) -> Policy:
    """The policy for ``--drafter X --gamma Y`` over the drafters ``loaded``: a fixed one
    when neither is auto (or the drafter is none), else the adaptive controller, which
    learns into the pair's state (``pair_state`` is called only then: it may measure the
    cost profile first)."""
    has_draft = any(REGISTRY[name].needs_model for name in loaded if name in REGISTRY)
    drafter, gamma = check_choice(drafter, gamma, has_draft=has_draft, max_gamma=max_gamma)
    if drafter == NONE:
        return FixedPolicy(NONE, 0)  # target only: nothing to price, no profile to measure
    if gamma != AUTO and drafter != AUTO:
        return FixedPolicy(drafter, int(gamma))
    from edgespec.decoding.auto import AdaptivePolicy

    names = tuple(name for name in REGISTRY if name in loaded) if drafter == AUTO else (drafter,)
    fixed = None if gamma == AUTO else int(gamma)
    return AdaptivePolicy(pair_state(), names, gamma_cap=max_gamma, fixed_gamma=fixed)

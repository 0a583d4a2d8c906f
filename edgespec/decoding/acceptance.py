"""Deciding how much of a drafted block the target model keeps.

Notation (shared by every function here): the drafter proposed tokens
d_1..d_γ, drawing d_i from q_i = ``q[i-1]``; the target scored the block in one
pass, giving p_i = ``p[i-1]`` for i = 1..γ+1, where p_{γ+1} is the bonus
position after all drafts. ``q=None`` means a deterministic drafter (n-gram
lookup and the like): q_i is one-hot at d_i. That case is handled in closed
form, never by materialising one-hot rows of V = 151,936 entries.

The decision probabilities are exposed as pure functions
(token_acceptance_probabilities, block_weights, block_stop_probability,
block_stop_probabilities, residual) so that the exactness tests can enumerate
every outcome using exactly the code the verifiers run.

All arithmetic on probabilities is float64, whatever the input dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.decoding.sampling import sample
from edgespec.errors import RequestError

__all__ = [
    "Verdict",
    "block_stop_probabilities",
    "block_stop_probability",
    "block_weights",
    "residual",
    "token_acceptance_probabilities",
    "verify_block",
    "verify_greedy",
    "verify_tokens",
]

# A residual whose total mass is at or below this is rounding noise: with exact
# arithmetic a residual is only ever sampled when its mass is positive.
_RESIDUAL_EPS = 1e-12


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one drafted block."""

    accepted: int  # number of draft tokens accepted (0..γ)
    next_token: int  # correction (accepted < γ) or bonus (accepted == γ) token


def _tokens(draft: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(draft, dtype=np.int64).reshape(-1)


def _check(d: np.ndarray, q: np.ndarray | None, p: np.ndarray) -> None:
    gamma = d.shape[0]
    if p.ndim != 2 or p.shape[0] != gamma + 1:
        raise ValueError(f"p must have shape ({gamma + 1}, V), got {p.shape}")
    if q is not None and q.shape != (gamma, p.shape[1]):
        raise ValueError(f"q must have shape ({gamma}, {p.shape[1]}), got {q.shape}")
    if gamma and (d.min() < 0 or d.max() >= p.shape[1]):
        raise ValueError("draft token id out of vocabulary range")


def _draft_probs(d: np.ndarray, q: np.ndarray | None) -> np.ndarray:
    """q_i(d_i) for every position; 1 for a deterministic drafter."""
    if q is None:
        return np.ones(d.shape[0], dtype=np.float64)
    return q[np.arange(d.shape[0]), d].astype(np.float64)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, with x/0 = inf for x > 0 and 0/0 = 0.

    den == 0 only happens for a draft token its own drafter gave probability
    0 (impossible when d_i ~ q_i, possible through rounding): the target then
    has more mass there than the draft, which is what "inf" expresses.
    """
    fill = np.where(num > 0, np.inf, 0.0)
    return np.divide(num, den, out=fill, where=den > 0)


def check_lenience(lenience: float) -> float:
    """λ itself: in (0, 1] (1 is exact); anything else is refused, naming the field."""
    if not 0.0 < lenience <= 1.0:  # also rejects NaN
        raise RequestError(f"lenience must be in (0, 1] (got {lenience:g})", "lenience")
    return lenience


def token_acceptance_probabilities(
    draft: Sequence[int] | np.ndarray,
    q: np.ndarray | None,
    p: np.ndarray,
    lenience: float = 1.0,
) -> np.ndarray:
    """a_i = min(1, p_i(d_i) / (λ q_i(d_i))) for i = 1..γ, shape (γ,) float64.

    Token verification accepts d_i with probability a_i given d_1..d_{i-1}
    were accepted. ``p`` may have γ or γ+1 rows (only the first γ are read).
    """
    d = _tokens(draft)
    check_lenience(lenience)
    target = p[np.arange(d.shape[0]), d].astype(np.float64)
    a = _ratio(target, lenience * _draft_probs(d, q))
    return np.minimum(a, 1.0, out=a)


def residual(
    p_row: np.ndarray,
    q_row: np.ndarray | None,
    scale: float = 1.0,
    *,
    draft_token: int | None = None,
) -> np.ndarray:
    """normalise(max(0, scale * p_row - q_row)) as a new (V,) float64 row.

    ``q_row=None`` means q is one-hot at ``draft_token``, so only that entry is
    reduced. Used with scale = 1/λ by token verification (max(0, p - λq) is
    proportional to max(0, p/λ - q)) and with scale = the block weight by
    block verification. A residual with no mass (only reachable by rounding)
    falls back to p_row itself.
    """
    r = np.multiply(p_row, scale, dtype=np.float64)
    if q_row is None:
        if draft_token is None:
            raise ValueError("draft_token is required when q_row is None")
        r[draft_token] -= 1.0
    else:
        np.subtract(r, q_row, out=r)
    np.maximum(r, 0.0, out=r)
    total = float(r.sum())
    if total <= _RESIDUAL_EPS:
        r = np.asarray(p_row, dtype=np.float64).copy()
        total = float(r.sum())
    r /= total
    return r


def block_weights(draft: Sequence[int] | np.ndarray, q: np.ndarray | None, p: np.ndarray) -> np.ndarray:
    """The block-verification weights w_0..w_γ, shape (γ+1,) float64.

    w_0 = 1 and w_i = min(1, w_{i-1} p_i(d_i) / q_i(d_i)) (called p_i in Sun et
    al., ICLR 2025). For q=None the ratio is p_i(d_i), so w_i is
    the product of the target probabilities of the drafts.
    """
    d = _tokens(draft)
    ratios = _ratio(p[np.arange(d.shape[0]), d].astype(np.float64), _draft_probs(d, q))
    w = np.empty(d.shape[0] + 1, dtype=np.float64)
    w[0] = 1.0
    for i, r in enumerate(ratios, start=1):  # γ scalars, not a vocabulary loop
        prev = w[i - 1]
        # 0 * inf must be 0: once the weight is 0 no later block can be kept.
        w[i] = 0.0 if prev == 0.0 or r == 0.0 else min(1.0, prev * r)
    return w


def block_stop_probability(
    weight: float,
    p_next: np.ndarray,
    q_next: np.ndarray | None,
    *,
    draft_token: int | None = None,
) -> float:
    """h_i for i < γ, from w_i and the rows of position i+1 (p_{i+1}, q_{i+1}).

    h_i = R / (R + 1 - w_i) with R = Σ_x max(0, w_i p_{i+1}(x) - q_{i+1}(x)),
    the mass of the residual that would follow if the block were cut after
    d_i. (Equivalently R / Σ_x max(0, q_{i+1}(x) - w_i p_{i+1}(x)) when the
    rows sum to 1; this form stays in [0, 1] under rounding.) For q=None,
    q_{i+1} is one-hot at d_{i+1} = ``draft_token``, so
    R = w_i (1 - p_{i+1}(d_{i+1})) + max(0, w_i p_{i+1}(d_{i+1}) - 1).
    """
    if weight <= 0.0:
        return 0.0
    if q_next is None:
        if draft_token is None:
            raise ValueError("draft_token is required when q_next is None")
        pd = float(p_next[draft_token])
        mass = weight * (1.0 - pd) + max(0.0, weight * pd - 1.0)
    else:
        buf = np.multiply(p_next, weight, dtype=np.float64)
        np.subtract(buf, q_next, out=buf)
        np.maximum(buf, 0.0, out=buf)
        mass = float(buf.sum())
    if mass <= 0.0:
        # Nothing could be emitted after cutting here, so never cut here.
        return 0.0
    return mass / (mass + max(0.0, 1.0 - weight))


def block_stop_probabilities(
    draft: Sequence[int] | np.ndarray,
    q: np.ndarray | None,
    p: np.ndarray,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """h_1..h_γ, shape (γ,) float64, with h_γ = w_γ.

    Block verification keeps the first τ drafts, τ = the largest i with
    η_i < h_i for independent η_i ~ U[0, 1) (τ = 0 if none), so
    P(τ = i) = h_i Π_{j>i} (1 - h_j) (with h_0 = 1).
    """
    d = _tokens(draft)
    gamma = d.shape[0]
    w = block_weights(d, q, p) if weights is None else weights
    h = np.empty(gamma, dtype=np.float64)
    for i in range(1, gamma):
        h[i - 1] = block_stop_probability(
            float(w[i]), p[i], None if q is None else q[i], draft_token=int(d[i])
        )
    if gamma:
        h[gamma - 1] = w[gamma]
    return h


def verify_greedy(draft: Sequence[int] | np.ndarray, target_argmax: np.ndarray) -> Verdict:
    """Greedy verification: keep drafts while they equal the target's argmax."""
    d = _tokens(draft)
    t = np.asarray(target_argmax).reshape(-1)
    gamma = d.shape[0]
    if t.shape[0] != gamma + 1:
        raise ValueError(f"target_argmax must have {gamma + 1} entries, got {t.shape[0]}")
    mismatch = np.flatnonzero(d != t[:gamma])
    accepted = int(mismatch[0]) if mismatch.size else gamma
    return Verdict(accepted=accepted, next_token=int(t[accepted]))


def verify_tokens(
    draft: Sequence[int] | np.ndarray,
    q: np.ndarray | None,
    p: np.ndarray,
    rng: np.random.Generator,
    lenience: float = 1.0,
) -> Verdict:
    """Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    d_i is accepted with probability min(1, p_i(d_i) / (λ q_i(d_i))); on the
    first rejection the next token is drawn from normalise(max(0, p_i - λ q_i));
    if all γ drafts are accepted it is drawn from p_{γ+1}.

    λ = ``lenience`` = 1 is exact: the emitted tokens are distributed as the
    target's. λ < 1 accepts more drafts, but the output is then biased toward
    the drafter's distribution and no longer follows the target's.

    Randomness: γ uniforms (one per draft, drawn up front so that for a given
    seed a smaller λ never accepts fewer drafts), then one draw for the next
    token.
    """
    d = _tokens(draft)
    _check(d, q, p)
    gamma = d.shape[0]
    if gamma == 0:
        return Verdict(accepted=0, next_token=sample(p[0], rng))
    a = token_acceptance_probabilities(d, q, p, lenience)
    u = rng.random(gamma)
    rejected = np.flatnonzero(u >= a)  # accept iff u < a: probability exactly a
    if rejected.size == 0:
        return Verdict(accepted=gamma, next_token=sample(p[gamma], rng))
    i = int(rejected[0])
    r = residual(p[i], None if q is None else q[i], 1.0 / lenience, draft_token=int(d[i]))
    return Verdict(accepted=i, next_token=sample(r, rng))


def verify_block(
    draft: Sequence[int] | np.ndarray,
    q: np.ndarray | None,
    p: np.ndarray,
    rng: np.random.Generator,
) -> Verdict:
    """Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, ICLR 2025).

    The paper's algorithm, in this module's notation:

    - weights w_0 = 1, w_i = min(1, w_{i-1} p_i(d_i) / q_i(d_i))   (block_weights)
    - h_γ = w_γ; for i < γ, h_i = R_i / (R_i + 1 - w_i) with
      R_i = Σ_x max(0, w_i p_{i+1}(x) - q_{i+1}(x))    (block_stop_probability)
    - η_1..η_γ ~ U[0, 1) independently; τ = max{i : η_i < h_i}, or 0
    - next token ~ p_{γ+1} if τ = γ, else ~ normalise(max(0, w_τ p_{τ+1} - q_{τ+1}))

    The output (the τ kept drafts followed by the next token, then continued
    by the target) is distributed exactly as the target, and E[τ] is never
    below token verification's. Unlike token verification, whether d_i is
    kept depends on the drafts after it, so the decision needs the whole block.

    The h_i are evaluated from i = γ downward and only until the first
    success: often no vocabulary pass at all (η_γ < w_γ), rarely all γ - 1.
    """
    d = _tokens(draft)
    _check(d, q, p)
    gamma = d.shape[0]
    if gamma == 0:
        return Verdict(accepted=0, next_token=sample(p[0], rng))
    w = block_weights(d, q, p)
    eta = rng.random(gamma)
    tau = 0
    for i in range(gamma, 0, -1):
        if i == gamma:
            h = float(w[gamma])
        else:
            h = block_stop_probability(float(w[i]), p[i], None if q is None else q[i], draft_token=int(d[i]))
        if eta[i - 1] < h:
            tau = i
            break
    if tau == gamma:
        return Verdict(accepted=gamma, next_token=sample(p[gamma], rng))
    r = residual(p[tau], None if q is None else q[tau], float(w[tau]), draft_token=int(d[tau]))
    return Verdict(accepted=tau, next_token=sample(r, rng))

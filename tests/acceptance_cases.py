"""Shared cases for the acceptance tests: tiny context-dependent models, the outcome
distributions of token and block verification computed from the module's own helpers,
their exact enumeration, and a chi-square p-value for sampled counts."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import chisquare

from edgespec.decoding.acceptance import (
    block_stop_probabilities,
    block_weights,
    residual,
    token_acceptance_probabilities,
)

# An outcome list: (τ, P(τ | draft), distribution of the next token given τ).
Outcomes = list[tuple[int, float, np.ndarray]]
OutcomeFn = Callable[[tuple[int, ...], np.ndarray | None, np.ndarray], Outcomes]
Table = dict[tuple[int, ...], np.ndarray]

PASS_LEVEL = 1e-4  # a correct sampler must give a chi-square p-value above this
FAIL_LEVEL = 1e-8  # a wrong sampler must give a p-value below this


def random_dist(rng: np.random.Generator, v: int, zero_frac: float = 0.0) -> np.ndarray:
    """A random distribution over v tokens, with about zero_frac of them impossible."""
    x = rng.dirichlet(np.full(v, 0.6))
    dead = rng.random(v) < zero_frac
    dead[rng.integers(v)] = False  # at least one token stays possible
    x[dead] = 0.0
    return x / x.sum()


def make_table(rng: np.random.Generator, v: int, max_len: int, zero_frac: float) -> Table:
    """A context-dependent model: one next-token distribution per prefix of length <= max_len."""
    return {
        prefix: random_dist(rng, v, zero_frac)
        for n in range(max_len + 1)
        for prefix in itertools.product(range(v), repeat=n)
    }


def rows(table: Table, prefix: Sequence[int], n: int) -> np.ndarray:
    """The model's rows for positions 1..n along prefix: row i is conditioned on prefix[:i]."""
    return np.stack([table[tuple(prefix[:i])] for i in range(n)])


def chisquare_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value; impossible outcomes must never be observed.

    Outcomes with expected count < 5 are pooled into one bin so that the
    asymptotic distribution of the statistic is trustworthy.
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    assert counts[probs <= 0].sum() == 0, "an impossible outcome was observed"
    n = counts.sum()
    expected = probs * n / probs.sum()
    big = expected >= 5
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big & (probs > 0)).any():
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0
    return float(chisquare(obs, exp).pvalue)


def token_outcomes(
    d: tuple[int, ...],
    q: np.ndarray | None,
    p: np.ndarray,
    lenience: float = 1.0,
    residual_fn: Callable[..., np.ndarray] = residual,
) -> Outcomes:
    """Outcome distribution of token verification for one draft, from the module's helpers."""
    gamma = len(d)
    a = token_acceptance_probabilities(d, q, p, lenience)
    out: Outcomes = []
    alive = 1.0  # P(d_1..d_i all accepted)
    for i in range(gamma):
        r = residual_fn(p[i], None if q is None else q[i], 1.0 / lenience, draft_token=d[i])
        out.append((i, alive * (1.0 - a[i]), r))
        alive *= a[i]
    out.append((gamma, alive, p[gamma]))
    return out


def block_outcomes(
    d: tuple[int, ...],
    q: np.ndarray | None,
    p: np.ndarray,
    residual_fn: Callable[..., np.ndarray] = residual,
    stop_fn: Callable[..., np.ndarray] = block_stop_probabilities,
    largest: bool = True,
) -> Outcomes:
    """Outcome distribution of block verification for one draft, from the module's helpers.

    τ is the largest i with η_i < h_i (η independent uniforms), hence
    P(τ = i) = h_i Π_{j>i} (1 - h_j) with h_0 = 1. ``largest=False`` gives the
    (wrong) smallest-success rule, used only as a negative control.
    """
    gamma = len(d)
    w = block_weights(d, q, p)
    h = np.concatenate([[1.0], stop_fn(d, q, p)])
    out: Outcomes = []
    for tau in range(gamma + 1):
        if largest:
            prob = h[tau] * math.prod(1.0 - h[j] for j in range(tau + 1, gamma + 1))
        else:
            first = h[tau] if tau > 0 else 1.0
            prob = first * math.prod(1.0 - h[j] for j in range(1, tau if tau else gamma + 1))
        if tau == gamma:
            dist = p[gamma]
        else:
            dist = residual_fn(p[tau], None if q is None else q[tau], w[tau], draft_token=d[tau])
        out.append((tau, prob, dist))
    return out


def draft_blocks(
    draft: Table | None, drafter: dict[tuple[int, ...], int] | None, v: int, gamma: int
) -> list[tuple[tuple[int, ...], float]]:
    """Every draft block of length γ with its probability (one block for a deterministic
    drafter); impossible blocks left out."""
    if drafter is not None:
        d: tuple[int, ...] = ()
        for _ in range(gamma):
            d += (drafter[d],)
        return [(d, 1.0)]
    assert draft is not None
    blocks = [
        (d, math.prod(draft[d[:i]][d[i]] for i in range(gamma)))
        for d in itertools.product(range(v), repeat=gamma)
    ]
    return [(d, w) for d, w in blocks if w > 0]


def emission_distribution(
    target: Table,
    draft: Table | None,
    drafter: dict[tuple[int, ...], int] | None,
    v: int,
    gamma: int,
    outcome_fn: OutcomeFn,
) -> dict[tuple[int, ...], float]:
    """Exact distribution of γ+1 tokens: one verification round, then target continuation.

    Either ``draft`` (a stochastic drafter table) or ``drafter`` (deterministic:
    prefix -> proposed token, i.e. q=None) must be given.
    """
    result: dict[tuple[int, ...], float] = defaultdict(float)

    def extend(prefix: tuple[int, ...], mass: float) -> None:
        if len(prefix) == gamma + 1:
            result[prefix] += mass
            return
        dist = target[prefix]
        for y in range(v):
            if dist[y] > 0:
                extend((*prefix, y), mass * dist[y])

    for d, weight in draft_blocks(draft, drafter, v, gamma):
        p = rows(target, d, gamma + 1)
        q = None if draft is None else rows(draft, d, gamma)
        for tau, prob, dist in outcome_fn(d, q, p):
            if prob <= 0:
                continue
            for y in range(v):
                if dist[y] > 0:
                    extend((*d[:tau], y), weight * prob * dist[y])
    return result


def target_joint(target: Table, v: int, length: int) -> dict[tuple[int, ...], float]:
    return {
        s: math.prod(target[s[:i]][s[i]] for i in range(length))
        for s in itertools.product(range(v), repeat=length)
    }


def max_deviation(got: dict[tuple[int, ...], float], want: dict[tuple[int, ...], float]) -> float:
    keys = set(got) | set(want)
    return max(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in keys)


def expected_accepted(
    target: Table,
    draft: Table | None,
    drafter: dict[tuple[int, ...], int] | None,
    v: int,
    gamma: int,
    outcome_fn: OutcomeFn,
) -> float:
    """E[τ] by enumeration over draft blocks and verifier outcomes."""
    total = 0.0
    for d, weight in draft_blocks(draft, drafter, v, gamma):
        p = rows(target, d, gamma + 1)
        q = None if draft is None else rows(draft, d, gamma)
        total += weight * sum(tau * prob for tau, prob, _ in outcome_fn(d, q, p))
    return total


def make_instance(
    seed: int, v: int, gamma: int, zero_frac: float, deterministic: bool
) -> tuple[Table, Table | None, dict[tuple[int, ...], int] | None]:
    rng = np.random.default_rng(seed)
    target = make_table(rng, v, gamma, zero_frac)
    if deterministic:
        drafter = {
            prefix: int(rng.integers(v))
            for n in range(gamma)
            for prefix in itertools.product(range(v), repeat=n)
        }
        return target, None, drafter
    return target, make_table(rng, v, gamma - 1, zero_frac), None


def fixed_case(det: bool) -> tuple[tuple[int, ...], np.ndarray | None, np.ndarray]:
    """A fixed block whose verification outcomes are all reasonably likely.

    Among the drafts the drafter can produce, take the one maximising the
    least likely accepted length under block verification, so the sampling
    tests see every τ (and every residual) often.
    """
    # Seeds picked (once, by hand) so that every τ has probability > 0.05.
    rng = np.random.default_rng(77 if det else 67)
    v, gamma = 5, 3
    zero_frac = 0.2 if det else 0.0
    p = np.stack([random_dist(rng, v, zero_frac) for _ in range(gamma + 1)])
    q = None if det else np.stack([random_dist(rng, v, zero_frac) for _ in range(gamma)])

    def spread(d: tuple[int, ...]) -> float:
        if q is not None and min(q[i, d[i]] for i in range(gamma)) == 0:
            return -1.0
        return min(prob for _, prob, _ in block_outcomes(d, q, p))

    best = max(itertools.product(range(v), repeat=gamma), key=spread)
    assert spread(best) > 0.05
    return best, q, p

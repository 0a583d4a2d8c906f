"""Exactness of the verifiers in ``edgespec.decoding.acceptance``.

Three layers, each able to catch a different kind of mistake:

1. Enumeration (no sampling): for tiny context-dependent models, every draft
   block (weighted by the drafter) and every verifier outcome (weighted by the
   decision probabilities the verifiers themselves compute) is enumerated. The
   emission is continued with the target up to γ+1 tokens, and the resulting
   joint distribution must equal the target's joint distribution. This is the
   correctness statement of speculative decoding: one verification round
   followed by plain target sampling is indistinguishable from plain target
   sampling.
2. Outcome sampling: the verifiers' actual (accepted, next_token) frequencies
   for a fixed draft match the outcome distribution used in layer 1, which ties
   the sampling code (uniform comparisons, choice of τ) to the enumerated one.
3. End to end: with drafts drawn from q, the first emitted token is distributed
   as p_1 (chi-square), with a deliberately wrong verifier as negative control.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from edgespec.decoding.acceptance import (
    Verdict,
    block_weights,
    residual,
    token_acceptance_probabilities,
    verify_block,
    verify_tokens,
)
from tests.acceptance_cases import (
    FAIL_LEVEL,
    PASS_LEVEL,
    OutcomeFn,
    Outcomes,
    block_outcomes,
    chisquare_pvalue,
    emission_distribution,
    expected_accepted,
    fixed_case,
    make_instance,
    make_table,
    max_deviation,
    random_dist,
    target_joint,
    token_outcomes,
)

INSTANCES = [
    (seed, v, gamma, zero_frac, det)
    for v in (3, 4)
    for gamma in (1, 2, 3)
    for zero_frac, det in ((0.0, False), (0.4, False), (0.3, True))
    for seed in (11, 12)
]


# ------------------------------------------------------------- 1. exactness by enumeration


@pytest.mark.parametrize("outcomes", [token_outcomes, block_outcomes], ids=["token", "block"])
@pytest.mark.parametrize(("seed", "v", "gamma", "zero_frac", "det"), INSTANCES)
def test_verification_is_exact_by_enumeration(
    seed: int, v: int, gamma: int, zero_frac: float, det: bool, outcomes
) -> None:
    target, draft, drafter = make_instance(seed, v, gamma, zero_frac, det)
    got = emission_distribution(target, draft, drafter, v, gamma, outcomes)
    assert math.isclose(sum(got.values()), 1.0, abs_tol=1e-12)
    assert max_deviation(got, target_joint(target, v, gamma + 1)) < 1e-9


def test_exactness_with_disjoint_supports() -> None:
    # Target and drafter never agree at the first position; later rows overlap partly.
    v, gamma = 4, 2
    rng = np.random.default_rng(5)
    target = make_table(rng, v, gamma, 0.0)
    draft = make_table(rng, v, gamma - 1, 0.0)
    target[()] = np.array([0.7, 0.3, 0.0, 0.0])
    draft[()] = np.array([0.0, 0.0, 0.4, 0.6])
    for prefix in itertools.product(range(v), repeat=1):
        draft[prefix] = np.array([0.0, 0.5, 0.5, 0.0])
    want = target_joint(target, v, gamma + 1)
    for fn in (token_outcomes, block_outcomes):
        got = emission_distribution(target, draft, None, v, gamma, fn)
        assert max_deviation(got, want) < 1e-9


def _block_residual_without_weight(
    p_row: np.ndarray, q_row: np.ndarray | None, scale: float = 1.0, *, draft_token: int
) -> np.ndarray:
    return residual(p_row, q_row, 1.0, draft_token=draft_token)


def _resample_from_target(
    p_row: np.ndarray, q_row: np.ndarray | None, scale: float = 1.0, *, draft_token: int
) -> np.ndarray:
    return np.asarray(p_row, dtype=np.float64)


def _token_resample_from_p(d: tuple[int, ...], q: np.ndarray | None, p: np.ndarray) -> Outcomes:
    return token_outcomes(d, q, p, residual_fn=_resample_from_target)


def _token_lenient(d: tuple[int, ...], q: np.ndarray | None, p: np.ndarray) -> Outcomes:
    return token_outcomes(d, q, p, lenience=0.7)


def _block_unweighted_residual(d: tuple[int, ...], q: np.ndarray | None, p: np.ndarray) -> Outcomes:
    return block_outcomes(d, q, p, residual_fn=_block_residual_without_weight)


def _block_stop_is_weight(d: tuple[int, ...], q: np.ndarray | None, p: np.ndarray) -> Outcomes:
    return block_outcomes(d, q, p, stop_fn=lambda d, q, p: block_weights(d, q, p)[1:])


def _block_smallest_success(d: tuple[int, ...], q: np.ndarray | None, p: np.ndarray) -> Outcomes:
    return block_outcomes(d, q, p, largest=False)


WRONG_VERIFIERS = [
    pytest.param(fn, det, id=f"{fn.__name__.lstrip('_')}-{'q=None' if det else 'q'}")
    for fn in (
        _token_resample_from_p,
        _token_lenient,
        _block_unweighted_residual,
        _block_stop_is_weight,
        _block_smallest_success,
    )
    for det in (False, True)
    # With a one-hot q every residual is "p without the draft token" whatever the
    # weight, so ignoring the weight is harmless there: not a mistake to detect.
    if not (det and fn is _block_unweighted_residual)
]


@pytest.mark.parametrize(("wrong", "det"), WRONG_VERIFIERS)
def test_enumeration_rejects_wrong_verifiers(wrong: OutcomeFn, det: bool) -> None:
    # Negative control: the enumeration test has the power to see each mistake.
    v, gamma = 3, 3
    target, draft, drafter = make_instance(21, v, gamma, 0.0, det)
    got = emission_distribution(target, draft, drafter, v, gamma, wrong)
    assert max_deviation(got, target_joint(target, v, gamma + 1)) > 1e-3


# ------------------------------------------------------------- 3. block accepts more


def test_paper_motivating_example() -> None:
    # Sun et al. (ICLR 2025), Section 1: context-independent models over {a, b},
    # M_b = (1/3, 2/3), M_s = (2/3, 1/3), γ = 2: token verification accepts 10/9
    # tokens on average, block verification 11/9.
    v, gamma = 2, 2
    target = {s: np.array([1 / 3, 2 / 3]) for n in range(3) for s in itertools.product(range(2), repeat=n)}
    draft = {s: np.array([2 / 3, 1 / 3]) for n in range(2) for s in itertools.product(range(2), repeat=n)}
    tok = expected_accepted(target, draft, None, v, gamma, token_outcomes)
    blk = expected_accepted(target, draft, None, v, gamma, block_outcomes)
    assert tok == pytest.approx(10 / 9, abs=1e-12)
    assert blk == pytest.approx(11 / 9, abs=1e-12)


def test_block_never_accepts_fewer_than_token_in_expectation() -> None:
    strictly_better = 0
    for seed in range(150):
        rng = np.random.default_rng(1000 + seed)
        v = int(rng.integers(2, 5))
        gamma = int(rng.integers(1, 4))
        zero_frac = float(rng.choice([0.0, 0.3]))
        det = bool(rng.random() < 0.25)
        target, draft, drafter = make_instance(seed, v, gamma, zero_frac, det)
        tok = expected_accepted(target, draft, drafter, v, gamma, token_outcomes)
        blk = expected_accepted(target, draft, drafter, v, gamma, block_outcomes)
        assert blk >= tok - 1e-12, (seed, blk, tok)
        strictly_better += blk > tok + 1e-3
    assert strictly_better >= 20


# ------------------------------------------------------------- 2. verifiers sample their outcomes


def _outcome_counts(
    verify: Callable[[np.random.Generator], Verdict], n: int, gamma: int, v: int, seed: int
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros((gamma + 1, v))
    for _ in range(n):
        verdict = verify(rng)
        counts[verdict.accepted, verdict.next_token] += 1
    return counts


def _outcome_probs(outcomes: Outcomes, gamma: int, v: int) -> np.ndarray:
    probs = np.zeros((gamma + 1, v))
    for tau, prob, dist in outcomes:
        probs[tau] += prob * np.asarray(dist)
    return probs


@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("kind", ["token", "token-lenient", "block"])
def test_verifier_samples_the_enumerated_outcomes(kind: str, det: bool) -> None:
    d, q, p = fixed_case(det)
    gamma, v = p.shape[0] - 1, p.shape[1]
    if kind == "block":
        outcomes = block_outcomes(d, q, p)
        counts = _outcome_counts(lambda g: verify_block(d, q, p, g), 12_000, gamma, v, 3)
    else:
        lam = 0.6 if kind == "token-lenient" else 1.0
        outcomes = token_outcomes(d, q, p, lenience=lam)
        counts = _outcome_counts(lambda g: verify_tokens(d, q, p, g, lenience=lam), 12_000, gamma, v, 3)
    probs = _outcome_probs(outcomes, gamma, v)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert chisquare_pvalue(counts.ravel(), probs.ravel()) > PASS_LEVEL


def test_outcome_sampling_test_has_power() -> None:
    # Negative control: verify_block's frequencies are far from the distribution
    # implied by taking the *smallest* successful i, so the test above would
    # notice that mistake.
    d, q, p = fixed_case(False)
    gamma, v = p.shape[0] - 1, p.shape[1]
    right = _outcome_probs(block_outcomes(d, q, p), gamma, v)
    wrong = _outcome_probs(block_outcomes(d, q, p, largest=False), gamma, v)
    assert 0.5 * np.abs(right - wrong).sum() > 0.05
    counts = _outcome_counts(lambda g: verify_block(d, q, p, g), 12_000, gamma, v, 3)
    assert chisquare_pvalue(counts.ravel(), wrong.ravel()) < FAIL_LEVEL


# ------------------------------------------------------------- 3'. first token end to end


def _wrong_verify_tokens(
    draft: Sequence[int], q: np.ndarray | None, p: np.ndarray, rng: np.random.Generator
) -> Verdict:
    """Token verification that resamples from p_i instead of the residual on rejection."""
    a = token_acceptance_probabilities(draft, q, p)
    u = rng.random(len(draft))
    for i, (ui, ai) in enumerate(zip(u, a, strict=True)):
        if ui >= ai:
            return Verdict(i, int(rng.choice(p.shape[1], p=p[i])))
    return Verdict(len(draft), int(rng.choice(p.shape[1], p=p[-1])))


def _first_token_case(
    v: int, gamma: int, kind: str, seed: int
) -> tuple[np.ndarray | None, np.ndarray, tuple[int, ...] | None]:
    rng = np.random.default_rng(seed)
    p = np.stack([random_dist(rng, v, 0.25) for _ in range(gamma + 1)])
    if kind == "none":
        return None, p, tuple(int(t) for t in rng.integers(v, size=gamma))
    q = np.stack([random_dist(rng, v, 0.25) for _ in range(gamma)])
    if kind == "disjoint":
        # The drafter's first row puts all its mass where the target's has none.
        support = p[0] > 0
        q0 = np.where(support, 0.0, rng.random(v) + 0.1)
        if q0.sum() == 0:  # target covers everything: shrink it instead
            p[0, : v // 2] = 0.0
            p[0] /= p[0].sum()
            q0 = np.where(p[0] > 0, 0.0, 1.0)
        q[0] = q0 / q0.sum()
    return q, p, None


def _first_token_counts(
    verify: Callable[..., Verdict],
    q: np.ndarray | None,
    p: np.ndarray,
    fixed_draft: tuple[int, ...] | None,
    n: int,
    seed: int,
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    gamma, v = p.shape[0] - 1, p.shape[1]
    if fixed_draft is not None:
        drafts = np.tile(np.asarray(fixed_draft, dtype=np.int64), (n, 1))
    else:
        assert q is not None
        # d_i ~ q_i for every trial (inverse CDF, never an impossible token).
        cdf = np.cumsum(q, axis=1)
        drafts = np.stack(
            [
                np.minimum(np.searchsorted(cdf[i], rng.random(n) * cdf[i, -1], side="right"), v - 1)
                for i in range(gamma)
            ],
            axis=1,
        )
    counts = np.zeros(v)
    for d in drafts:
        verdict = verify(d, q, p, rng)
        counts[d[0] if verdict.accepted >= 1 else verdict.next_token] += 1
    return counts


FIRST_TOKEN_CASES = [
    (6, 1, "random", 1),
    (8, 2, "random", 2),
    (10, 3, "random", 3),
    (7, 2, "disjoint", 4),
    (6, 3, "none", 5),
    (9, 1, "none", 6),
]


@pytest.mark.parametrize(("v", "gamma", "kind", "seed"), FIRST_TOKEN_CASES)
@pytest.mark.parametrize("verify", [verify_tokens, verify_block], ids=["token", "block"])
def test_first_emitted_token_is_distributed_as_target(
    verify: Callable[..., Verdict], v: int, gamma: int, kind: str, seed: int
) -> None:
    q, p, fixed = _first_token_case(v, gamma, kind, seed)
    counts = _first_token_counts(verify, q, p, fixed, 15_000, seed)
    assert chisquare_pvalue(counts, p[0]) > PASS_LEVEL


def test_first_token_test_rejects_wrong_verifier() -> None:
    q, p, fixed = _first_token_case(8, 2, "random", 2)
    counts = _first_token_counts(_wrong_verify_tokens, q, p, fixed, 15_000, 2)
    assert chisquare_pvalue(counts, p[0]) < FAIL_LEVEL

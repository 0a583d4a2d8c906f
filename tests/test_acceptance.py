"""Exactness tests for edgespec.acceptance.

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
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from scipy.stats import chisquare

from edgespec.decoding.acceptance import (
    Verdict,
    block_stop_probabilities,
    block_weights,
    residual,
    token_acceptance_probabilities,
    verify_block,
    verify_greedy,
    verify_tokens,
)
from edgespec.decoding.sampling import SamplingParams, probabilities
from edgespec.errors import EdgespecError

# An outcome list: (τ, P(τ | draft), distribution of the next token given τ).
Outcomes = list[tuple[int, float, np.ndarray]]
OutcomeFn = Callable[[tuple[int, ...], np.ndarray | None, np.ndarray], Outcomes]
Table = dict[tuple[int, ...], np.ndarray]

PASS_LEVEL = 1e-4  # a correct sampler must give a chi-square p-value above this
FAIL_LEVEL = 1e-8  # a wrong sampler must give a p-value below this


# --------------------------------------------------------------------------- helpers


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


def _fixed_case(det: bool) -> tuple[tuple[int, ...], np.ndarray | None, np.ndarray]:
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


@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("kind", ["token", "token-lenient", "block"])
def test_verifier_samples_the_enumerated_outcomes(kind: str, det: bool) -> None:
    d, q, p = _fixed_case(det)
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
    d, q, p = _fixed_case(False)
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


# ------------------------------------------------------------- 4. greedy and lenience


def test_verify_greedy_all_accepted_takes_bonus() -> None:
    assert verify_greedy([4, 5, 6], np.array([4, 5, 6, 9])) == Verdict(3, 9)


def test_verify_greedy_stops_at_first_mismatch() -> None:
    assert verify_greedy([4, 7, 6], np.array([4, 5, 6, 9])) == Verdict(1, 5)
    assert verify_greedy(np.array([1, 5]), np.array([4, 5, 6])) == Verdict(0, 4)


def test_verify_greedy_without_drafts() -> None:
    assert verify_greedy([], np.array([3])) == Verdict(0, 3)


def test_verify_greedy_rejects_wrong_length() -> None:
    with pytest.raises(ValueError):
        verify_greedy([1, 2], np.array([1, 2]))


def test_verdict_fields_are_python_ints() -> None:
    rng = np.random.default_rng(0)
    p = np.full((3, 4), 0.25)
    for verdict in (
        verify_greedy(np.array([1, 2]), np.array([1, 2, 3])),
        verify_tokens([1, 2], p[:2], p, rng),
        verify_block([1, 2], None, p, rng),
    ):
        assert type(verdict.accepted) is int
        assert type(verdict.next_token) is int


@pytest.mark.parametrize("verify", [verify_tokens, verify_block], ids=["token", "block"])
def test_no_drafts_samples_the_target(verify: Callable[..., Verdict]) -> None:
    p = np.array([[0.1, 0.0, 0.6, 0.3]])
    rng = np.random.default_rng(8)
    counts = np.zeros(4)
    for _ in range(5000):
        verdict = verify([], None, p, rng)
        assert verdict.accepted == 0
        counts[verdict.next_token] += 1
    assert chisquare_pvalue(counts, p[0]) > PASS_LEVEL


def test_lenience_one_matches_default() -> None:
    d, q, p = _fixed_case(False)
    for seed in range(300):
        default = verify_tokens(d, q, p, np.random.default_rng(seed))
        explicit = verify_tokens(d, q, p, np.random.default_rng(seed), lenience=1.0)
        assert default == explicit


@pytest.mark.parametrize("det", [False, True])
def test_smaller_lenience_never_accepts_fewer(det: bool) -> None:
    # Per trial: the same seed gives the same acceptance uniforms, and every
    # acceptance probability can only grow as λ shrinks.
    d, q, p = _fixed_case(det)
    more = 0
    for seed in range(400):
        strict = verify_tokens(d, q, p, np.random.default_rng(seed))
        lenient = verify_tokens(d, q, p, np.random.default_rng(seed), lenience=0.5)
        assert lenient.accepted >= strict.accepted
        more += lenient.accepted > strict.accepted
    assert more > 0


def test_lenience_trades_exactness_for_acceptance() -> None:
    v, gamma = 4, 2
    target, draft, _ = make_instance(31, v, gamma, 0.0, False)
    want = target_joint(target, v, gamma + 1)
    previous = -1.0
    for lam in (1.0, 0.8, 0.5, 0.2):

        def fn(d: tuple[int, ...], q: np.ndarray | None, p: np.ndarray, lam: float = lam) -> Outcomes:
            return token_outcomes(d, q, p, lenience=lam)

        accepted = expected_accepted(target, draft, None, v, gamma, fn)
        assert accepted >= previous - 1e-12
        previous = accepted
        deviation = max_deviation(emission_distribution(target, draft, None, v, gamma, fn), want)
        assert (deviation < 1e-9) if lam == 1.0 else (deviation > 1e-3)


@pytest.mark.parametrize("lam", [0.0, -0.5, 1.5, float("nan")])
def test_invalid_lenience_is_reported(lam: float) -> None:
    p = np.full((2, 3), 1 / 3)
    with pytest.raises(EdgespecError, match=r"^lenience must be in \(0, 1\]"):
        verify_tokens([0], p[:1], p, np.random.default_rng(0), lenience=lam)


# ------------------------------------------------------------- helpers in closed form


def test_deterministic_drafter_closed_forms() -> None:
    # q=None must behave exactly like explicit one-hot rows.
    rng = np.random.default_rng(4)
    v, gamma = 7, 3
    p = np.stack([random_dist(rng, v, 0.2) for _ in range(gamma + 1)])
    d = (int(np.argmax(p[0])), 2, int(np.argmax(p[2])))
    onehot = np.zeros((gamma, v))
    onehot[np.arange(gamma), d] = 1.0
    np.testing.assert_allclose(
        token_acceptance_probabilities(d, None, p), token_acceptance_probabilities(d, onehot, p)
    )
    np.testing.assert_allclose(block_weights(d, None, p), block_weights(d, onehot, p))
    np.testing.assert_allclose(
        block_stop_probabilities(d, None, p), block_stop_probabilities(d, onehot, p), atol=1e-15
    )
    for i in range(gamma):
        for scale in (1.0, 0.3, 1 / 0.7):
            np.testing.assert_allclose(
                residual(p[i], None, scale, draft_token=d[i]), residual(p[i], onehot[i], scale)
            )
    # λ = 1: the residual is p with the draft token removed.
    want = p[0].copy()
    want[d[0]] = 0.0
    np.testing.assert_allclose(residual(p[0], None, draft_token=d[0]), want / want.sum())


def test_residual_falls_back_to_target_when_empty() -> None:
    p = np.array([0.2, 0.3, 0.5])
    np.testing.assert_allclose(residual(p, p.copy()), p)


def test_zero_probability_draft_is_never_kept() -> None:
    p = np.array([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
    q = np.array([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]])
    rng = np.random.default_rng(0)
    for verify in (verify_tokens, verify_block):
        for _ in range(200):
            assert verify([0, 2], q, p, rng).accepted == 0


# ------------------------------------------------------------- real vocabulary size


def test_real_vocabulary_smoke() -> None:
    v, gamma = 151_936, 4
    rng = np.random.default_rng(9)
    logits = (rng.standard_normal((gamma + 1, v)) * 4).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    p = probabilities(logits, params)
    draft_tokens = [int(t) for t in np.argmax(logits[:gamma], axis=1)]
    # Draft distribution identical to the target: everything is accepted.
    for verify in (verify_tokens, verify_block):
        verdict = verify(draft_tokens, p[:gamma].copy(), p, rng)
        assert verdict.accepted == gamma
        assert p[gamma, verdict.next_token] > 0
    # A different drafter and a deterministic one: valid verdicts, correction tokens possible.
    q = probabilities((logits[:gamma] + rng.standard_normal((gamma, v)).astype(np.float32)), params)
    for verify in (verify_tokens, verify_block):
        for qq in (q, None):
            verdict = verify(draft_tokens, qq, p, rng)
            assert 0 <= verdict.accepted <= gamma
            assert p[verdict.accepted, verdict.next_token] > 0
            if qq is None and verdict.accepted < gamma:
                # One-hot q: the residual excludes the rejected draft token.
                assert verdict.next_token != draft_tokens[verdict.accepted]


def test_outcome_counter_sanity() -> None:
    # The chi-square helper pools sparse bins and refuses impossible observations.
    assert chisquare_pvalue(np.array([50, 50, 0]), np.array([0.5, 0.5, 0.0])) > 0.5
    with pytest.raises(AssertionError):
        chisquare_pvalue(np.array([50, 49, 1]), np.array([0.5, 0.5, 0.0]))

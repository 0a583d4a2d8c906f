"""The verifiers of ``edgespec.decoding.acceptance`` beyond exactness: greedy verification,
lenience (the acceptance it buys, the exactness it costs), the helpers in closed form, a
real-sized vocabulary, and the chi-square helper itself."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

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
from tests.acceptance_cases import (
    PASS_LEVEL,
    Outcomes,
    chisquare_pvalue,
    emission_distribution,
    expected_accepted,
    fixed_case,
    make_instance,
    max_deviation,
    random_dist,
    target_joint,
    token_outcomes,
)

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
    d, q, p = fixed_case(False)
    for seed in range(300):
        default = verify_tokens(d, q, p, np.random.default_rng(seed))
        explicit = verify_tokens(d, q, p, np.random.default_rng(seed), lenience=1.0)
        assert default == explicit


@pytest.mark.parametrize("det", [False, True])
def test_smaller_lenience_never_accepts_fewer(det: bool) -> None:
    # Per trial: the same seed gives the same acceptance uniforms, and every
    # acceptance probability can only grow as λ shrinks.
    d, q, p = fixed_case(det)
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

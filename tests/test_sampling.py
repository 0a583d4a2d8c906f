"""Tests for edgespec.sampling.

probabilities() is checked two ways: against a naive reference that fully
sorts every row using the same elementary float32 operations (so the kept
sets must be identical, not merely close), and against the mathematical
definitions of each filter evaluated independently in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import softmax
from scipy.stats import chisquare

from edgespec.decoding import sampling
from edgespec.decoding.sampling import (
    SamplingParams,
    argmax_rows,
    max_probability,
    probabilities,
    sample,
)
from edgespec.errors import EdgespecError

V_REAL = 151_936


# --------------------------------------------------------------------------- reference


def reference_row(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Naive probabilities(): full sorts, same float32 arithmetic, float64 result."""
    x = row / params.temperature  # float32, as in the implementation
    alive = np.ones(x.shape, dtype=bool)
    if 0 < params.top_k < x.size:
        kth = np.sort(x)[::-1][params.top_k - 1]
        alive &= x >= kth  # ties with the k-th are kept
    e = np.exp(x - x.max())
    e[~alive] = 0.0
    if params.top_p < 1.0:
        desc = np.sort(e)[::-1]
        cum = np.cumsum(desc, dtype=np.float64)
        reach = np.flatnonzero(cum >= params.top_p * np.sum(e, dtype=np.float64))
        if reach.size:
            alive &= e >= desc[reach[0]]  # ties with the cutoff are kept
    if params.min_p > 0.0:
        alive &= e >= params.min_p  # e is relative to the top token, whose e is 1
    kept = np.where(alive, e, 0.0).astype(np.float64)
    return kept / kept.sum()


def reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    return np.stack([reference_row(r, params) for r in np.atleast_2d(logits)]).reshape(logits.shape)


def assert_matches_reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    got = probabilities(logits, params)
    want = reference(logits, params)
    assert got.dtype == np.float32
    assert got.shape == logits.shape
    np.testing.assert_array_equal(got > 0, want > 0, err_msg=f"kept sets differ for {params}")
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)
    np.testing.assert_allclose(got.sum(axis=-1, dtype=np.float64), 1.0, atol=1e-5)
    return got


def small_logit_rows(rng: np.random.Generator, v: int) -> np.ndarray:
    """Rows of varied character, including exact ties and -inf entries."""
    rows = [
        rng.standard_normal(v) * 3,
        rng.standard_normal(v) * 0.2,  # nearly flat
        rng.integers(-3, 3, size=v).astype(float),  # many exact ties
        np.zeros(v),  # all tied
        np.where(rng.random(v) < 0.3, -np.inf, rng.standard_normal(v)),
    ]
    out = np.stack(rows).astype(np.float32)
    out[4, 0] = 1.0  # keep at least one finite logit
    return out


PARAM_GRID = [
    SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
    for t in (0.5, 1.0, 1.7)
    for k in (0, 1, 3, 7)
    for p in (1.0, 0.95, 0.6, 0.1)
    for m in (0.0, 0.05, 0.3)
]


# ------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("v", [1, 2, 10, 50])
def test_small_vocabulary_matches_reference(v: int) -> None:
    logits = small_logit_rows(np.random.default_rng(v), v)
    for params in PARAM_GRID:
        assert_matches_reference(logits, params)


def real_rows(rng: np.random.Generator) -> np.ndarray:
    """Real-vocabulary rows that exercise every branch of the fast paths."""
    v = V_REAL
    peaked = rng.standard_normal(v) * 4  # nucleus found by the first probes
    flat = rng.standard_normal(v) * 0.05  # nucleus is most of the row: full sort
    # ~3000 plausible tokens spread over 12 nats, the rest far below: deeper probes.
    spread = np.full(v, -40.0)
    spread[rng.choice(v, 3000, replace=False)] = rng.uniform(-12, 0, 3000)
    ties = rng.integers(-8, 0, size=v).astype(float)  # huge tie groups at every cutoff
    logits = np.stack([peaked, flat, spread, ties]).astype(np.float32)
    logits[:, 12345] += 3.0  # a clear favourite
    return logits


REAL_PARAMS = [
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=0.7, top_p=0.95),
    SamplingParams(temperature=1.3, top_p=0.5),
    SamplingParams(temperature=1.0, top_p=0.999),
    SamplingParams(temperature=1.0, top_k=40),
    SamplingParams(temperature=0.8, top_k=1),
    SamplingParams(temperature=1.0, top_k=5000, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=100_000, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=1.0, min_p=0.001),
    SamplingParams(temperature=0.9, top_k=50, top_p=0.9, min_p=0.02),
    SamplingParams(temperature=1.2, top_p=0.7, min_p=0.1),
    SamplingParams(temperature=1.0),
]


@pytest.mark.parametrize("params", REAL_PARAMS, ids=str)
def test_real_vocabulary_matches_reference(params: SamplingParams) -> None:
    assert_matches_reference(real_rows(np.random.default_rng(0)), params)


def test_fast_paths_agree_with_full_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    # Disabling every probe forces full sorts; the answers must not change.
    logits = real_rows(np.random.default_rng(1))
    params_list = [
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=300, top_p=0.95),
    ]
    fast = [probabilities(logits, p) for p in params_list]
    monkeypatch.setattr(sampling, "_RELATIVE_PROBES", ())
    monkeypatch.setattr(sampling, "_LOGIT_PROBES", ())
    for params, expected in zip(params_list, fast, strict=True):
        np.testing.assert_array_equal(probabilities(logits, params), expected)


# --------------------------------------------------------- against the definitions (float64)


def softmax64(x: np.ndarray) -> np.ndarray:
    return softmax(x.astype(np.float64))


@pytest.mark.parametrize("v", [20, V_REAL])
@pytest.mark.parametrize("top_p", [0.3, 0.8, 0.95])
def test_top_p_keeps_the_smallest_sufficient_set(v: int, top_p: float) -> None:
    rng = np.random.default_rng(int(top_p * 100) + v)
    for scale in (0.5, 3.0):
        row = (rng.standard_normal(v) * scale).astype(np.float32)
        kept = probabilities(row, SamplingParams(temperature=1.0, top_p=top_p)) > 0
        probs = softmax64(row)
        assert row[~kept].max(initial=-np.inf) <= row[kept].min()  # most likely first
        assert probs[kept].sum() >= top_p - 1e-6  # reaches top_p ...
        # ... and no smaller prefix does. The cutoff's tie group is taken with a
        # 1e-6 relative tolerance: in a flat row of 151,936 float32 logits several
        # distinct logits can share one float32 probability weight.
        without_last = kept & (probs > probs[kept].min() * (1 + 1e-6))
        assert probs[without_last].sum() < top_p + 1e-6


def test_top_k_keeps_k_distinct_logits() -> None:
    rng = np.random.default_rng(2)
    row = rng.permutation(np.arange(100, dtype=np.float32)) * np.float32(0.1)
    for k in (1, 2, 10, 99, 100, 150):
        kept = probabilities(row, SamplingParams(temperature=1.0, top_k=k)) > 0
        assert kept.sum() == min(k, 100)
        assert set(np.flatnonzero(kept)) == set(np.argsort(row)[::-1][:k])


def test_min_p_threshold_relative_to_max() -> None:
    rng = np.random.default_rng(3)
    for v in (30, V_REAL):
        row = (rng.standard_normal(v) * 2).astype(np.float32)
        for min_p in (0.01, 0.1, 0.5):
            got = probabilities(row, SamplingParams(temperature=1.0, min_p=min_p))
            probs = softmax64(row)
            bar = min_p * probs.max()
            kept = got > 0
            assert (probs[kept] >= bar * (1 - 1e-6)).all()
            assert (probs[~kept] < bar * (1 + 1e-6)).all()


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_only_is_softmax(temperature: float) -> None:
    rng = np.random.default_rng(4)
    for v in (7, V_REAL):
        logits = (rng.standard_normal((2, v)) * 3).astype(np.float32)
        got = probabilities(logits, SamplingParams(temperature=temperature))
        want = softmax(logits.astype(np.float64) / temperature, axis=-1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)


def test_filters_compose_in_order() -> None:
    # Probabilities ∝ (4, 3, 2, 1). top-p sees the top-k survivors renormalised:
    # with top_k=2 they are (4/7, 3/7) and 4/7 alone reaches 0.5; without top-k
    # they are (0.4, 0.3, 0.2, 0.1) and two tokens are needed.
    row = np.log(np.array([4.0, 3.0, 2.0, 1.0], dtype=np.float32))
    kept = probabilities(row, SamplingParams(temperature=1.0, top_k=2, top_p=0.5)) > 0
    assert kept.tolist() == [True, False, False, False]
    kept = probabilities(row, SamplingParams(temperature=1.0, top_p=0.5)) > 0
    assert kept.tolist() == [True, True, False, False]
    # min-p after top-k/top-p: relative to the max, so unchanged by renormalisation.
    kept = probabilities(row, SamplingParams(temperature=1.0, top_k=3, min_p=0.6)) > 0
    assert kept.tolist() == [True, True, False, False]


# ----------------------------------------------------------------------------- ties


def test_top_k_keeps_everything_tied_with_the_kth() -> None:
    row = np.array([2, 1, 2, 0, 2, 1], dtype=np.float32)
    got = probabilities(row, SamplingParams(temperature=1.0, top_k=2))
    assert (got > 0).tolist() == [True, False, True, False, True, False]
    np.testing.assert_allclose(got[got > 0], 1 / 3, rtol=1e-6)


def test_top_p_keeps_everything_tied_with_the_cutoff() -> None:
    # Probabilities ∝ (e^1, 1, 1, 1, e^-5): reaching 0.6 needs one of the three tied
    # tokens, so all three are kept.
    row = np.array([1, 0, 0, 0, -5], dtype=np.float32)
    got = probabilities(row, SamplingParams(temperature=1.0, top_p=0.6))
    assert (got > 0).tolist() == [True, True, True, True, False]
    flat = np.zeros(8, dtype=np.float32)
    got = probabilities(flat, SamplingParams(temperature=1.0, top_p=0.1))
    np.testing.assert_allclose(got, 1 / 8, rtol=1e-6)


def test_top_p_always_keeps_at_least_one_token() -> None:
    row = np.array([10, 0, 0], dtype=np.float32)
    got = probabilities(row, SamplingParams(temperature=1.0, top_p=1e-9))
    assert got.tolist() == [1.0, 0.0, 0.0]


# ------------------------------------------------------------------ buffers and modes


def test_input_is_never_written_and_out_is_used() -> None:
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((3, 1000)) * 2).astype(np.float32)
    original = logits.copy()
    logits.flags.writeable = False
    out = np.full(logits.shape, np.nan, dtype=np.float32)
    for params in (
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=1.0),
        SamplingParams(),
    ):
        result = probabilities(logits, params, out=out)
        assert result is out
        assert np.isfinite(out).all()
        np.testing.assert_array_equal(logits, original)


def test_out_must_fit_and_not_alias_the_input() -> None:
    logits = np.zeros((2, 5), dtype=np.float32)
    params = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError):
        probabilities(logits, params, out=np.empty((2, 5), dtype=np.float64))
    with pytest.raises(ValueError):
        probabilities(logits, params, out=np.empty((5,), dtype=np.float32))
    with pytest.raises(ValueError):
        probabilities(logits, params, out=logits)


def test_one_dimensional_input() -> None:
    row = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    got = probabilities(row, SamplingParams(temperature=1.0))
    assert got.shape == (3,)
    np.testing.assert_allclose(got, softmax(row.astype(np.float64)), rtol=1e-6)


def test_greedy_params_give_one_hot_rows() -> None:
    logits = np.array([[0.0, 3.0, 3.0], [5.0, 1.0, 2.0]], dtype=np.float32)
    got = probabilities(logits, SamplingParams())
    assert got.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_invalid_params_are_refused_as_settings_are_made_and_asserted_after() -> None:
    """One check, where the answer's settings are made; each step only asserts."""
    from edgespec.decoding.request import GenerationSettings

    bad = SamplingParams(temperature=1.0, top_p=0.0)
    with pytest.raises(EdgespecError, match="top_p"):
        GenerationSettings(sampling=bad)
    with pytest.raises(AssertionError):
        probabilities(np.zeros(3, dtype=np.float32), bad)


# ------------------------------------------------------------------------- validate()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (SamplingParams(temperature=-1), "temperature must be >= 0 (got -1)"),
        (SamplingParams(temperature=-0.5), "temperature must be >= 0 (got -0.5)"),
        (SamplingParams(temperature=math.nan), "temperature must be a finite number (got nan)"),
        (SamplingParams(temperature=math.inf), "temperature must be a finite number (got inf)"),
        (SamplingParams(top_k=-3), "top_k must be >= 0 (got -3)"),
        (SamplingParams(top_k=2.5), "top_k must be an integer >= 0 (got 2.5)"),  # type: ignore[arg-type]
        (SamplingParams(top_p=0.0), "top_p must be in (0, 1] (got 0)"),
        (SamplingParams(top_p=1.5), "top_p must be in (0, 1] (got 1.5)"),
        (SamplingParams(top_p=math.nan), "top_p must be in (0, 1] (got nan)"),
        (SamplingParams(min_p=1.0), "min_p must be in [0, 1) (got 1)"),
        (SamplingParams(min_p=-0.1), "min_p must be in [0, 1) (got -0.1)"),
    ],
)
def test_validate_messages(params: SamplingParams, message: str) -> None:
    with pytest.raises(EdgespecError) as info:
        params.validate()
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_valid_params_and_greedy_flag() -> None:
    for params in (
        SamplingParams(),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=2, top_k=0, top_p=1, min_p=0),
    ):
        params.validate()
    assert SamplingParams().greedy
    assert not SamplingParams(temperature=0.1).greedy


# ---------------------------------------------------------------------------- sample()


def test_sample_goodness_of_fit() -> None:
    probs = np.array([0.1, 0.0, 0.25, 0.4, 0.05, 0.2], dtype=np.float32)
    rng = np.random.default_rng(6)
    draws = np.array([sample(probs, rng) for _ in range(40_000)])
    counts = np.bincount(draws, minlength=probs.size)
    assert counts[1] == 0
    support = probs > 0
    expected = probs[support] / probs.sum() * draws.size
    assert chisquare(counts[support], expected).pvalue > 1e-4


@pytest.mark.parametrize("total", [1 - 1e-5, 1 + 1e-5])
def test_sample_tolerates_rows_that_do_not_sum_to_one(total: float) -> None:
    probs = np.array([0.5, 0.3, 0.2]) * total
    rng = np.random.default_rng(7)
    counts = np.bincount([sample(probs, rng) for _ in range(20_000)], minlength=3)
    assert chisquare(counts, np.array([0.5, 0.3, 0.2]) * 20_000).pvalue > 1e-4


def test_sample_real_vocabulary_across_chunk_boundaries() -> None:
    # Mass on tokens on both sides of chunk boundaries plus a thin uniform floor.
    probs = np.full(V_REAL, 0.2 / V_REAL, dtype=np.float32)
    heavy = [0, 1023, 1024, 70_000, V_REAL - 1]
    probs[heavy] += 0.16
    rng = np.random.default_rng(8)
    draws = np.array([sample(probs, rng) for _ in range(20_000)])
    counts = [int((draws == t).sum()) for t in heavy]
    counts.append(draws.size - sum(counts))
    p = probs.astype(np.float64) / probs.sum(dtype=np.float64)
    expected = [p[t] for t in heavy]
    expected.append(1 - sum(expected))
    assert chisquare(counts, np.array(expected) * draws.size).pvalue > 1e-4


class _FixedRng:
    """Stand-in generator whose random() returns a chosen value."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize("v", [6, V_REAL])
def test_sample_extreme_uniforms_never_pick_zero_probability(v: int) -> None:
    probs = np.zeros(v, dtype=np.float32)
    probs[2] = 0.5
    probs[v - 3] = 0.5
    lowest = sample(probs, _FixedRng(0.0))  # type: ignore[arg-type]
    highest = sample(probs, _FixedRng(math.nextafter(1.0, 0.0)))  # type: ignore[arg-type]
    assert (lowest, highest) == (2, v - 3)
    # u * total rounding up to total must still land on a token with weight.
    assert sample(probs * 3, _FixedRng(1.0)) == v - 3  # type: ignore[arg-type]


def test_sample_rejects_empty_rows() -> None:
    with pytest.raises(ValueError):
        sample(np.zeros(4), np.random.default_rng(0))


# ------------------------------------------------------------- argmax / max_probability


def test_argmax_rows() -> None:
    logits = np.array([[0.0, 2.0, 2.0], [3.0, -1.0, 0.0]], dtype=np.float32)
    got = argmax_rows(logits)
    assert got.dtype == np.int64
    assert got.tolist() == [1, 0]  # first index among ties
    assert argmax_rows(logits[1]).tolist() == [0]
    rng = np.random.default_rng(9)
    big = rng.standard_normal((3, V_REAL)).astype(np.float32)
    np.testing.assert_array_equal(argmax_rows(big), big.argmax(axis=1))


@pytest.mark.parametrize("v", [1, 5, V_REAL])
def test_max_probability_matches_softmax(v: int) -> None:
    rng = np.random.default_rng(v)
    for scale in (0.1, 2.0, 20.0):
        row = (rng.standard_normal(v) * scale).astype(np.float32)
        assert max_probability(row) == pytest.approx(softmax64(row).max(), rel=1e-5)
    row = np.array([0.0, -np.inf, np.log(3.0)] * max(1, v // 3), dtype=np.float32)
    assert max_probability(row) == pytest.approx(softmax64(row).max(), rel=1e-5)


def test_top_p_cutoff_is_where_the_mass_first_reaches_top_p() -> None:
    # Exactly representable weights: the running sum hits the target exactly at
    # the second token, which must be the cutoff ("reaches" means >=).
    desc = np.array([1.0, 0.5, 0.25, 0.25], dtype=np.float32)
    assert sampling._cutoff_in_sorted(desc, 1.5) == 0.5
    assert sampling._cutoff_in_sorted(desc, 1.5000001) == 0.25
    assert sampling._cutoff_in_sorted(desc, 2.5) is None


def test_vanishing_temperature_is_the_greedy_limit() -> None:
    row = np.array([1.0, 3.0, 2.0], dtype=np.float32)
    got = probabilities(row, SamplingParams(temperature=1e-40, top_p=0.9))
    assert got.tolist() == [0.0, 1.0, 0.0]
    row = np.array([0.0, -1.0, -2.0], dtype=np.float32)  # 0 / (T rounded to 0) is NaN
    got = probabilities(row, SamplingParams(temperature=1e-50))
    assert got.tolist() == [1.0, 0.0, 0.0]

"""Turning logits into the probability rows that speculative decoding compares.

The same transform (temperature, top-k, top-p, min-p) is applied to the target
and to the draft: speculative sampling is only exact with respect to the
distribution both sides agree on, so any mismatch here would silently change
the output distribution.

Output rows are float32 (half the memory traffic of float64 for V = 151,936
and the dtype llama.cpp hands us); every reduction that decides *which* tokens
survive or *which* token is drawn is accumulated in float64, so rounding in the
rows themselves (about 1e-7 relative) never biases sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgespec.errors import RequestError

__all__ = [
    "SamplingParams",
    "argmax_rows",
    "max_probability",
    "probabilities",
    "sample",
]

# Probing thresholds, relative to the most likely token, used to find a small
# candidate set that provably contains the top-p nucleus (see _top_p_cutoff).
# A vectorised comparison costs ~30 us on 151,936 entries whereas argpartition
# costs ~1 ms and a full sort ~4 ms, so a few probes are much cheaper.
_RELATIVE_PROBES = (2.0**-4, 2.0**-8, 2.0**-12, 2.0**-16, 2.0**-20, 2.0**-24)
# Logit gaps (after temperature) probed when looking for the k-th largest logit.
_LOGIT_PROBES = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)
# Once a candidate set holds more than 1/_MAX_CANDIDATE_FRACTION of the row,
# sorting or partitioning the whole row is about as cheap and much simpler.
_MAX_CANDIDATE_FRACTION = 8
# Rows at most this long are simply sorted: probing would not pay off.
_SMALL_ROW = 4096
# Chunk length for two-level inverse-CDF sampling (see sample()).
_SAMPLE_CHUNK = 1024


@dataclass(frozen=True)
class SamplingParams:
    """How a probability row is derived from logits.

    The filters are applied in this order: temperature, top-k, top-p, min-p.
    """

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off

    def validate(self) -> None:
        """Raise RequestError (one line, naming the field) if any field is out of range:
        the one check, made as an answer's settings are (``GenerationSettings``)."""
        t = self.temperature
        if not _is_real(t) or not (isinstance(t, int | np.integer) or math.isfinite(t)):
            raise RequestError(f"temperature must be a finite number (got {_fmt(t)})", "temperature")
        if t < 0:
            raise RequestError(f"temperature must be >= 0 (got {_fmt(t)})", "temperature")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, int | np.integer):
            raise RequestError(f"top_k must be an integer >= 0 (got {k!r})", "top_k")
        if k < 0:
            raise RequestError(f"top_k must be >= 0 (got {_fmt(k)})", "top_k")
        p = self.top_p
        if not _is_real(p) or not 0.0 < p <= 1.0:  # also rejects NaN
            raise RequestError(f"top_p must be in (0, 1] (got {_fmt(p)})", "top_p")
        m = self.min_p
        if not _is_real(m) or not 0.0 <= m < 1.0:
            raise RequestError(f"min_p must be in [0, 1) (got {_fmt(m)})", "min_p")

    @property
    def greedy(self) -> bool:
        """True when decoding is argmax rather than sampling."""
        return self.temperature == 0


def _is_real(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _fmt(value: object) -> str:
    # ":g" prints -1.0 as "-1" and 1e-9 compactly, keeping messages short.
    if isinstance(value, float | np.floating):
        return f"{float(value):g}"
    return repr(value) if isinstance(value, str) else str(value)


def probabilities(logits: np.ndarray, params: SamplingParams, out: np.ndarray | None = None) -> np.ndarray:
    """Probability rows (float32) for logits of shape (V,) or (k, V).

    Steps, per row:

    1. divide by the temperature;
    2. top-k: keep tokens whose logit is >= the k-th largest logit (tokens tied
       with the k-th are all kept, so more than k may survive);
    3. top-p: on the distribution renormalised over the survivors, keep the
       most likely tokens until their mass reaches ``top_p``; the cutoff is the
       probability of the token that makes the mass reach ``top_p`` and every
       token with at least that probability is kept (ties kept, so the set is a
       function of the values alone, never of index order);
    4. min-p: drop tokens whose probability is < ``min_p`` times the largest;
    5. renormalise (float64 sum) and store as float32.

    ``logits`` is never written (it may be a read-only view of C memory).
    ``out``, when given, must be a float32 array of the same shape that does
    not overlap ``logits``; it is filled and returned.

    Greedy params (temperature 0) give a one-hot row at the argmax (first index
    among ties); the engine normally uses argmax_rows instead.

    ``params`` were validated once, as the answer's settings were made (this runs every
    step, so it only asserts).
    """
    assert params.temperature >= 0 and params.top_k >= 0, params
    assert 0.0 < params.top_p <= 1.0 and 0.0 <= params.min_p < 1.0, params
    logits = np.asarray(logits)
    if logits.ndim not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape (V,) or (k, V), got {logits.shape}")
    if out is None:
        out = np.empty(logits.shape, dtype=np.float32)
    else:
        if out.shape != logits.shape or out.dtype != np.float32:
            raise ValueError(f"out must be float32 with shape {logits.shape}")
        if np.shares_memory(out, logits):
            raise ValueError("out must not overlap logits (logits are never written)")
    rows_in = logits.reshape(-1, logits.shape[-1])
    rows_out = out.reshape(-1, logits.shape[-1])
    if params.greedy:
        rows_out.fill(0.0)
        rows_out[np.arange(rows_in.shape[0]), np.argmax(rows_in, axis=-1)] = 1.0
        return out
    for src, dst in zip(rows_in, rows_out, strict=True):
        _row_probabilities(src, params, dst)
    return out


def _row_probabilities(src: np.ndarray, params: SamplingParams, dst: np.ndarray) -> None:
    n = src.shape[0]
    # Temperature scaling goes straight into dst so no extra V-sized buffer is needed.
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        np.divide(src, params.temperature, out=dst)
    top = float(dst.max())
    if not math.isfinite(top):
        # A temperature so small that logits overflow float32 is the greedy limit.
        winner = int(np.argmax(src))
        dst.fill(0.0)
        dst[winner] = 1.0
        return
    k = params.top_k
    if 0 < k < n:
        # Top-k: work on the (small) candidate set only; the rest of the row is zero.
        cand = _top_k_candidates(dst, k, top)
        e = dst[cand]
        np.subtract(e, top, out=e)
        np.exp(e, out=e)
    else:
        cand = None
        e = dst
        np.subtract(e, top, out=e)
        np.exp(e, out=e)  # e.max() == exp(0) == 1 exactly
    total = float(np.sum(e, dtype=np.float64))

    cutoff = 0.0
    if params.top_p < 1.0:
        cutoff = _top_p_cutoff(e, params.top_p * total)
    if params.min_p > 0.0:
        # prob < min_p * max_prob  <=>  e < min_p, because e is relative to the
        # most likely token (whose e is exactly 1) and renormalising after
        # top-k/top-p does not change ratios.
        cutoff = max(cutoff, params.min_p)

    if cand is None and cutoff == 0.0:
        np.multiply(dst, 1.0 / total, out=dst)
        return
    keep = np.flatnonzero(e >= cutoff)
    vals = e[keep]
    kept_total = float(np.sum(vals, dtype=np.float64))
    np.multiply(vals, 1.0 / kept_total, out=vals)
    if cand is not None:
        keep = cand[keep]
    dst.fill(0.0)
    dst[keep] = vals


def _top_k_candidates(x: np.ndarray, k: int, top: float) -> np.ndarray:
    """Indices of every entry >= the k-th largest value of x (ties included)."""
    n = x.shape[0]
    if n > _SMALL_ROW:
        # Find a cheap superset {x >= top - gap} holding at least k entries, then
        # select within it; any superset of size >= k contains the true top k.
        for gap in _LOGIT_PROBES:
            idx = np.flatnonzero(x >= top - gap)
            if idx.size > n // _MAX_CANDIDATE_FRACTION:
                break
            if idx.size >= k:
                vals = x[idx]
                kth = np.partition(vals, vals.size - k)[vals.size - k]
                return idx[vals >= kth]
    kth = np.partition(x, n - k)[n - k]
    return np.flatnonzero(x >= kth)


def _top_p_cutoff(e: np.ndarray, target: float) -> float:
    """Largest weight c such that the weights >= c together reach target (ties at c included).

    ``e`` holds non-negative weights whose maximum is 1 (relative to the most
    likely token); ``target`` is top_p times their float64 sum. The result is
    identical to sorting the whole row: the candidate set {e >= g} of a probe g
    is exactly a prefix of the descending order (plus all ties at its end), so
    its running sums are the first running sums of the full sort, and if its
    mass already reaches the target the cutoff lies inside it.
    """
    n = e.shape[0]
    if n > _SMALL_ROW:
        for g in _RELATIVE_PROBES:
            idx = np.flatnonzero(e >= g)
            if idx.size > n // _MAX_CANDIDATE_FRACTION:
                break
            cutoff = _cutoff_in_sorted(np.sort(e[idx])[::-1], target)
            if cutoff is not None:
                return cutoff
    # Flat distributions: the nucleus is a large part of the vocabulary.
    cutoff = _cutoff_in_sorted(np.sort(e)[::-1], target)
    # Running sums can fall a rounding error short of top_p * sum when top_p is
    # within ~1e-16 of 1; keeping everything is then the right answer.
    return float(cutoff) if cutoff is not None else 0.0


def _cutoff_in_sorted(desc: np.ndarray, target: float) -> float | None:
    """Value at which the descending running sum first reaches target, if it does."""
    cum = np.cumsum(desc, dtype=np.float64)
    if desc.size == 0 or cum[-1] < target:
        return None
    return float(desc[int(np.searchsorted(cum, target, side="left"))])


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a (V,) row of non-negative weights (any positive total).

    Inverse CDF with float64 accumulation, scaled by the row's own total so
    rows that sum to 1 +- 1e-5 (float32 rounding) are sampled without bias.
    Tokens with zero weight are never returned. Uses exactly one rng.random().

    Two levels (chunk sums, then a running sum inside one chunk) because a
    float64 cumulative sum over 151,936 float32 entries costs ~0.5-1.8 ms,
    about ten times the chunked version.
    """
    probs = np.asarray(probs)
    if probs.ndim != 1 or probs.shape[0] == 0:
        raise ValueError(f"sample expects a non-empty (V,) row, got shape {probs.shape}")
    u = rng.random()
    n = probs.shape[0]
    if n <= _SAMPLE_CHUNK:
        return _inverse_cdf(np.cumsum(probs, dtype=np.float64), u)
    starts = np.arange(0, n, _SAMPLE_CHUNK)
    chunk_cdf = np.cumsum(np.add.reduceat(probs, starts, dtype=np.float64))
    c = _inverse_cdf(chunk_cdf, u)
    below = float(chunk_cdf[c - 1]) if c > 0 else 0.0
    chunk_mass = float(chunk_cdf[c]) - below
    # Rescale u into the chosen chunk so the inner search cannot fall off its end
    # because the chunk's running sum rounds differently from its reduceat sum.
    local_u = min(max((u * float(chunk_cdf[-1]) - below) / chunk_mass, 0.0), 1.0)
    start = int(starts[c])
    inner = np.cumsum(probs[start : start + _SAMPLE_CHUNK], dtype=np.float64)
    return start + _inverse_cdf(inner, local_u)


def _inverse_cdf(cdf: np.ndarray, u: float) -> int:
    """Index i with cdf[i-1] <= u * cdf[-1] < cdf[i]; never a zero-weight entry."""
    total = float(cdf[-1])
    if not total > 0.0 or not math.isfinite(total):
        raise ValueError("cannot sample from a row without positive, finite mass")
    i = int(np.searchsorted(cdf, u * total, side="right"))
    if i >= cdf.shape[0]:
        # u * total rounded up to total: take the last entry with positive weight,
        # i.e. the first index at which the running sum reaches its final value.
        i = int(np.searchsorted(cdf, total, side="left"))
    return i


def argmax_rows(logits: np.ndarray) -> np.ndarray:
    """Greedy token per row: shape (k,) int64 for (k, V) or (V,) logits (first index on ties)."""
    logits = np.asarray(logits)
    return np.atleast_1d(np.argmax(logits, axis=-1)).astype(np.int64, copy=False)


def max_probability(logits_row: np.ndarray) -> float:
    """Largest softmax probability (temperature 1) of a (V,) logits row.

    max softmax = exp(0) / sum(exp(l - lmax)) = 1 / sum(exp(l - lmax)); only
    one float32 temporary, summed in float64.
    """
    row = np.asarray(logits_row)
    shifted = np.subtract(row, row.max(), dtype=np.float32)
    np.exp(shifted, out=shifted)
    return 1.0 / float(np.sum(shifted, dtype=np.float64))

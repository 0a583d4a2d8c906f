"""Penalties and biases (edgespec.decoding.penalties): the transform against a plain
reference, the sliding window against a recount, and exactness by enumeration: one
speculative round whose rows are penalized with each position's own history (drafts
included) emits exactly what target-only decoding under the same penalties would."""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from edgespec.decoding.acceptance import residual, token_acceptance_probabilities
from edgespec.decoding.penalties import Penalties, Window, transform_row, transform_rows
from edgespec.errors import EdgespecError, RequestError

V = 4
CONTEXT = [2, 2, 0]  # the prompt: token 2 seen twice, token 0 once


def reference_row(logits: np.ndarray, p: Penalties, history: list[int]) -> np.ndarray:
    """The formula written out token by token, recounting the window from scratch."""
    window = history if p.last_n < 0 else history[-p.last_n :] if p.last_n else []
    counts = Counter(window)
    out = [float(x) for x in logits]
    for token, bias in p.logit_bias:
        out[token] += bias
    for token, c in counts.items():
        if p.repeat != 1.0:
            out[token] = out[token] * p.repeat if out[token] <= 0 else out[token] / p.repeat
        out[token] -= c * p.frequency + p.presence
    return np.array(out)


PENALTIES = [
    Penalties(presence=0.7, frequency=0.4, repeat=1.3, last_n=4),
    Penalties(presence=-0.5, frequency=1.2, repeat=1.0, last_n=-1),
    Penalties(repeat=1.6, last_n=2, logit_bias=((1, -3.0), (3, 2.5))),
]


@pytest.mark.parametrize("p", PENALTIES)
def test_transform_matches_the_formula(p: Penalties) -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        history = rng.integers(0, V, size=rng.integers(0, 9)).tolist()
        logits = rng.normal(0, 2, V).astype(np.float32)
        got = transform_row(logits, p, Window(history, p.last_n).counts)
        assert np.allclose(got, reference_row(logits, p, history), atol=1e-5)


@pytest.mark.parametrize("last_n", [-1, 0, 1, 3, 8])
def test_window_moves_like_a_recount(last_n: int) -> None:
    rng = np.random.default_rng(last_n + 10)
    history = rng.integers(0, 6, size=5).tolist()
    window = Window(history, last_n)
    for token in rng.integers(0, 6, size=30).tolist():
        window.push(token)
        history.append(token)
        tail = history if last_n < 0 else history[-last_n:] if last_n else []
        assert window.counts == Counter(tail)


def test_bad_values_name_the_field() -> None:
    with pytest.raises(EdgespecError, match="presence_penalty"):
        Penalties(presence=3.0).validate()
    with pytest.raises(EdgespecError, match="frequency_penalty"):
        Penalties(frequency=float("nan")).validate()
    with pytest.raises(EdgespecError, match="repeat_penalty"):
        Penalties(repeat=0.0).validate()
    with pytest.raises(EdgespecError, match="repeat_last_n"):
        Penalties(last_n=-2).validate()
    with pytest.raises(EdgespecError, match="logit_bias"):
        Penalties(logit_bias=((1, 101.0),)).validate()
    # An id's range needs the vocabulary: the request builder checks it against the target's.
    Penalties(logit_bias=((V, 1.0),)).validate()
    Penalties(logit_bias=((V - 1, 1.0),)).check_tokens(V)
    with pytest.raises(RequestError, match=f"token {V}, outside the vocabulary of {V} tokens") as info:
        Penalties(logit_bias=((V, 1.0),)).check_tokens(V)
    assert info.value.param == "logit_bias"
    for token in (-1, True, "2"):
        with pytest.raises(RequestError, match="logit_bias keys must be token ids"):
            Penalties(logit_bias=((token, 1.0),)).check_tokens(V)  # type: ignore[arg-type]
    # A number too large for a float is a refusal, not an overflow.
    with pytest.raises(RequestError, match="presence_penalty"):
        Penalties(presence=10**400).validate()
    assert not Penalties().active and Penalties(logit_bias=((1, 1.0),)).active


# -- exactness by enumeration ---------------------------------------------------------


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


def raw_tables(seed: int, gamma: int) -> tuple[dict, dict]:
    """Raw logits of a target and a draft for every prefix of the answer."""
    rng = np.random.default_rng(seed)
    prefixes = [s for n in range(gamma + 2) for s in itertools.product(range(V), repeat=n)]
    target = {s: rng.normal(0, 1.5, V).astype(np.float32) for s in prefixes}
    draft = {s: rng.normal(0, 1.5, V).astype(np.float32) for s in prefixes}
    return target, draft


def penalized(table: dict, p: Penalties) -> dict:
    """What target-only decoding samples from at each prefix: its row penalized with the
    whole history before it (the prompt and the answer so far)."""
    return {s: softmax(reference_row(row, p, CONTEXT + list(s))) for s, row in table.items()}


def speculative_emission(target: dict, draft: dict, p: Penalties, gamma: int, own_history: bool) -> dict:
    """The exact distribution of γ+1 tokens after one speculative round (token
    verification, the draft model sampling from its penalized rows), continued by the
    penalized target. ``own_history=False`` is the mistake of penalizing every verified
    row with the committed history alone (a negative control)."""
    want = penalized(target, p)
    q_table = penalized(draft, p)
    result: dict[tuple[int, ...], float] = defaultdict(float)

    def extend(prefix: tuple[int, ...], mass: float) -> None:
        if len(prefix) == gamma + 1:
            result[prefix] += mass
            return
        for y in range(V):
            extend((*prefix, y), mass * want[prefix][y])

    for d in itertools.product(range(V), repeat=gamma):
        weight = math.prod(q_table[d[:i]][d[i]] for i in range(gamma))
        raw = np.stack([target[d[:i]] for i in range(gamma + 1)])
        if own_history:
            rows = transform_rows(raw, p, CONTEXT, list(d))
        else:
            rows = np.stack([transform_row(r, p, Counter(CONTEXT[-p.last_n :])) for r in raw])
        prob = np.stack([softmax(r) for r in rows])
        q = np.stack([q_table[d[:i]] for i in range(gamma)])
        accept = token_acceptance_probabilities(d, q, prob, 1.0)
        alive = 1.0
        for i in range(gamma):
            r = residual(prob[i], q[i], 1.0, draft_token=d[i])
            for y in range(V):
                extend((*d[:i], y), weight * alive * (1 - accept[i]) * r[y])
            alive *= accept[i]
        for y in range(V):
            extend((*d, y), weight * alive * prob[gamma][y])
    return result


def target_joint(p: Penalties, target: dict, length: int) -> dict:
    want = penalized(target, p)
    return {
        s: math.prod(want[s[:i]][s[i]] for i in range(length))
        for s in itertools.product(range(V), repeat=length)
    }


def deviation(got: dict, want: dict) -> float:
    return max(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in set(got) | set(want))


@pytest.mark.parametrize("p", PENALTIES[:2])
@pytest.mark.parametrize("gamma", [1, 2])
def test_speculative_sampling_under_penalties_is_exact(p: Penalties, gamma: int) -> None:
    target, draft = raw_tables(7 + gamma, gamma)
    got = speculative_emission(target, draft, p, gamma, own_history=True)
    assert math.isclose(sum(got.values()), 1.0, abs_tol=1e-9)
    assert deviation(got, target_joint(p, target, gamma + 1)) < 1e-6


def test_enumeration_sees_rows_penalized_without_the_drafts() -> None:
    """Negative control: the enumeration has the power to see the mistake the per-position
    history prevents."""
    p = PENALTIES[0]
    target, draft = raw_tables(9, 2)
    got = speculative_emission(target, draft, p, 2, own_history=False)
    assert deviation(got, target_joint(p, target, 3)) > 1e-3

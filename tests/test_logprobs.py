"""Log-probabilities and penalties through the real engine on the real pair: whatever
drafts, the tokens are target-only's under the same settings, and each token's
log-probability is the target's own at its position. llama.cpp's CPU kernels round a
batch of tokens differently from a single one (a prefill's last row, a verification's
rows), so the same position's log-probability differs by a few hundredths between a run
that computed it in a batch and one that did not; it is equal up to that rounding."""

from __future__ import annotations

import math

import pytest
from states import start_from_prefill

from edgespec.decoding.events import Done, Token

PROMPT = "Repeat this list exactly, twice: apple, banana, cherry, plum, apple, banana, cherry, plum."
ROUNDING = 0.1  # in a log-probability: llama.cpp's batch-size-dependent rounding (seen: 0.03)
PENALIZED = {"presence_penalty": 0.4, "frequency_penalty": 0.3, "repeat_penalty": 1.15, "repeat_last_n": 32}


def run(pair, drafter: str, gamma, **settings) -> tuple[list[Token], Done]:
    tokens = pair.prompt_tokens(PROMPT, chat=True)
    start_from_prefill(pair, tokens)  # every run starts from the prompt's one saved state
    events = list(pair.stream(tokens, drafter=drafter, gamma=gamma, max_tokens=28, **settings))
    return [e for e in events if isinstance(e, Token)], events[-1]


_target_only: dict[str, tuple[list[Token], Done]] = {}


def target_only(pair, **settings) -> tuple[list[Token], Done]:
    """``run`` with drafter ``none``, once per settings: greedy from a whole prefill of the
    same prompt, it is the same every time, and each drafter's test compares with it."""
    key = repr(sorted(settings.items()))
    if key not in _target_only:
        _target_only[key] = run(pair, "none", 0, **settings)
    return _target_only[key]


@pytest.mark.parametrize(("drafter", "gamma"), [("ngram", 4), ("copy", 8), ("model", 3), ("auto", "auto")])
def test_logprobs_equal_target_only(pair, drafter, gamma):
    want_tokens, want = target_only(pair, logprobs=3)
    got_tokens, got = run(pair, drafter, gamma, logprobs=3)
    assert got.token_ids == want.token_ids
    for a, b in zip(got_tokens, want_tokens, strict=True):
        assert a.logprob is not None and a.logprob <= 0.0
        assert math.isclose(a.logprob, b.logprob, abs_tol=ROUNDING)
        assert len(a.top_logprobs) == 3
        assert a.top_logprobs[0][0] == b.top_logprobs[0][0]
        assert [x for _, x in a.top_logprobs] == sorted((x for _, x in a.top_logprobs), reverse=True)
        # the chosen token under greedy decoding is the most likely one
        assert math.isclose(a.logprob, a.top_logprobs[0][1], abs_tol=1e-6)


@pytest.mark.parametrize(("drafter", "gamma"), [("ngram", 6), ("copy", 8), ("model", 3), ("auto", "auto")])
def test_penalties_keep_greedy_identity(pair, drafter, gamma):
    _, plain = target_only(pair)
    _, want = target_only(pair, **PENALIZED)
    _, got = run(pair, drafter, gamma, **PENALIZED)
    assert got.token_ids == want.token_ids
    assert want.token_ids != plain.token_ids, (
        "the penalties must change this answer for the test to mean anything"
    )


def test_logit_bias_bans_a_token(pair):
    _, plain = target_only(pair)
    banned = plain.token_ids[0]
    _, got = run(pair, "auto", "auto", logit_bias={banned: -100.0})
    assert banned not in got.token_ids
    _, want = target_only(pair, logit_bias={banned: -100.0})
    assert got.token_ids == want.token_ids


def test_no_logprobs_unless_asked(pair):
    tokens, _ = run(pair, "ngram", 4)
    assert all(t.logprob is None and t.top_logprobs == () for t in tokens)

"""llama.cpp's ngram-simple loop replayed: its proposal rule and its step accounting, on
constructed token sequences (pure arithmetic, no model)."""

from __future__ import annotations

import pytest

from edgespec.bench.llamacpp_replay import (
    SIZE_M,
    SIZE_N,
    ngram_simple_draft,
    replay_ngram_simple,
    speedup,
)

FILLER = list(range(1000, 1100))  # tokens that never repeat


def linear(k: int) -> float:
    """A pass over k tokens: 1 s plus 0.25 s per token beyond the first."""
    return 1.0 + 0.25 * (k - 1)


def test_the_most_recent_occurrence_of_the_last_twelve_tokens_proposes_what_followed_it() -> None:
    pattern = list(range(12))
    older = [*pattern, *range(200, 260)]
    newer = [*pattern, *range(300, 360)]
    context = [*FILLER[:10], *older, *FILLER[10:20], *newer, *FILLER[20:30], *pattern]
    assert ngram_simple_draft(context) == list(range(300, 300 + SIZE_M))


def test_the_most_recent_match_ends_the_search_even_with_too_little_after_it() -> None:
    # A sequence of period 12: the latest earlier occurrence of its last twelve tokens is
    # followed by only eleven before the context ends, and llama.cpp looks no further back.
    assert ngram_simple_draft([*FILLER[:70], *list(range(12)) * 5]) == []
    # Of period 13, twelve follow it: the next period's first twelve are proposed.
    assert ngram_simple_draft([*FILLER[:70], *list(range(13)) * 5]) == list(range(12))


def test_a_short_context_or_a_match_at_its_very_start_proposes_nothing() -> None:
    pattern, lead = list(range(12)), [FILLER[0]]
    between = list(range(500, 538))
    # One token fewer than size_n + size_m + 2 before the sampled one: nothing.
    assert ngram_simple_draft([*lead, *pattern, *between[:-1], *pattern]) == []
    assert ngram_simple_draft([*lead, *pattern, *between, *pattern]) == [*between, *pattern[:10]]
    # llama.cpp's position 0 stands for "no match": a match there is never found.
    assert ngram_simple_draft([*pattern, *range(500, 560), *pattern]) == []


def test_a_copy_of_the_prompt_is_drafted_forty_eight_tokens_at_a_time_and_priced_per_pass() -> None:
    source = list(range(100))
    prompt = [*FILLER[:20], *source, *FILLER[20:30]]
    answer = [*source[:80], 5000, 5001]  # copies 80 tokens of the prompt, then its own
    run = replay_ngram_simple(prompt, answer, linear)
    # Tokens 1-11 decode plainly (no twelve-token match yet); at 12 the prompt's copy
    # proposes 48, all kept (+1); at 61 another 48, of which the answer keeps 19 (+ its
    # own 5000); the last token decodes plainly.
    assert (run.steps, run.drafted, run.accepted) == (11 + 1 + 1 + 1, 2 * SIZE_M, SIZE_M + 19)
    assert run.seconds == pytest.approx(11 * linear(1) + 2 * linear(1 + SIZE_M) + linear(1))
    assert speedup(prompt, answer, linear) == pytest.approx(81 * linear(1) / run.seconds)
    assert SIZE_N == 12


def test_an_answer_that_repeats_nothing_decodes_plainly() -> None:
    prompt = FILLER[:80]
    answer = list(range(2000, 2050))
    run = replay_ngram_simple(prompt, answer, linear)
    assert (run.steps, run.drafted, run.accepted) == (49, 0, 0)
    assert speedup(prompt, answer, linear) == pytest.approx(1.0)
    assert speedup(prompt, answer[:1], linear) == 1.0


def test_a_curve_with_history_charges_the_return_to_single_tokens_after_a_draft() -> None:
    """A GPU charges a single-token pass more right after a pass of another size: the loop
    pays it after each of its drafts, plain decoding only after the prompt's pass."""
    source = list(range(100))
    prompt = [*FILLER[:20], *source, *FILLER[20:30]]
    answer = [*source[:80], 5000, 5001]

    def back_to_one(k: int, last: int, before_last: int) -> float:
        return 0.5 if k == 1 and last > 1 else 0.0

    plain_run = replay_ngram_simple(prompt, answer, linear)
    run = replay_ngram_simple(prompt, answer, linear, back_to_one)
    # The first plain step follows the prompt's pass; the last follows a 49-token draft.
    assert run.seconds == pytest.approx(plain_run.seconds + 2 * 0.5)
    plain = 81 * linear(1) + 0.5
    assert speedup(prompt, answer, linear, back_to_one) == pytest.approx(plain / run.seconds)

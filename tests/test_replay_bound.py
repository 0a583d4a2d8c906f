"""The bound on what ``auto`` may lose against plain decoding, on every cost curve.

``tests/fixtures/replay-corpus.json.gz`` holds every prompt of both halves of the corpus,
answered greedily by the shipped target and guessed at by the draft
(``tools/record_replay_set.py`` made it): replaying it decodes nothing, so every recorded
answer is replayed on every curve, as a session per half, in a minute. The bound is what
``docs/controller.md`` says it is: no step may risk more than the answer's surplus over
plain decoding plus 3 % of its plain time (counted over at least 16 tokens), so no answer
of 16 tokens or more ends below 0.97 of plain decoding, and without the bound some do."""

from __future__ import annotations

import dataclasses

import pytest
from replay_set import recorded_halves

from edgespec.bench.recording import Recording
from edgespec.bench.replay import CURVES, replay
from edgespec.decoding.auto import DEFAULT

BOUND = 0.97
PLAYED = ("target only", "auto")

pytestmark = pytest.mark.needs_models  # the replayed models ask the real one for its vocabulary


@pytest.fixture(scope="module")
def corpus(pair) -> dict[str, list[Recording]]:
    return recorded_halves(pair)


def ratios(pair, recordings: list[Recording], curve: str, tuning=DEFAULT) -> dict[str, float]:
    results = replay(recordings, pair.target, pair.draft, CURVES[curve], PLAYED, tuning)
    out = {}
    for rec in recordings:
        runs = results[rec.id]
        assert runs["auto"].exact, (curve, rec.id)
        out[rec.id] = runs["auto"].decode_tps / runs["target only"].decode_tps
    return out


def bound(rec: Recording) -> float:
    """The least share of plain decoding's speed the answer may end at: 0.97 from 16
    tokens on; a shorter one may lose 3 % of 16 tokens' plain time (its decode phase
    starts after its first token)."""
    tokens = len(rec.answer) - 1
    return min(BOUND, tokens / (tokens + DEFAULT.risk_share * DEFAULT.risk_tokens) - 0.002)


@pytest.mark.parametrize("curve", list(CURVES))
def test_no_recorded_answer_ends_below_the_bound_on_any_curve(pair, corpus, curve):
    for split, recordings in corpus.items():
        got = ratios(pair, recordings, curve)
        below = {rec.id: round(got[rec.id], 3) for rec in recordings if got[rec.id] < bound(rec)}
        assert not below, (curve, split, below)


def test_without_the_bound_some_answer_ends_below_it(pair, corpus):
    """The test above can fail: a controller that may risk whatever its estimates make
    worth it loses more than 3 % on some answer of the steepest curves."""
    unbounded = dataclasses.replace(DEFAULT, risk_share=1e6)
    worst = min(
        min(ratios(pair, recordings, curve, unbounded).values())
        for curve in ("epyc-f26", "cpu-avx2")
        for recordings in corpus.values()
    )
    assert worst < BOUND


def constructed(pair, old: str = "summarize_block", new: str = "fold_window") -> Recording:
    """An edit whose first line renames what the prompt's code defines (``old`` to
    ``new``), and copies the rest of it (two hundred tokens and more) untouched."""
    body = "".join(
        f"    total_{i} = sum(values[{i}:{i + 8}]) * weight_{i % 5}\n"
        f"    if total_{i} > limit:\n        return total_{i} - offset\n"
        for i in range(14)
    )
    code = f"def summarize_block(values, limit, offset):\n{body}    return 0\n"
    prompt = (
        "<|im_start|>user\nRename summarize_block to fold_window:\n```python\n"
        f"{code}```<|im_end|>\n<|im_start|>assistant\n"
    )
    preamble = (
        "The function is renamed below; nothing else changes. Callers that import it under "
        "its old name must be updated as well, and the tests that refer to it by name too, "
        "so that the whole module keeps passing after the change is made. Nothing in its body "
        "changes: the same sums, the same limits and the same offsets stay where they were.\n\n"
    )
    answer = preamble + "```python\n" + code.replace("summarize_block", new) + "```\n"
    tokens = pair.target.tokenize(prompt, add_special=False)
    answer_tokens = pair.target.tokenize(answer, add_special=False)
    # the draft guesses every token but the renamed ones: it cannot pay on this curve anyway
    return Recording(
        "constructed-rename",
        "code-editing",
        tokens,
        answer_tokens,
        False,
        list(answer_tokens),
        [0.9] * len(answer_tokens),
    )


def test_a_copy_that_misses_at_its_start_is_taken_up_again_and_ends_ahead(pair):
    """On the steepest curve (two tokens verified cost two, sixteen cost 6.7): a session
    whose first answer copied the code as it was, and whose second says the same words,
    then renames what the code defines. Where the copy starts, the lookup over the earlier
    answer proposes the old name and misses; the copy of the prompt still holds after the
    name, is drafted again, soon 16 tokens and more a step, and the answer ends ahead."""
    clean = dataclasses.replace(constructed(pair, new="summarize_block"), id="as-it-was")
    rec = constructed(pair)
    assert len(rec.answer) > 250
    results = replay([clean, rec], pair.target, pair.draft, CURVES["epyc-f26"], PLAYED)
    auto = results[rec.id]["auto"]
    assert auto.exact
    pairs = enumerate(zip(clean.answer, rec.answer, strict=False))
    renamed = next(i for i, (was, now) in pairs if was != now)
    position, missed, after = 1, None, []
    for _, gamma, accepted, _ in auto.trace:
        if missed is not None:
            after.append(accepted)
        elif gamma and position <= renamed < position + gamma:
            missed = position + accepted  # the draft over the old name: where it broke
        position += accepted + 1
    assert missed == renamed, (missed, renamed)  # it broke at the old name
    assert max(after) >= 15, after  # the copy, drafted long again
    assert auto.decode_tps > 1.1 * results[rec.id]["target only"].decode_tps

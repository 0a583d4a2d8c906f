"""The reflow drafter (prompt lookup on text, blind to line wrapping) on constructed text,
tokenized by the real target model's tokenizer."""

from __future__ import annotations

import pytest

from edgespec.decoding.drafters import NgramDrafter, ReflowDrafter
from edgespec.runtime.chat_template import chat_tokens
from edgespec.runtime.model import Model


@pytest.fixture(scope="module")
def model(pair) -> Model:
    return pair.target


def tokens(model: Model, text: str) -> list[int]:
    return model.tokenize(text, add_special=False)


def proposal_text(model: Model, context: str, max_tokens: int = 8) -> str:
    found, _ = ReflowDrafter(model).lookup(tokens(model, context), max_tokens)
    return model.detokenize(found)


def test_a_reflowed_copy_continues_across_line_breaks(model):
    context = (
        "Notes:\nThe sync engine now detects renamed\nfiles instead of deleting them.\n"
        "Summary: The sync engine now detects renamed"
    )
    found, n = ReflowDrafter(model).lookup(tokens(model, context), 6)
    # The answer writes a space where the source broke the line: so does the proposal, in
    # the tokens the model itself would use for that text.
    assert found == tokens(model, " files instead of deleting them.")[:6]
    assert n >= 2
    # The token n-gram drafter proposes the source's newline instead.
    ngram, _ = NgramDrafter().lookup(tokens(model, context), 6)
    assert model.detokenize(ngram).startswith("\n")


def test_longest_match_wins(model):
    context = "X: red green blue cat. Y: green blue dog. Z: red green blue"
    assert proposal_text(model, context, 2) == " cat."


def test_most_recent_match_among_equals(model):
    context = "A: green blue cat. B: green blue dog. C: green blue"
    assert proposal_text(model, context, 2) == " dog."


def test_short_repeats_are_not_proposed(model):
    drafter = ReflowDrafter(model, min_chars=8)
    assert drafter.lookup(tokens(model, "one two three. one two"), 4) == ([], 0)  # "one two" is 7 chars


def test_control_tokens_are_never_copied_or_crossed(model):
    messages = [{"role": "user", "content": "Repeat after me: the quick brown fox jumps"}]
    context = chat_tokens(model, messages) + tokens(model, "the quick brown")
    found, _ = ReflowDrafter(model).lookup(context, 10)
    assert model.detokenize(found) == " fox jumps"  # stops where the message ended


def test_multibyte_text_is_copied_whole(model):
    found = proposal_text(model, "说明：今年的春天来得很早，花开了。🌸\n回答：今年的春天来得很早，", 8)
    assert found.startswith("花开了。🌸 ") and "\ufffd" not in found


def test_follows_a_growing_context_and_a_new_one(model):
    drafter = ReflowDrafter(model)
    first = tokens(model, "Source: the cat sat on the mat today. Copy: the cat sat")
    assert model.detokenize(drafter.lookup(first, 4)[0]) == " on the mat today"
    grown = first + tokens(model, " on the mat")
    assert model.detokenize(drafter.lookup(grown, 1)[0]) == " today"
    other = tokens(model, "Source: a dog ran in the park at noon. Copy: a dog ran")
    assert drafter.lookup(other, 4) == ReflowDrafter(model).lookup(other, 4)  # rebuilt, not stale


def test_a_holding_copy_reuses_its_tokenization_and_proposes_the_same(model):
    """While the answer copies, each step's match ends at a token boundary of the last
    proposal: its remaining tokens are reused (until fewer are left than asked for), and
    they are what tokenizing afresh gives."""
    source = (
        "Release notes:\nThe sync engine now detects renamed files instead of deleting\n"
        "and re-uploading them, which saves bandwidth on large folders. Conflicts are\n"
        "shown side by side, and the activity log keeps ninety days of history.\n"
    )
    context = tokens(model, source + "Summary: The sync engine now detects renamed")
    answer = tokens(model, " files instead of deleting and re-uploading them, which saves bandwidth")
    reused, fresh = ReflowDrafter(model), ReflowDrafter(model)
    calls, tokenizing_steps = 0, []
    tokenize = model.tokenize

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return tokenize(*args, **kwargs)

    model.tokenize = counting  # type: ignore[method-assign]
    try:
        for k in range(len(answer) + 1):
            before = calls
            got = reused.lookup(context + answer[:k], 8)
            if calls > before:
                tokenizing_steps.append(k)
            fresh._run = None  # the other drafter always tokenizes anew
            assert got == fresh.lookup(context + answer[:k], 8)
    finally:
        del model.tokenize
    # ~80 characters tokenized for 8 tokens asked: a few steps each, not every step.
    assert tokenizing_steps[0] == 0 and len(tokenizing_steps) <= len(answer) // 4, tokenizing_steps
    assert model.detokenize(got[0]).startswith(" on large folders")

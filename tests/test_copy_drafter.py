"""The edit-aware copy drafter on constructed edits: token ids stand for words, the
"prompt" holds the source and the "answer" rewrites it with one change. After the change
the drafter must resume the copy within one token, and carry a substitution forward."""

from __future__ import annotations

import pytest

from edgespec.decoding.drafters import AnswerSetup, CopyDrafter, NgramDrafter

# A source with a repeated name (7 = "total") and distinct tokens elsewhere.
HEADER = [900, 901, 902]  # what precedes the source in the prompt (instructions)
SOURCE = [10, 11, 7, 12, 13, 14, 15, 16, 17, 7, 18, 19, 20, 21, 22, 23, 7, 24, 25, 26, 27, 28]
PROMPT = [*HEADER, *SOURCE, 950, 951]  # 950, 951: the chat template's turn markers


def follow(drafter, answer: list[int], budget: int = 6) -> list[int]:
    """Feed the answer token by token (as the engine commits them) and return the proposal
    the drafter makes after the last one."""
    drafter.begin(AnswerSetup(PROMPT, []))
    proposal: list[int] = []
    for i in range(1, len(answer) + 1):
        proposal, _ = drafter.lookup(PROMPT + answer[:i], budget)
    return proposal


def test_a_plain_copy_is_followed():
    assert follow(CopyDrafter(), SOURCE[:5]) == SOURCE[5:11]


@pytest.mark.parametrize(
    ("edit", "answer", "rest"),
    [
        # 13 replaced by 99: one token after the change (14) the copy goes on.
        ("replaced word", [*SOURCE[:4], 99, 14], SOURCE[6:12]),
        # 99, 98 inserted before 13: the next source token (13) resumes it.
        ("insertion", [*SOURCE[:4], 99, 98, 13], SOURCE[5:11]),
        # 13 and 14 deleted: 15 resumes it.
        ("deletion", [*SOURCE[:4], 15], SOURCE[7:13]),
    ],
)
def test_the_copy_resumes_one_token_after_an_edit(edit, answer, rest):
    assert follow(CopyDrafter(), answer) == rest, edit


def test_after_an_edit_a_common_token_resumes_at_the_right_place():
    """30 stands for a common token (a comma, an indent). After the replaced word only the
    alignment knows which 30 the answer is at; prompt lookup takes the most recent one,
    which here is in the answer itself, and proposes the wrong continuation."""
    source = [10, 30, 11, 30, 12, 13, 30, 14, 15, 16, 30, 17, 18]
    prompt = [*HEADER, *source, 950, 951]
    answer = [10, 30, 11, 30, 12, 99, 30]
    for drafter, right in ((CopyDrafter(), True), (NgramDrafter(), False)):
        drafter.begin(AnswerSetup(prompt, []))
        for i in range(1, len(answer) + 1):
            proposal, _ = drafter.lookup(prompt + answer[:i], 3)
        assert (proposal == [14, 15, 16]) == right, drafter.name


def test_a_rename_seen_once_is_proposed_at_the_next_occurrence():
    # The answer renames 7 ("total") to 70 at its first occurrence and copies on.
    answer = [10, 11, 70, 12, 13, 14]
    proposal = follow(CopyDrafter(), answer, budget=8)
    assert proposal == [15, 16, 17, 70, 18, 19, 20, 21], "the rename must be applied ahead"


def test_a_new_name_quoted_in_the_request_still_becomes_a_rule():
    """ "Rename total to grand_total": the request spells the new name (70, 71), so after
    the answer writes it the drafter anchors in the request and proposes what followed it
    there. When that fails, the copy of the source resumes after the old name, and the
    rename is proposed at its next occurrence."""
    header = [900, 7, 901, 70, 71, 902]  # "... total to grand _total ..."
    prompt = [*header, *SOURCE, 950, 951]
    drafter = CopyDrafter()
    drafter.begin(AnswerSetup(prompt, []))
    answer = [10, 11, 70, 71, 12, 13, 14]
    for i in range(1, len(answer) + 1):
        proposal, _ = drafter.lookup(prompt + answer[:i], 8)
    assert proposal == [15, 16, 17, 70, 71, 18, 19, 20]


def test_a_rename_into_two_tokens_is_carried_forward():
    # 7 becomes 7, 71 (e.g. " total" + "_units"): an insertion after 7.
    answer = [10, 11, 7, 71, 12, 13, 14]
    proposal = follow(CopyDrafter(), answer, budget=6)
    assert proposal == [15, 16, 17, 7, 71, 18]


def test_a_substitution_the_target_refuses_is_forgotten():
    drafter = CopyDrafter()
    answer = [10, 11, 70, 12, 13, 14, 15, 16, 17]
    assert follow(drafter, answer, budget=2) == [70, 18]
    # At the next occurrence the answer keeps the old name after all.
    context = [*PROMPT, *answer, 7, 18, 19, 20, 21, 22, 23]
    proposal, _ = drafter.lookup(context, 3)
    assert proposal == [7, 24, 25], "a rule proven wrong must not be proposed again"


def test_the_prediction_is_preferred():
    drafter = CopyDrafter()
    predicted = [10, 11, 70, 12, 13, 14, 15, 16]
    drafter.begin(AnswerSetup(PROMPT, predicted))
    proposal, n = drafter.lookup([*PROMPT, 10, 11], 4)
    assert proposal == [70, 12, 13, 14] and n >= 2


def test_a_new_conversation_starts_over():
    drafter = CopyDrafter()
    assert follow(drafter, SOURCE[:5]) == SOURCE[5:11]
    assert drafter.lookup([500, 501, 502, 503], 4) == ([], 0)

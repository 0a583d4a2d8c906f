"""The n-gram drafter on constructed token sequences."""

from __future__ import annotations

from edgespec.decoding.drafters import AnswerSetup, NgramDrafter


def test_longest_match_wins():
    d = NgramDrafter(min_n=1, max_n=4)
    # suffix [7, 8, 9]: "9" alone last occurred before 50, "8 9" before 60, "7 8 9" before 70
    context = [7, 8, 9, 70, 71, 1, 8, 9, 60, 61, 2, 9, 50, 51, 3, 7, 8, 9]
    tokens, n = d.lookup(context, 3)
    assert (tokens, n) == ([70, 71, 1], 3)


def test_most_recent_match_among_equals():
    d = NgramDrafter(min_n=1, max_n=4)
    context = [5, 6, 10, 11, 1, 5, 6, 20, 21, 2, 5, 6]
    assert d.lookup(context, 2) == ([20, 21], 2)


def test_no_match_and_budget():
    d = NgramDrafter(min_n=2, max_n=4)
    assert d.lookup([1, 2, 3, 4, 5], 4) == ([], 0)  # only single tokens would repeat
    assert d.lookup([1, 2, 3, 1, 2], 10) == ([3, 1, 2], 2)  # continuation may run into the suffix


def test_index_follows_a_growing_context_and_a_new_one():
    d = NgramDrafter(min_n=1, max_n=3)
    context = [1, 2, 3, 4]
    assert d.lookup(context, 2) == ([], 0)
    context += [1, 2]
    assert d.lookup(context, 2) == ([3, 4], 2)
    context += [3, 9, 1, 2]
    assert d.lookup(context, 2) == ([3, 9], 2)  # the most recent continuation now
    assert d.lookup([4, 4, 4], 1) == ([4], 2)  # a different context: the index is rebuilt


def test_the_match_length_is_how_far_the_copy_reaches_back():
    """The index is keyed on at most max_n tokens, but a copy in progress matches its
    source much further back: that length is what the controller prices."""
    source = list(range(100, 140))
    d = NgramDrafter(min_n=1, max_n=4)
    assert d.lookup([*source, 1, 2, *source[:3]], 2) == ([103, 104], 3)
    assert d.lookup([*source, 1, 2, *source[:30]], 2) == ([130, 131], 30)
    # a match that starts mid-way: only the tokens that agree count
    tokens, n = d.lookup([*source, 1, 2, 7, *source[20:32]], 2)
    assert (tokens, n) == ([132, 133], 12)


def test_a_proposal_from_the_prediction_says_so():
    d = NgramDrafter(min_n=1, max_n=3)
    d.begin(AnswerSetup([1, 2], [50, 51, 52, 53]))
    assert d.lookup([1, 2, 9, 50, 51], 2) == ([52, 53], 2) and d.from_prediction
    assert d.lookup([1, 2, 9, 50, 51, 9, 1], 1) == ([2], 1) and not d.from_prediction

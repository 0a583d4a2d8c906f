"""The n-gram drafter on constructed token sequences."""

from __future__ import annotations

from edgespec.decoding.drafters import NgramDrafter


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

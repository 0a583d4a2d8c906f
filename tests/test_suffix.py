"""The suffix lookup (edgespec.decoding.drafters.suffix): what followed the answer's last
tokens in the pair's earlier conversations, from an index the engine owns. Pure: token
lists made by hand, no model."""

from __future__ import annotations

import random

import pytest
from synthetic_costs import FLAT_TARGET, NOVEL, costs, plan, policy, view

from edgespec.decoding.auto.stats import AcceptanceStats
from edgespec.decoding.drafters import (
    LOOKUP_DRAFTERS,
    REGISTRY,
    AnswerSetup,
    CopyDrafter,
    Draft,
    DraftRequest,
    LookupDrafter,
    NgramDrafter,
    PairShared,
)
from edgespec.decoding.drafters import suffix as suffix_module
from edgespec.decoding.drafters.suffix import SuffixDrafter, SuffixIndex, key_of
from edgespec.decoding.policy import StepOutcome
from edgespec.decoding.sampling import SamplingParams

QUOTE = list(range(1000, 1040))  # a file an agent read: 40 tokens no other text has


def answer(index: SuffixIndex, prompt: list[int]) -> SuffixDrafter:
    """A new answer's drafter on ``index``, begun with ``prompt``."""
    drafter = SuffixDrafter(index)
    drafter.begin(AnswerSetup(prompt=prompt))
    return drafter


def test_it_finds_a_quote_from_another_conversation():
    index = SuffixIndex()
    answer(index, [1, 2, 3, *QUOTE, 4, 5])  # an earlier request read the file
    drafter = answer(index, [7, 8, 9])  # a new conversation
    context = [7, 8, 9, *QUOTE[:12]]  # ... starts to quote it
    proposal = drafter.proposal(context, 8)
    assert proposal.drafter == "suffix" and proposal.tokens == tuple(QUOTE[12:20])
    assert proposal.evidence == 12  # the match length: how the controller prices it
    assert proposal.asked == 8 and not proposal.from_prediction


def test_a_cleared_index_has_forgotten_every_conversation():
    index = SuffixIndex()
    answer(index, [1, 2, 3, *QUOTE, 4, 5])
    index.clear()
    assert len(index) == 0 and index.keys == 0
    drafter = answer(index, [7, 8, 9])
    assert drafter.proposal([7, 8, 9, *QUOTE[:12]], 8).tokens == ()
    answer(index, [1, 2, 3, *QUOTE, 4, 5])  # and it indexes anew
    assert drafter.proposal([7, 8, 9, *QUOTE[:12]], 8).tokens == tuple(QUOTE[12:20])


def test_it_proposes_nothing_from_nothing():
    index = SuffixIndex()
    drafter = answer(index, [])
    assert drafter.proposal([], 8).tokens == ()
    assert drafter.proposal([1, 2, 3], 8).tokens == ()  # shorter than a key
    answer(index, [10, 11, 12, 13, 14, 15])
    assert drafter.proposal([1, 2, 3, 4, 5, 6], 8).tokens == ()  # no match anywhere
    assert drafter.proposal([1, 2, 3, 4, 5, 6, 7], 0).tokens == ()  # nothing asked
    # three tokens in common are not a match: a key covers four
    assert answer(index, [9]).proposal([9, 12, 13, 14], 8).tokens == ()


def test_a_match_only_inside_the_current_context_is_left_to_ngram():
    index = SuffixIndex()
    drafter = answer(index, [1, *QUOTE, 2])
    assert drafter.proposal([1, *QUOTE, 2, *QUOTE[:10]], 8).tokens == ()
    # ... and one as long inside as outside too: ngram proposes the same tokens
    other = answer(index, [3, *QUOTE, 4])
    assert other.proposal([3, *QUOTE, 4, *QUOTE[:10]], 8).tokens == ()


def test_a_longer_match_outside_than_inside_is_proposed():
    index = SuffixIndex()
    answer(index, [50, 51, 52, 53, *QUOTE])  # the whole line, quoted before
    drafter = answer(index, [60, *QUOTE[:6], 61])  # this context holds only its start
    proposal = drafter.proposal([60, *QUOTE[:6], 61, 52, 53, *QUOTE[:6]], 4)
    assert proposal.tokens == tuple(QUOTE[6:10]) and proposal.evidence == 8


def test_the_longest_match_is_preferred_over_the_newest():
    index = SuffixIndex()
    tail = [200, 201, 202, 203, 204, 205, 206, 207]
    answer(index, [9, *tail, 301, 302, 303])  # the long match (8 tokens)
    answer(index, [9, 8, 204, 205, 206, 207, 401, 402])  # newer, but only 4 tokens
    proposal = answer(index, [5]).proposal([5, *tail], 3)
    assert proposal.tokens == (301, 302, 303) and proposal.evidence == 8
    # among equally long matches the newest wins
    answer(index, [9, *tail, 501, 502])
    assert answer(index, [5]).proposal([5, *tail], 2).tokens == (501, 502)


def test_appending_is_incremental_as_the_context_grows():
    index = SuffixIndex()
    drafter = answer(index, [1, 2, 3])
    context = [1, 2, 3]
    for token in QUOTE:  # the answer writes the file, a step at a time
        context.append(token)
        assert drafter.proposal(context, 4).tokens == ()  # only inside: ngram's
    held = len(index)
    assert held == 3 + len(QUOTE)  # each token once: nothing stored again
    assert drafter.proposal(context, 4).tokens == () and len(index) == held  # no new tokens, no work
    # a later conversation finds what this answer generated
    later = answer(index, [70, 71])
    assert later.proposal([70, 71, *QUOTE[20:26]], 5).tokens == tuple(QUOTE[26:31])


def test_a_context_that_does_not_continue_the_last_starts_a_new_conversation():
    index = SuffixIndex()
    drafter = answer(index, [1, 2, *QUOTE])
    drafter.proposal([1, 2, *QUOTE], 4)
    # reused on another text: the first one becomes another conversation's, quotable
    assert drafter.proposal([3, *QUOTE[:5]], 4).tokens == tuple(QUOTE[5:9])


def test_a_prompt_that_repeats_the_last_request_stores_only_what_it_adds():
    index = SuffixIndex()
    first = [1, 2, 3, *QUOTE]
    drafter = answer(index, first)
    drafter.proposal([*first, 90, 91, 92], 4)  # the answer
    second = [*first, 90, 91, 92, 93, 94]  # the next request repeats all of it
    follow = answer(index, second)
    assert len(index) == len(second)  # shared, not stored twice
    # ... and the first conversation is this one's: its quote is not proposed again
    assert follow.proposal([*second, *QUOTE[:8]], 4).tokens == ()


def test_a_regenerated_answer_is_quoted_from_the_branch_it_left():
    index = SuffixIndex()
    prompt = [1, 2, 3, 4]
    first = answer(index, prompt)
    first.proposal([*prompt, *QUOTE], 4)  # the first answer, which the user regenerates
    again = answer(index, prompt)
    assert len(index) == len(prompt) + len(QUOTE)  # the prompt is shared
    proposal = again.proposal([*prompt, *QUOTE[:6]], 4)
    assert proposal.tokens == tuple(QUOTE[6:10])


def test_a_continuation_stops_where_its_conversation_does():
    index = SuffixIndex()
    answer(index, [1, *QUOTE])  # ends with the quote
    answer(index, [800, 801, 802, 803])  # another conversation, stored right after
    proposal = answer(index, [5]).proposal([5, *QUOTE[-6:-2]], 8)
    assert proposal.tokens == tuple(QUOTE[-2:])  # not into the next conversation's tokens


def test_answers_that_take_turns_are_quoted_across_their_turns():
    """Two answers decoding step by step in turn: each step's tokens are a segment of
    their own, and a quote reads on through its writer's later segments."""
    index = SuffixIndex()
    one, other = answer(index, [1]), answer(index, [2])
    mine, theirs = [1], [2]
    for i in range(0, len(QUOTE), 4):
        mine += QUOTE[i : i + 4]
        theirs += [3000 + i, 3001 + i, 3002 + i, 3003 + i]
        assert one.proposal(mine, 4).tokens == () and other.proposal(theirs, 4).tokens == ()
    proposal = answer(index, [5]).proposal([5, *QUOTE[2:8]], 16)
    assert proposal.tokens == tuple(QUOTE[8:24]) and proposal.evidence == 6


class EveryCandidateCompared(SuffixIndex):
    """The lookup by its definition: every candidate compared in full, none skipped."""

    def _longest_outside(self, conversation, tail, pos):
        best, longest, inside = -1, 0, 0
        for _ in range(self.depth):
            if pos < self._live:
                break
            n = self._match(pos, tail)
            if n >= self.key:
                if conversation.holds(pos):
                    inside = max(inside, n)
                elif n > longest:
                    best, longest = pos, n
            pos = self._prev[pos - self._base]
        return (best, longest) if longest > inside else (-1, 0)


@pytest.mark.parametrize("seed", range(6))
def test_skipping_candidates_that_cannot_win_changes_no_lookup(seed):
    """Four answers in turn, step by step, on text of three tokens and runs of one (every
    key recurs, matches run to the longest compared, inside and outside the answer): each
    lookup skips candidates and gives what comparing every one gives, proposals and their
    evidence alike."""
    rng = random.Random(seed)
    fast, full = SuffixIndex(capacity=3000), EveryCandidateCompared(capacity=3000)
    contexts = [[rng.randrange(3) for _ in range(rng.randrange(5, 60))] for _ in range(4)]
    answers = [(answer(fast, list(c)), answer(full, list(c))) for c in contexts]
    found = 0
    for _ in range(240):
        i = rng.randrange(4)
        step = rng.randrange(1, 5)
        contexts[i] += [0] * step if rng.random() < 0.7 else [rng.randrange(3) for _ in range(step)]
        a, b = (d.proposal(contexts[i], 16) for d in answers[i])
        assert (a.tokens, a.evidence) == (b.tokens, b.evidence)
        found += a.tokens != ()
    assert found > 0  # quotes from the other answers were proposed


def test_the_index_is_bounded_old_conversations_go_first():
    index = SuffixIndex(capacity=1000)
    rng = random.Random(0)
    old = [rng.randrange(50_000) for _ in range(300)]
    answer(index, old)
    sizes = []
    for _ in range(60):  # 60 conversations of 300 tokens each: 18x the capacity
        prompt = [rng.randrange(50_000) for _ in range(200)]
        recent = [*prompt, *(rng.randrange(50_000) for _ in range(100))]
        answer(index, prompt).proposal(recent, 4)  # the answer's 100 tokens, at once
        sizes.append((len(index), index.keys, len(index._tokens), len(index._prev)))
    assert all(held <= 1000 and keys <= 1000 for held, keys, _, _ in sizes)
    assert all(stored <= 2000 and prev == stored for _, _, stored, prev in sizes)  # cut as it goes
    assert len(index._recent) <= 5 and len(index._starts) <= 5 and len(index._keys) == len(index._tokens)
    probe = answer(index, [7])
    assert probe.proposal([7, *old[100:110]], 4).tokens == ()  # dropped
    assert probe.proposal([7, *recent[-40:-30]], 4).tokens == tuple(recent[-30:-26])  # held


def test_a_prompt_longer_than_the_capacity_keeps_its_end():
    index = SuffixIndex(capacity=100)
    long = list(range(5000, 5400))
    answer(index, long)
    assert len(index) == 100 and index.keys <= 100
    probe = answer(index, [1])
    assert probe.proposal([1, *long[-20:-10]], 4).tokens == tuple(long[-10:-6])
    assert probe.proposal([1, *long[:10]], 4).tokens == ()


def test_bulk_and_step_hashing_index_alike(monkeypatch):
    """A prompt's keys are hashed with numpy, a step's in Python: the same keys."""
    rng = random.Random(1)
    tokens = [rng.randrange(150_000) for _ in range(500)]
    indexes = []
    for bulk in (1, 10**9):
        monkeypatch.setattr(suffix_module, "BULK", bulk)
        index = SuffixIndex()
        answer(index, tokens)
        indexes.append(index)
    one, other = indexes
    assert one._latest == other._latest and one._prev == other._prev and one._keys == other._keys
    assert one._latest[key_of(tokens[10:14])] == 14  # the token after those four


def test_a_hash_collision_matches_nothing(monkeypatch):
    monkeypatch.setattr(suffix_module, "key_of", lambda tokens: 0)  # every key collides
    monkeypatch.setattr(suffix_module, "BULK", 10**9)  # ... in Python's hashing too
    index = SuffixIndex()
    answer(index, [1, 2, 3, 4, 5, 6])
    assert answer(index, [9]).proposal([9, 7, 7, 7, 7], 4).tokens == ()
    assert answer(index, [9]).proposal([9, 2, 3, 4, 5], 4).tokens == (6,)


def test_a_fixed_suffix_draft_is_its_proposal_every_token_certain():
    index = SuffixIndex()
    answer(index, [1, *QUOTE])
    drafter = answer(index, [2])
    request = DraftRequest(5, SamplingParams(), None, keep_going=lambda i, c: i < 3)  # type: ignore[arg-type]
    draft = drafter.propose([2, *QUOTE[:8]], request)
    assert draft.tokens == QUOTE[8:11] and draft.confidences == [1.0] * 3 and draft.evidence == 8


def test_the_registry_shares_one_index_per_pair_and_the_controller_prices_it():
    spec = REGISTRY["suffix"]
    assert spec.free and spec.priced_by == "proposal" and "suffix" in LOOKUP_DRAFTERS
    other = {s.colour.lower() for n, s in REGISTRY.items() if n != "suffix"}
    assert spec.colour.lower() not in other | {
        "#9ca3af",
        "#6b7280",
        "#16a34a",
        "#22c55e",
        "#ef4444",
        "#3b82f6",
    }
    shared = PairShared()
    one, two = (spec.factory(None, None, shared) for _ in range(2))  # type: ignore[arg-type]
    assert one.index is two.index is shared.suffixes  # type: ignore[attr-defined]
    assert PairShared().suffixes is not shared.suffixes and shared.suffixes.capacity == 1_000_000
    # the controller starts it from the measured figures it was given (ngram's)
    stats = AcceptanceStats().lookup
    assert stats["suffix"].measured == stats["ngram"].measured


@pytest.mark.parametrize("capacity", [0, 4])
def test_a_capacity_must_hold_more_than_a_key(capacity):
    with pytest.raises(AssertionError):
        SuffixIndex(capacity=capacity)


# -- the controller ---------------------------------------------------------------------------


def auto_plans(allowed: tuple[str, ...], lookups: dict[str, LookupDrafter]) -> list[tuple[str, int, str]]:
    """The controller's plans over an answer that copies 40 tokens of its context and then
    writes 40 of its own, each step committing what its draft got right and one more."""
    adaptive = policy(costs(FLAT_TARGET, draft_ms=5), allowed)
    source = list(range(300, 340))
    truth = [*source, *range(2000, 2040)]
    context, plans = [*NOVEL, *source, 1], []
    done = 0
    while done < len(truth):
        step = plan(adaptive, context, lookups=lookups)
        drafted = lookups[step.drafter].proposal(context, step.gamma).tokens if step.gamma else ()
        accepted = 0
        while (
            accepted < len(drafted)
            and done + accepted < len(truth)
            and drafted[accepted] == truth[done + accepted]
        ):
            accepted += 1
        new = truth[done : done + accepted + 1]
        outcome = StepOutcome(step.drafter, len(drafted), accepted, Draft(tokens=[]), 0.04, 0.0, new)
        adaptive.observe(outcome)
        context, done = [*context, *new], done + len(new)
        plans.append((step.drafter, step.gamma, step.reason))
    return plans


def test_a_suffix_lookup_that_finds_nothing_changes_none_of_autos_plans():
    """Allowed but silent (one conversation: every match is inside it), the suffix lookup
    opens no option and no proposal: the plans are the same, step for step."""
    without = auto_plans(("ngram", "copy"), {"ngram": NgramDrafter(), "copy": CopyDrafter()})
    silent = SuffixDrafter(SuffixIndex())
    lookups = {"ngram": NgramDrafter(), "copy": CopyDrafter(), "suffix": silent}
    assert auto_plans(("ngram", "copy", "suffix"), lookups) == without
    assert "suffix" not in str(without) and len(silent.index) > 80  # asked and fed all along


def test_auto_prices_a_quote_from_another_conversation_and_drafts_it():
    index = SuffixIndex()
    answer(index, [*NOVEL, *QUOTE])
    lookups = {"ngram": NgramDrafter(), "suffix": answer(index, [7, 8, 9])}
    adaptive = policy(costs(FLAT_TARGET, draft_ms=5), ("ngram", "suffix"))
    step_view = view([7, 8, 9, *QUOTE[:12]], lookups=lookups)
    options = {c.drafter: c for c in adaptive.choices(step_view).options}
    assert "ngram" not in options and options["suffix"].gamma > 1
    assert options["suffix"].rate > options["none"].rate
    chosen = adaptive.plan(step_view)
    assert chosen.drafter == "suffix" and chosen.gamma == options["suffix"].gamma

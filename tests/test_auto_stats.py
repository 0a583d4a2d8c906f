"""The controller's acceptance statistics (edgespec.decoding.auto.stats): what it learns
about the drafters' proposals, how fast, and how much of it carries into a new answer."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from synthetic_costs import f16_costs, policy

from edgespec.decoding.auto import DEFAULT, AcceptanceStats, LookupStats, expected_tokens, posterior_mean
from edgespec.decoding.auto.stats import HELD, length_buckets


def test_expected_tokens():
    np.testing.assert_allclose(expected_tokens(np.array([1.0, 1.0])), [1, 2, 3])
    np.testing.assert_allclose(expected_tokens(np.array([0.5, 0.5])), [1, 1.5, 1.75])


def test_posterior_mean_is_the_prior_without_evidence_and_follows_plenty_of_it():
    assert posterior_mean(0.0, 0.0, 0.3, 2.0) == pytest.approx(0.3)
    assert posterior_mean(1.0, 1.0, 0.3, 1.0) == pytest.approx(0.65)
    assert posterior_mean(900.0, 1000.0, 0.3, 2.0) == pytest.approx(0.9, abs=0.002)


def test_match_lengths_are_pooled_into_geometric_buckets():
    buckets = length_buckets(DEFAULT.length_edges)
    assert buckets.count == len(DEFAULT.length_edges)
    assert [buckets.of[m] for m in (0, 1, 2, 3, 4, 5, 6, 8, 9)] == [0, 0, 1, 2, 3, 3, 4, 4, 5]
    assert buckets.of[buckets.longest] == buckets.count - 1
    # token i of a proposal after a match of m tokens: the bucket of m + i
    assert buckets.from_[3, 2] == buckets.of[5]
    assert buckets.from_[buckets.longest, 5] == buckets.count - 1


def test_a_lookups_acceptance_follows_its_tuning_and_its_evidence():
    fresh = LookupStats()
    hopeful = LookupStats(dataclasses.replace(DEFAULT, lookup_prior=0.9))
    assert hopeful.acceptance(1, 4).min() > fresh.acceptance(1, 4).max()
    for _ in range(40):  # copies after a three-token match have held
        fresh.observe(3, True)
    assert fresh.acceptance(3, 1)[0] > 0.8
    assert fresh.acceptance(1, 1)[0] < 0.5  # a one-token match has no evidence of its own


def test_the_draft_models_acceptance_is_learned_within_a_few_steps():
    """From the prior, two fully accepted steps of four tokens make the draft look reliable,
    and three steps whose first token fails make it look poor: an EMA from the prior needs
    a dozen tokens for either, and by then the answer is half over."""
    right = AcceptanceStats()
    for _ in range(2):
        right.observe_model([0.9] * 4, 4)
    assert right.model >= 0.8
    wrong = AcceptanceStats()
    for _ in range(3):
        wrong.observe_model([0.9] * 4, 0)  # judged: the first token only, and it failed
    assert wrong.model <= 0.3


def test_the_early_stop_gives_thin_evidence_the_benefit_of_the_doubt():
    """Where a confidence bucket has seen few judged tokens its estimate is raised by one
    standard error; once it has seen many, the estimate is what was measured."""
    stats = AcceptanceStats()
    stats.model_by_confidence[:] = 0.5
    thin = stats.model_acceptance(0.55, optimistic=True)
    assert thin == pytest.approx(0.5 + math.sqrt(0.25 / 1.0))
    for _ in range(200):
        stats.observe_model([0.55, 0.55], 1)  # one right, one wrong: stays at 0.5
    thick = stats.model_acceptance(0.55, optimistic=True)
    assert stats.model_acceptance(0.55) < thick < thin
    assert thick - stats.model_acceptance(0.55) < 0.2


def test_the_draft_models_record_from_earlier_answers_is_a_weak_prior_for_a_new_one():
    """A draft that failed all through the last answer (a translation) and drafts four
    right tokens in the first step of this one (a sum) is judged mostly on this answer:
    within one step it is back near its prior, where the old record alone would keep it far
    below break-even."""
    stats = AcceptanceStats()
    for _ in range(30):
        stats.observe_model([0.5] * 4, 0)
    assert stats.model < 0.1
    policy(f16_costs(), ("model",), stats=stats)  # a new answer
    stats.observe_model([0.5] * 4, 4)
    assert stats.model > 0.45, stats.model


def test_a_copy_that_held_long_is_judged_apart_starting_from_the_other_evidence():
    """After a long copy held in this answer, the drafter's proposals are judged at their
    own level: with no evidence of their own they are priced as at the base level (less
    its caution: the answer has shown it follows its source), their
    evidence moves them and not the base level, and the base level's evidence still
    reaches them."""
    stats = LookupStats()
    for _ in range(30):  # at the base level, 3-token matches hold half the time
        stats.observe(3, True)
        stats.observe(3, False)
    base, held = stats.acceptance(3, 1), stats.acceptance(3, 1, source=HELD)
    # the base level's estimate, without the caution the base level takes off
    assert held[0] == pytest.approx(stats._base_means(0)[stats.buckets.of[3]], abs=0.02) and held[0] > base[0]
    for _ in range(30):  # ... and always after a held copy
        stats.observe(3, True, source=HELD)
    assert stats.acceptance(3, 1, source=HELD)[0] > 0.8
    assert stats.acceptance(3, 1)[0] == pytest.approx(base[0])  # the base level is unmoved
    for _ in range(60):  # base evidence at another length reaches the held level's empty bucket
        stats.observe(1, False)
    assert stats.acceptance(1, 1, source=HELD)[0] < 0.2

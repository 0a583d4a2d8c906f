"""Pricing (edgespec.decoding.auto.pricing): what each way of taking a step is expected to
yield, as pure functions, and the choices the controller makes from those prices on
synthetic cost curves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from synthetic_costs import (
    CPU_TARGET,
    F16_TARGET,
    FLAT_TARGET,
    GREEDY,
    H200_TARGET,
    NOVEL,
    acceptance_stats,
    costs,
    model_price,
    plan,
    policy,
    view,
)

from edgespec.decoding.auto import DEFAULT, pricing
from edgespec.decoding.auto.stats import expected_tokens
from edgespec.decoding.drafters import Draft, NgramDrafter
from edgespec.decoding.policy import LINE_BREAK, UNIT_END, StepOutcome, StepView

# -- the pure functions -------------------------------------------------------------------


def test_verification_and_plain_steps_are_priced_from_the_curve_and_the_python_around_them():
    model = costs(CPU_TARGET, draft_ms=22)
    model.overhead, model.plain_overhead = 0.003, 0.001
    np.testing.assert_allclose(
        pricing.verify_seconds(model, np.array([1, 4])), [0.102 + 0.003, 0.220 + 0.003]
    )
    assert pricing.plain_seconds(model) == pytest.approx(0.058 + 0.001)


# A CPU whose passes cost a fixed part and a part per token alike (25 ms each), and a GPU
# whose passes cost about the same whatever they hold.
LINEAR_MS = {1: 50, 2: 75, 17: 450}
STEADY_MS = {1: 40, 2: 40.2, 17: 43.2}


def test_a_pass_shared_with_other_answers_is_priced_by_what_it_adds_to_their_decode():
    model = costs(LINEAR_MS, draft_ms=22)
    model.plain_overhead = 0.0
    shared = pricing.sharing(model, answers=3, tokens=3)  # three plain steps: 100 ms
    assert shared is not None and shared.seconds == pytest.approx(0.100)
    assert pricing.plain_seconds(model, shared) == pytest.approx(0.025)
    np.testing.assert_allclose(pricing.verify_seconds(model, np.array([1, 4]), shared), [0.050, 0.125])
    # Beyond the profile's largest pass, along its last line.
    wide = pricing.sharing(model, answers=3, tokens=40)
    np.testing.assert_allclose(pricing.verify_seconds(model, np.array([1]), wide), [0.050])
    assert pricing.sharing(model, answers=0, tokens=0) is None


@pytest.mark.parametrize(
    ("curve", "drafts_shared"),
    [(LINEAR_MS, False), (STEADY_MS, True)],
    ids=["cpu-linear", "gpu-steady"],
)
def test_a_draft_that_pays_alone_pays_shared_only_where_the_decode_costs_little_more(curve, drafts_shared):
    """Three plain steps share the decode. On the CPU, each token added to it costs half a
    pass alone: plain steps decoded together get what a 70 % draft would, and the draft
    loses. On the GPU the draft costs the decode almost nothing, and still pays."""
    model = costs(curve, draft_ms=22)
    accept = np.full(16, 0.7)
    alone_plain = pricing.plain_seconds(model)
    alone = pricing.best_gamma(
        "ngram", accept, pricing.verify_seconds(model, np.arange(1, 17)), 0.0, 0.0, risk=1.0
    )
    assert alone.rate > DEFAULT.min_gain / alone_plain
    shared = pricing.sharing(model, answers=3, tokens=3)
    row = pricing.verify_seconds(model, np.arange(1, 17), shared)
    plain_s = pricing.plain_seconds(model, shared)
    together = pricing.best_gamma("ngram", accept, row, 0.0, 0.0, risk=1.0, plain_s=plain_s, shared=shared)
    assert (together.rate > DEFAULT.min_gain / alone_plain) is drafts_shared
    # Plain decoding is worth the same shared as alone: the scale every option is put on.
    plain_rate = pricing.step_rates(np.array([1.0]), np.array([plain_s]), shared)
    assert plain_rate[0] == pytest.approx(1.0 / alone_plain)


def test_the_best_gamma_is_cut_to_what_the_answer_can_afford_to_lose():
    """A step whose first draft fails yields the one token a plain step would: it loses
    what it costs beyond a plain step, whatever γ it drafted, and that must fit."""
    sure = np.ones(4)
    verify_row = np.array([1.0, 1.1, 1.2, 1.3])  # seconds to verify 1..4 drafts
    plain_s = 0.9
    unbounded = pricing.best_gamma("ngram", sure, verify_row, 0.0, 0.0, risk=1.0, plain_s=plain_s)
    assert unbounded.gamma == 4 and unbounded.expected == pytest.approx(5.0)
    assert unbounded.rate == pytest.approx(5.0 / 1.3)
    bounded = pricing.best_gamma("ngram", sure, verify_row, 0.0, 0.0, risk=0.25, plain_s=plain_s)
    assert bounded.gamma == 2 and bounded.seconds == pytest.approx(1.1)
    # a fixed cost (a return to plain decoding, a draft's catch-up) is lost too
    dearer = pricing.best_gamma("ngram", sure, verify_row, 0.1, 0.0, risk=0.25, plain_s=plain_s)
    assert dearer.gamma == 1
    # where not even one draft fits, none is priced
    assert pricing.best_gamma("ngram", sure, verify_row, 0.0, 0.0, risk=0.05, plain_s=plain_s).gamma == 0
    # the user's γ is priced as given, risk or not
    fixed = pricing.best_gamma("ngram", np.full(4, 0.5), verify_row, 0.0, 0.0, fixed_gamma=3)
    assert fixed.gamma == 3 and fixed.expected == pytest.approx(expected_tokens(np.full(3, 0.5))[-1])


def test_the_risk_budget_is_what_drafting_saved_plus_a_share_of_the_answers_plain_time():
    plain_s = 0.05
    assert pricing.risk_budget(DEFAULT, 0.0, 10, plain_s) == pytest.approx(
        DEFAULT.risk_share * plain_s * DEFAULT.risk_tokens
    )
    assert pricing.risk_budget(DEFAULT, 0.2, 200, plain_s) == pytest.approx(
        0.2 + DEFAULT.risk_share * plain_s * 200
    )
    timid = dataclasses.replace(DEFAULT, risk_share=0.0)
    assert pricing.risk_budget(timid, 0.2, 200, plain_s) == pytest.approx(0.2)


def test_crossings_mark_tokens_after_a_sentence_end_and_tokens_that_break_the_line():
    kinds = {0: UNIT_END, 9: LINE_BREAK}

    def boundaries(tokens: list[int]) -> list[int]:
        return [kinds.get(t, 0) for t in tokens]

    step = StepView([5, 7], 16, GREEDY, boundaries=boundaries)
    # "0" ends a sentence with its punctuation alone: copied as readily as any other token
    assert pricing.crossings(step, [1, 0, 2, 3, 9, 4]).tolist() == [False, False, True, False, True, True]
    assert pricing.crossings(StepView([5, 7], 16, GREEDY), [1, 0, 2]) is None


# -- what the controller chooses at those prices ------------------------------------------


def test_a_drafting_step_after_plain_steps_is_charged_the_return_to_plain_decoding():
    """On a GPU the first two single-token passes after a multi-token one cost more (an
    H200: a few ms each, where a token takes 1.8). Learned from the plain steps that follow
    drafting, that return is charged to a step that would start drafting after plain steps
    (not to one that goes on drafting); a CPU's noise around zero is not charged."""
    copy = [*range(500, 540), 1, *range(500, 504)]  # a long copy under way

    def learned(first_ms: float, second_ms: float, swing_ms: float = 0.0):
        adaptive = policy(costs(H200_TARGET, draft_ms=2), ("ngram",))
        ngram = adaptive.stats.lookup["ngram"]
        ngram.hits[:], ngram.seen[:] = 40.0, 50.0  # copies have held 80 % of the time
        drafted = Draft(tokens=[0] * 4, confidences=[1.0] * 4)
        for cycle in range(6):
            adaptive.observe(StepOutcome("ngram", 4, 4, drafted, 0.0042, 0.0, [0] * 5))
            swing = swing_ms if cycle % 2 else -swing_ms  # a slow return, then a fast one
            for ms in (first_ms + swing, second_ms + swing, 1.8, 1.8):
                adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), ms / 1000, 0.0, [0]))
        return adaptive

    assert plan(learned(1.8, 1.8), copy).drafter == "ngram"  # no return cost: the copy pays
    assert plan(learned(1.85, 1.9), copy).drafter == "ngram"  # noise is not charged ...
    assert plan(learned(1.8, 1.8, swing_ms=1.0), copy).drafter == "ngram"  # ... nor added up
    gpu = learned(4.8, 5.8)
    assert plan(gpu, copy).drafter == "none"  # a 4-token draft does not pay for the return
    gpu.observe(
        StepOutcome("ngram", 4, 4, Draft(tokens=[0] * 4, confidences=[1.0] * 4), 0.0042, 0.0, [0] * 5)
    )
    assert plan(gpu, copy).drafter == "ngram"  # while drafting goes on, there is none to pay


def test_python_time_is_learned_apart_for_plain_and_drafting_steps():
    """On an H200 host a drafting step's Python (lookups, pricing) took 0.24-0.57 ms and a
    plain step's 0.08 ms, beside 1.8 ms of GPU time: learned as one figure, it priced plain
    decoding a quarter slower than it is, and the check of what drafting realized compared
    drafting with that."""
    adaptive = policy(costs(H200_TARGET, draft_ms=2), ("ngram",))
    held = Draft(tokens=[0] * 4, confidences=[1.0] * 4)
    for _ in range(12):
        adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.0018, 0.00008, [0]))
        adaptive.observe(StepOutcome("ngram", 4, 4, held, 0.0042, 0.0005, [0] * 5))
    adaptive.begin()  # (an answer prices its steps by what was learned before it started)
    plain = adaptive.choices(view(NOVEL)).options[0]
    assert plain.seconds == pytest.approx(0.0018 + 0.00008, rel=0.02)
    assert adaptive.costs.overhead == pytest.approx(0.0005, rel=0.02)


def test_expensive_drafting_means_plain_decoding():
    adaptive = policy(costs(CPU_TARGET, draft_ms=500), ("ngram", "model"), stats=acceptance_stats(model=0.9))
    chosen = plan(adaptive, NOVEL)
    assert (chosen.drafter, chosen.gamma) == ("none", 0)


def test_cheap_verification_means_a_large_gamma():
    adaptive = policy(costs(FLAT_TARGET, draft_ms=2), ("ngram", "model"), stats=acceptance_stats(model=0.9))
    chosen = plan(adaptive, NOVEL)
    assert chosen.drafter == "model" and chosen.gamma >= 8


def test_cpu_costs_with_a_good_model_draft_still_prefer_plain_decoding():
    """The situation MACHINE.md measured: the 0.5B draft costs half a target step and
    verification is steep, so even 90 % acceptance does not pay."""
    adaptive = policy(costs(CPU_TARGET, draft_ms=22), ("ngram", "model"), stats=acceptance_stats(model=0.9))
    assert plan(adaptive, NOVEL).drafter == "none"


def test_a_long_draft_is_bounded_by_its_worst_case_however_sure_the_copy():
    """A long copy on a steep CPU: a 16-token draft whose first token fails costs several
    plain steps there, more than 3 % of an answer may lose. However often copies have
    held, the answer drafts short until drafting has saved that worst case (a sure copy
    that breaks once must not put it behind plain decoding); on a flat (GPU) curve the
    worst case is small and it drafts long at once."""
    repeated = list(range(200, 240))
    context = [*repeated, 0, *repeated[:10]]

    def evidence(hits: float, seen: float = 50.0):
        stats = acceptance_stats()
        stats.lookup["ngram"].hits[:], stats.lookup["ngram"].seen[:] = hits, seen
        return stats

    steep = costs(CPU_TARGET, draft_ms=22)
    sure = policy(steep, ("ngram", "model"), stats=evidence(400.0, 400.0), tuning=DEFAULT)
    sure.answer.tokens = 40  # (a one-token draft's worst case fits the allowance from 33 tokens on)
    first = plan(sure, context)
    assert first.drafter == "ngram" and 1 <= first.gamma <= 4
    # once drafting has saved the worst case of a long draft, the sure copy drafts long
    sure.answer.saved_s, sure.answer.tokens = 2.0, 40
    assert plan(sure, context).gamma >= 12
    gpu = policy(costs(FLAT_TARGET, draft_ms=2), ("ngram",), stats=evidence(46.0), tuning=DEFAULT)
    assert plan(gpu, context).gamma >= 12


def test_lookups_that_agree_are_priced_apart_from_one_alone():
    """Two lookups that copy from different places and propose the same next token are
    judged on their own evidence: here agreed proposals were always right and lone ones
    never, so only an agreed proposal is drafted, and what it teaches goes to its kind."""
    stats = acceptance_stats()
    for name in ("ngram", "reflow"):
        lookup = stats.lookup[name]
        lookup.seen[:] = 50.0
        lookup.hits[0] = 0.0  # alone: always wrong
        lookup.hits[1] = 50.0  # agreed: always right
    adaptive = policy(costs(CPU_TARGET, draft_ms=22), ("ngram", "reflow"), stats=stats)
    # "reflow" here is a second n-gram lookup that sees only the last token: it agrees with
    # the longest match after [1, 2, 3] (both copy 4 ...), not after [7, 8, 9] (50 vs 70).
    lookups = {"ngram": NgramDrafter(min_n=1, max_n=4), "reflow": NgramDrafter(min_n=1, max_n=1)}
    agreed = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3]
    alone = [7, 8, 9, 70, 71, 1, 8, 9, 60, 61, 2, 9, 50, 51, 3, 7, 8, 9]
    assert plan(adaptive, alone, lookups=lookups).drafter == "none"
    chosen = plan(adaptive, agreed, lookups=lookups)
    assert chosen.drafter in ("ngram", "reflow") and chosen.gamma >= 2
    before = stats.lookup["ngram"].seen.copy()
    adaptive.observe(
        StepOutcome(
            chosen.drafter, 2, 2, Draft(tokens=[4, 5]), verify_s=0.18, overhead_s=0.0, new_tokens=[4, 5, 6]
        )
    )
    grown = stats.lookup["ngram"].seen - before
    assert grown[1].sum() > 0  # the agreed proposal's tokens were judged as agreed ones


def test_fixed_gamma_is_respected_and_zero_means_plain():
    flat = {1: 40, 17: 44}
    adaptive = policy(costs(flat, 2), ("model",), fixed_gamma=3, stats=acceptance_stats(model=0.99))
    assert (plan(adaptive, NOVEL).drafter, plan(adaptive, NOVEL).gamma) == ("model", 3)
    adaptive = policy(costs(flat, 2), ("model",), fixed_gamma=0, stats=acceptance_stats(model=0.99))
    assert plan(adaptive, NOVEL).drafter == "none"


def test_early_stop_on_low_draft_confidence():
    flat = {1: 40, 2: 41, 5: 43, 9: 46, 17: 50}
    stats = acceptance_stats(model=0.9)
    stats.model_by_confidence[:] = np.linspace(0.0, 1.0, len(stats.model_by_confidence))
    adaptive = policy(costs(flat, draft_ms=10), ("model",), stats=stats)
    chosen = plan(adaptive, NOVEL)
    assert chosen.drafter == "model" and chosen.keep_going is not None
    assert all(chosen.keep_going(i, 0.99) for i in range(4))  # confident drafts continue
    assert not chosen.keep_going(4, 0.02)  # a draft the calibration says fails stops here


def test_drafts_stop_at_a_source_boundary_where_answers_keep_leaving_it():
    """Token 0 ends a sentence. Copies of a source have held for long (a long match),
    but the answer has left the source after every sentence end so far (a bullet
    summary): the draft stops at the boundary. Where the answer has gone on past them
    (an edit copying line after line), the draft runs through."""
    source = [*range(500, 510), 0, *range(510, 530)]
    context = [*source, 1, *source[:6]]

    def drafted(crossing_hits: float) -> int:
        flat = {1: 40, 2: 42, 5: 46, 9: 52, 17: 64}
        adaptive = policy(costs(flat, draft_ms=2), ("ngram",))
        ngram = adaptive.stats.lookup["ngram"]  # this answer's evidence so far
        ngram.hits[:] = ngram.seen[:] = 50.0
        ngram.cross_hits, ngram.cross_seen = crossing_hits, 10.0

        def boundaries(tokens: list[int]) -> list[int]:
            return [UNIT_END if t == 0 else 0 for t in tokens]

        return adaptive.plan(view(context, 16, {"ngram": NgramDrafter()}, boundaries=boundaries)).gamma

    assert drafted(0.0) <= 5  # up to the sentence end, not past it
    assert drafted(10.0) >= 12


def test_a_return_to_the_draft_model_is_priced_with_its_catch_up():
    """The draft's first catch-up in an answer is its prompt prefill, paid once: priced by
    the share of the answer a step makes. A later catch-up (the draft coming back after
    steps of other options) is paid again at every return: priced over the few steps a
    return lasts. Neither counts against what the draft's steps realize: a return after a
    ban must not make the draft look worse and earn it a longer ban. (What an answer may
    lose is not bounded here: a 0.6 s catch-up would put it behind for good.)"""
    unbounded = dataclasses.replace(DEFAULT, risk_share=1e6)
    adaptive = policy(
        costs(F16_TARGET, draft_ms=37), ("model",), stats=acceptance_stats(model=0.8), tuning=unbounded
    )
    behind = view(NOVEL, catch_up=40)  # the draft's cache: 40 tokens behind the context

    def model_step(catch_up_s: float) -> None:
        decodes = [(40, catch_up_s), (1, 0.037), (1, 0.037), (1, 0.037)]
        draft = Draft(tokens=[0] * 4, confidences=[0.9] * 4, seconds=catch_up_s + 0.111, decodes=decodes)
        adaptive.observe(StepOutcome("model", 4, 4, draft, 0.182, 0.0, [0] * 5))

    first = model_price(adaptive, behind)
    model_step(0.6)  # the prompt prefill: 5 tokens in 0.29 s without it
    back = model_price(adaptive, behind)
    assert back - first > 0.1  # (0.6 s − one draft token) over 4 steps, not over the answer
    for _ in range(2):
        model_step(0.6)  # every step follows a return, and pays 0.6 s to catch up
    assert adaptive.answer.realized.rate("model") == pytest.approx(5 / 0.293)


def test_an_answer_that_copies_shares_the_draft_prefill_among_few_steps():
    """The draft's prompt prefill is paid once and shared by the steps the answer has left:
    after steps that each copied nine tokens there are few of them, and the draft model
    is priced dearer than at the start of the answer."""
    adaptive = policy(
        costs(F16_TARGET, draft_ms=37), ("model",), fixed_gamma=4, stats=acceptance_stats(model=0.8)
    )
    behind = view(NOVEL, catch_up=400)

    before = model_price(adaptive, behind)
    for _ in range(3):
        adaptive.observe(StepOutcome("ngram", 8, 8, Draft(tokens=[0] * 8), 0.25, 0.0, [0] * 9))
    prefill = 400 * 0.037  # the draft curve holds one point: 37 ms a token
    steps_left = (256 / 9, 256 / expected_tokens(np.full(4, 0.6))[-1])
    assert model_price(adaptive, behind) - before == pytest.approx(
        prefill / steps_left[0] - prefill / steps_left[1], rel=0.05
    )

"""The n-gram drafter on constructed token sequences, the cost-aware controller with
costs injected through the cost model's interface (no sleeps, no models), and the cost
profile measured on a real small model."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.decoding import controller
from edgespec.decoding.controller import (
    _EARLY_TRIALS,
    _MAX_EXPLORE_EVERY,
    _SETTLE_STEPS,
    AcceptanceStats,
    AdaptivePolicy,
    ControllerState,
    expected_tokens,
)
from edgespec.decoding.costs import (
    CostCurve,
    CostModel,
    implausible,
    load_or_measure,
    profile_facts,
    profile_path,
    profile_path_for,
)
from edgespec.decoding.drafters import Draft, NgramDrafter
from edgespec.decoding.policy import UNIT_END, StepOutcome, StepView
from edgespec.decoding.sampling import SamplingParams

GREEDY = SamplingParams()


# -- n-gram drafter ---------------------------------------------------------------------


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


# -- controller -------------------------------------------------------------------------


class FakeModelDrafter:
    def __init__(self, behind: int = 1):
        self.behind = behind

    def catch_up_cost_tokens(self, context):
        return self.behind


def drafters() -> dict:
    return {"ngram": NgramDrafter(), "model": FakeModelDrafter()}


def costs(target_ms: dict[int, float], draft_ms: float, k_max: int = 17, curve=None) -> CostModel:
    curve = curve or CostCurve
    model = CostModel(target=curve(k_max), draft=curve(k_max), overhead=0.0)
    for k, ms in target_ms.items():
        model.target.set(k, ms / 1000)
    model.draft.set(1, draft_ms / 1000)
    return model


CPU_TARGET = {1: 58, 2: 102, 4: 202, 5: 220, 8: 429, 9: 484, 16: 628, 17: 759}  # a 2-core AVX2 EPYC, measured
F16_TARGET = {1: 143, 2: 150, 5: 182, 9: 250, 17: 400}  # the F16 stand-in: nearly flat
NOVEL = [101, 102, 103, 104, 105, 106, 107, 108]  # no repeats: nothing for n-grams


def plan(
    policy: AdaptivePolicy,
    context: list[int],
    budget: int = 16,
    helpers: dict | None = None,
    remaining: int = 256,
):
    return policy.plan(StepView(context, budget, GREEDY, helpers or drafters(), remaining=remaining))


def model_price(policy: AdaptivePolicy, view: StepView) -> float:
    """Seconds the controller expects the draft model's next step to take."""
    return next(c.seconds for c in policy.choices(view) if c.drafter == "model")


def test_expected_tokens():
    np.testing.assert_allclose(expected_tokens(np.array([1.0, 1.0])), [1, 2, 3])
    np.testing.assert_allclose(expected_tokens(np.array([0.5, 0.5])), [1, 1.5, 1.75])


H200_TARGET = {1: 1.8, 2: 5.0, 5: 4.2, 9: 5.3, 17: 5.8}  # ms, each size after single tokens


def test_a_drafting_step_after_plain_steps_is_charged_the_return_to_plain_decoding():
    """On a GPU the first two single-token passes after a multi-token one cost more (an
    H200: a few ms each, where a token takes 1.8). Learned from the plain steps that follow
    drafting, that return is charged to a step that would start drafting after plain steps
    (not to one that goes on drafting); a CPU's noise around zero is not charged."""
    copy = [*range(500, 540), 1, *range(500, 504)]  # a long copy under way

    def learned(first_ms: float, second_ms: float, swing_ms: float = 0.0) -> AdaptivePolicy:
        policy = AdaptivePolicy(costs(H200_TARGET, draft_ms=2), ("ngram",), gamma_cap=16)
        ngram = policy.stats.lookup["ngram"]
        ngram.hits[:], ngram.seen[:] = 40.0, 50.0  # copies have held 80 % of the time
        drafted = Draft(tokens=[0] * 4, confidences=[1.0] * 4)
        for cycle in range(6):
            policy.observe(StepOutcome("ngram", 4, 4, drafted, 0.0042, 0.0, [0] * 5))
            swing = swing_ms if cycle % 2 else -swing_ms  # a slow return, then a fast one
            for ms in (first_ms + swing, second_ms + swing, 1.8, 1.8):
                policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), ms / 1000, 0.0, [0]))
        return policy

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
    policy = AdaptivePolicy(costs(H200_TARGET, draft_ms=2), ("ngram",), gamma_cap=16)
    held = Draft(tokens=[0] * 4, confidences=[1.0] * 4)
    for _ in range(12):
        policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.0018, 0.00008, [0]))
        policy.observe(StepOutcome("ngram", 4, 4, held, 0.0042, 0.0005, [0] * 5))
    plain = policy.choices(StepView(NOVEL, 16, GREEDY, drafters(), remaining=256))[0]
    assert plain.seconds == pytest.approx(0.0018 + 0.00008, rel=0.02)
    assert policy.costs.overhead == pytest.approx(0.0005, rel=0.02)


def test_expensive_drafting_means_plain_decoding():
    stats = AcceptanceStats(model=0.9)
    policy = AdaptivePolicy(costs(CPU_TARGET, draft_ms=500), ("ngram", "model"), gamma_cap=16, stats=stats)
    chosen = plan(policy, NOVEL)
    assert (chosen.drafter, chosen.gamma) == ("none", 0)


def test_cheap_verification_means_a_large_gamma():
    flat = {1: 40, 2: 40.5, 5: 41, 9: 42, 17: 44}  # a GPU: verifying 16 costs as much as 1
    stats = AcceptanceStats(model=0.9)
    policy = AdaptivePolicy(costs(flat, draft_ms=2), ("ngram", "model"), gamma_cap=16, stats=stats)
    chosen = plan(policy, NOVEL)
    assert chosen.drafter == "model" and chosen.gamma >= 8


def test_cpu_costs_with_a_good_model_draft_still_prefer_plain_decoding():
    """The situation MACHINE.md measured: the 0.5B draft costs half a target step and
    verification is steep, so even 90 % acceptance does not pay."""
    stats = AcceptanceStats(model=0.9)
    policy = AdaptivePolicy(costs(CPU_TARGET, draft_ms=22), ("ngram", "model"), gamma_cap=16, stats=stats)
    assert plan(policy, NOVEL).drafter == "none"


def test_a_long_draft_waits_until_the_answer_can_afford_its_worst_case():
    """A long, reliable copy on a steep CPU: a 16-token draft whose first token fails costs
    eleven plain steps there, more than 3 % of an answer can lose. So an answer starts with
    short drafts, drafts long once drafting has saved enough, and short again after a long
    draft failed; on a flat (GPU) curve it drafts long at once."""
    repeated = list(range(200, 240))
    context = [*repeated, 0, *repeated[:10]]

    def reliable() -> AcceptanceStats:
        stats = AcceptanceStats()
        stats.lookup["ngram"].hits[:] = stats.lookup["ngram"].seen[:] = 50.0  # copies held before
        return stats

    cpu = costs(CPU_TARGET, draft_ms=22)
    policy = AdaptivePolicy(cpu, ("ngram", "model"), gamma_cap=16, stats=reliable())
    first = plan(policy, context)
    assert first.drafter == "ngram" and 1 <= first.gamma <= 4
    held = Draft(tokens=[0] * 4, confidences=[1.0] * 4)
    for i in range(10):  # the copy goes on; each step saved 5 plain steps (290 ms) less its 220 ms
        copied = repeated[10 + 5 * i : 15 + 5 * i]
        policy.observe(StepOutcome("ngram", 4, 4, held, verify_s=0.22, overhead_s=0.0, new_tokens=copied))
    chosen = plan(policy, context)
    assert chosen.drafter == "ngram" and chosen.gamma >= 12
    failed = Draft(tokens=[1] * chosen.gamma, confidences=[1.0] * chosen.gamma)
    policy.observe(StepOutcome("ngram", chosen.gamma, 0, failed, verify_s=0.7, overhead_s=0, new_tokens=[0]))
    assert plan(policy, context).gamma <= 5
    flat = {1: 40, 2: 40.5, 5: 41, 9: 42, 17: 44}
    gpu = AdaptivePolicy(costs(flat, draft_ms=2), ("ngram",), gamma_cap=16, stats=reliable())
    assert plan(gpu, context).gamma >= 12


def test_lookups_that_agree_are_priced_apart_from_one_alone():
    """Two lookups that copy from different places and propose the same next token are
    judged on their own evidence: here agreed proposals were always right and lone ones
    never, so only an agreed proposal is drafted, and what it teaches goes to its kind."""
    stats = AcceptanceStats()
    for name in ("ngram", "reflow"):
        lookup = stats.lookup[name]
        lookup.seen[:] = 50.0
        lookup.hits[0] = 0.0  # alone: always wrong
        lookup.hits[1] = 50.0  # agreed: always right
    policy = AdaptivePolicy(costs(CPU_TARGET, draft_ms=22), ("ngram", "reflow"), gamma_cap=16, stats=stats)
    # "reflow" here is a second n-gram lookup that sees only the last token: it agrees with
    # the longest match after [1, 2, 3] (both copy 4 ...), not after [7, 8, 9] (50 vs 70).
    helpers = {"ngram": NgramDrafter(min_n=1, max_n=4), "reflow": NgramDrafter(min_n=1, max_n=1)}
    agreed = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3]
    alone = [7, 8, 9, 70, 71, 1, 8, 9, 60, 61, 2, 9, 50, 51, 3, 7, 8, 9]
    assert plan(policy, alone, helpers=helpers).drafter == "none"
    chosen = plan(policy, agreed, helpers=helpers)
    assert chosen.drafter in ("ngram", "reflow") and chosen.gamma >= 2
    before = stats.lookup["ngram"].seen.copy()
    policy.observe(
        StepOutcome(
            chosen.drafter, 2, 2, Draft(tokens=[4, 5]), verify_s=0.18, overhead_s=0.0, new_tokens=[4, 5, 6]
        )
    )
    grown = stats.lookup["ngram"].seen - before
    assert grown[1].sum() > 0  # the agreed proposal's tokens were judged as agreed ones


def test_fixed_gamma_is_respected_and_zero_means_plain():
    stats = AcceptanceStats(model=0.99)
    flat = {1: 40, 17: 44}
    policy = AdaptivePolicy(costs(flat, 2), ("model",), gamma_cap=16, fixed_gamma=3, stats=stats)
    assert (plan(policy, NOVEL).drafter, plan(policy, NOVEL).gamma) == ("model", 3)
    policy = AdaptivePolicy(costs(flat, 2), ("model",), gamma_cap=16, fixed_gamma=0, stats=stats)
    assert plan(policy, NOVEL).drafter == "none"


def test_early_stop_on_low_draft_confidence():
    flat = {1: 40, 2: 41, 5: 43, 9: 46, 17: 50}
    stats = AcceptanceStats(model=0.9)
    stats.model_by_confidence[:] = np.linspace(0.0, 1.0, len(stats.model_by_confidence))
    policy = AdaptivePolicy(costs(flat, draft_ms=10), ("model",), gamma_cap=16, stats=stats)
    chosen = plan(policy, NOVEL)
    assert chosen.drafter == "model" and chosen.keep_going is not None
    assert all(chosen.keep_going(i, 0.99) for i in range(4))  # confident drafts continue
    assert not chosen.keep_going(4, 0.02)  # a draft the calibration says fails stops here


def test_reacts_within_a_few_steps_when_text_turns_repetitive_and_back():
    """Counterfactual scoring of n-gram proposals moves the controller to n-grams once the
    target starts copying, and back to plain decoding once the copy ends."""
    policy = AdaptivePolicy(costs(CPU_TARGET, draft_ms=22), ("ngram",), gamma_cap=16)
    source = list(range(300, 340))
    context = [*source, 1]
    # The target starts repeating `source`: every step commits the next copied token.
    chosen_per_step = []
    for i in range(12):
        chosen = plan(policy, context)
        new = source[i : i + 1] if chosen.drafter == "none" else source[i : i + chosen.gamma + 1]
        outcome_gamma = 0 if chosen.drafter == "none" else chosen.gamma
        policy.observe(
            StepOutcome(chosen.drafter, outcome_gamma, outcome_gamma, Draft(tokens=[]), 0.04, 0.0, new)
        )
        context = context + new
        chosen_per_step.append(chosen.drafter)
        if len(context) > len(source) * 2:
            break
    assert "ngram" in chosen_per_step[:8], chosen_per_step  # at most 8 tokens into the copy
    # Novel text: proposals keep failing; within a few steps plain decoding is back.
    novel = iter(range(1000, 2000))
    chosen_per_step = []
    for _ in range(8):
        chosen = plan(policy, context)
        token = next(novel)
        policy.observe(StepOutcome(chosen.drafter, chosen.gamma if chosen.drafter != "none" else 0, 0,
                                   Draft(tokens=[]), 0.04, 0.0, [token]))  # fmt: skip
        context = [*context, token]
        chosen_per_step.append(chosen.drafter)
    assert chosen_per_step[-3:] == ["none"] * 3, chosen_per_step


class CountingNgram(NgramDrafter):
    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    def lookup(self, context, max_tokens):
        self.lookups += 1
        return super().lookup(context, max_tokens)


def steps_on_novel_text(policy: AdaptivePolicy, helpers: dict, steps: int, start: int = 1000) -> list[str]:
    """Plan and commit ``steps`` plain tokens of text that never repeats."""
    context, chosen = list(NOVEL), []
    for token in range(start, start + steps):
        step = plan(policy, context, helpers=helpers)
        chosen.append(step.reason)
        gamma = step.gamma if step.drafter != "none" else 0
        policy.observe(StepOutcome(step.drafter, gamma, 0, Draft(tokens=[]), 0.04, 0.0, [token]))
        context.append(token)
    return chosen


def test_where_nothing_comes_near_paying_the_controller_looks_less_often_but_keeps_looking():
    """On a steep CPU curve, over text that never repeats, no lookup comes near plain
    decoding's rate and the draft model cannot pay even at its best: planning (most of
    the controller's own time) is skipped for 1, 2, 4, then at most _MAX_IDLE steps at a
    time, and a copy that starts is found within that many tokens."""
    ngram = CountingNgram()
    helpers = {"ngram": ngram, "model": FakeModelDrafter()}
    policy = AdaptivePolicy(costs(CPU_TARGET, draft_ms=22), ("ngram", "model"), gamma_cap=16)
    reasons = steps_on_novel_text(policy, helpers, 60)
    idle = [r == "idle" for r in reasons]
    assert sum(idle) > 40, reasons  # most steps skip planning ...
    assert ngram.lookups == 60 - sum(idle)  # ... and skip the lookups with it
    longest = max(len(list(run)) for is_idle, run in itertools.groupby(idle) if is_idle)
    assert longest == controller._MAX_IDLE  # ... but never for long
    # The text turns into a copy of what came before: the first proposal looked at is
    # judged right twice in a row, every step is planned again, and the copy is drafted.
    source = list(range(1000, 1060))
    context = [*NOVEL, *source, *source[:3]]
    at, reasons, drafters_chosen = 3, [], []
    while at < 40:
        step = plan(policy, context, helpers=helpers)
        reasons.append(step.reason)
        drafters_chosen.append(step.drafter)
        gamma = step.gamma if step.drafter != "none" else 0
        new = source[at : at + gamma + 1]
        policy.observe(StepOutcome(step.drafter, gamma, gamma, Draft(tokens=[]), 0.04, 0.0, new))
        context, at = context + new, at + len(new)
    first_look = next(i for i, reason in enumerate(reasons) if reason != "idle")
    assert first_look <= controller._MAX_IDLE, reasons
    assert "idle" not in reasons[first_look + 2 :], reasons  # two tokens of its proposal hold
    first_copy = drafters_chosen.index("ngram")
    assert first_copy <= first_look + 8, drafters_chosen
    assert set(drafters_chosen[first_copy:]) == {"ngram"}, drafters_chosen


def test_where_the_draft_model_could_pay_the_controller_never_stops_looking():
    """The F16 stand-in on the AVX-512 EPYC: verifying 2 tokens costs 1.7x one, so no
    lookup comes near paying over text that never repeats, but a cheap draft's best case
    beats plain decoding: every step is planned (trials of the draft are decided there)."""
    helpers = {"ngram": CountingNgram(), "model": FakeModelDrafter()}
    epyc_f16 = {1: 78, 2: 132, 5: 159, 9: 232, 17: 382}
    policy = AdaptivePolicy(costs(epyc_f16, draft_ms=23), ("ngram", "model"), gamma_cap=16)
    reasons = steps_on_novel_text(policy, helpers, 40)
    assert "idle" not in reasons


class FrozenCurve(CostCurve):
    """A cost curve that never learns: a profile that is wrong and stays wrong, so that
    only the controller's own check of what its steps realized can save it."""

    def observe(self, k: int, seconds: float, *, repeated: bool = False) -> None:
        pass


def frozen(target_ms: dict[int, float], draft_ms: float) -> CostModel:
    return costs(target_ms, draft_ms, curve=FrozenCurve)


def test_an_option_whose_steps_realize_less_than_plain_decoding_is_dropped_and_taken_back():
    """The profile says verifying 17 tokens costs 48 ms (a GPU); the steps really take 2 s
    each (it is wrong). Within a few steps the controller stops choosing n-grams; once
    proposals judged for free are right again, it takes them back, and keeps them while
    their steps realize what they should."""
    flat = {1: 40, 2: 41, 5: 42, 9: 44, 17: 48}
    stats = AcceptanceStats()
    stats.lookup["ngram"].hits[:] = stats.lookup["ngram"].seen[:] = 50.0  # copies have held so far
    policy = AdaptivePolicy(frozen(flat, draft_ms=2), ("ngram",), gamma_cap=16, stats=stats)
    source = list(range(300, 400))
    context = [*source, 1, *source[:4]]
    at = 4  # the next source token the answer copies
    chosen = []
    for _ in range(8):
        step = plan(policy, context)
        chosen.append(step.drafter)
        gamma = step.gamma if step.drafter != "none" else 0
        new = source[at : at + gamma + 1]  # every draft is right: only the time is wrong
        seconds = 2.0 if gamma else 0.04
        policy.observe(StepOutcome(step.drafter, gamma, gamma, Draft(tokens=[]), seconds, 0.0, new))
        context, at = context + new, at + len(new)
    assert chosen[0] == "ngram"
    assert "none" in chosen[:4], chosen  # the losing option is dropped within a few steps
    assert chosen[-3:] == ["none"] * 3, chosen
    # The evidence changes: its steps now take what the profile says. Proposals judged for
    # free against the committed text confirm the copy holds, and n-grams come back.
    chosen = []
    for _ in range(12):
        step = plan(policy, context)
        chosen.append(step.drafter)
        gamma = step.gamma if step.drafter != "none" else 0
        new = source[at : at + gamma + 1]
        policy.observe(StepOutcome(step.drafter, gamma, gamma, Draft(tokens=[]), 0.048, 0.0, new))
        context, at = context + new, at + len(new)
    assert chosen[-3:] == ["ngram"] * 3, chosen


def test_a_few_unlucky_draft_model_steps_are_not_taken_for_a_wrong_price():
    """At 60 % acceptance a draft-model step of γ = 2 makes 1, 2 or 3 tokens and pays 1.2×
    where verification is nearly flat. Three steps that made 3, 1 and 1 tokens realized
    less than plain decoding by luck, with every step costing what it was priced: no ban.
    Steps that really cost three times their price are banned within a few steps."""
    policy = AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16, stats=AcceptanceStats())
    draft = Draft(tokens=[0, 0], confidences=[0.9, 0.9], seconds=0.074, decodes=[(1, 0.037), (1, 0.037)])
    for accepted in (2, 0, 0):
        policy.observe(StepOutcome("model", 2, accepted, draft, 0.161, 0.0, [0] * (accepted + 1)))
    plain = 1 / 0.143
    assert policy.realized.rate("model") < 0.98 * plain  # below plain decoding, by luck
    assert not policy.banned("model")
    for _ in range(3):
        policy.observe(StepOutcome("model", 2, 1, draft, 0.161 + 0.47, 0.0, [0, 0]))
    assert policy.banned("model")


def test_trials_of_the_draft_model_do_not_count_in_what_its_chosen_steps_realize():
    """A trial drafts four tokens with no early stop, to learn the draft's acceptance: where
    that is low its steps make fewer tokens a second than plain decoding, as they were
    bound to. That is not evidence that the draft's chosen steps cost more than priced:
    the trials leave no realized rate and no ban behind."""
    policy = AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16, stats=AcceptanceStats(model=0.3))
    helpers = {"model": FakeModelDrafter()}
    trials = 0
    for _ in range(12):
        step = plan(policy, NOVEL, helpers=helpers)
        if step.drafter == "model":
            trials += 1
            accepted = trials % 2  # 0, 1, 0: a draft that rarely pays
            draft = Draft(tokens=[0] * step.gamma, confidences=[0.5] * step.gamma, seconds=0.037 * step.gamma)
            new = [0] * (accepted + 1)
            policy.observe(StepOutcome("model", step.gamma, accepted, draft, 0.193, 0.0, new))
        else:
            policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    assert trials >= 3
    assert policy.realized.rate("model") is None
    assert not policy.banned("model")


def f16_costs() -> CostModel:
    """The F16 stand-in's shape, with the draft's largest batch measured as a profile does:
    17 tokens in one decode cost about 4 single ones, so reading a prompt is cheap per token."""
    model = costs(F16_TARGET, draft_ms=37)
    model.draft.set(17, 4 * 0.037)
    return model


class CatchingUpDraft(FakeModelDrafter):
    """The draft model's cache: the whole prompt behind before its first draft."""

    def catch_up_cost_tokens(self, context):
        return self.behind


def test_the_draft_model_is_found_where_it_pays():
    """Verification nearly flat and a cheap draft (the F16 stand-in for a GPU) with a prior
    that says the draft barely pays, and 600 prompt tokens the draft has not seen: the
    controller tries the model within the first steps, learns its real acceptance, and
    keeps it."""
    stats = AcceptanceStats()  # prior: 60 % per token
    policy = AdaptivePolicy(f16_costs(), ("ngram", "model"), gamma_cap=16, stats=stats)
    model = CatchingUpDraft(behind=600)
    helpers = {"ngram": NgramDrafter(), "model": model}
    chosen = []
    for _ in range(10):
        step = plan(policy, NOVEL, helpers=helpers)
        chosen.append(step.drafter)
        if step.drafter == "model":
            model.behind = 1  # caught up
            gamma = min(step.gamma, 4)
            draft = Draft(tokens=[0] * gamma, confidences=[0.9] * gamma, seconds=0.037 * gamma)
            policy.observe(StepOutcome("model", gamma, gamma, draft, 0.182, 0.0, [0] * (gamma + 1)))
        else:
            policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    assert "model" in chosen[:3], chosen
    assert chosen[-4:] == ["model"] * 4, chosen


def test_a_long_prompt_for_a_short_answer_is_not_worth_a_trial():
    """A trial reads the whole prompt into the draft, paid whether the draft turns out to
    pay or not: 600 unseen prompt tokens are worth it for a long answer, not for one of 64
    tokens; a draft that has read the prompt is tried on the short answer too."""

    def first_steps(behind: int, remaining: int) -> list[str]:
        policy = AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16)
        helpers = {"model": CatchingUpDraft(behind=behind)}
        chosen = []
        for _ in range(4):
            chosen.append(plan(policy, NOVEL, helpers=helpers, remaining=remaining).drafter)
            policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
        return chosen

    assert "model" in first_steps(behind=600, remaining=256)
    assert "model" not in first_steps(behind=600, remaining=64)
    assert "model" in first_steps(behind=1, remaining=64)


def trial_steps(policy: AdaptivePolicy, accepted: int, steps: int = 300) -> list[int]:
    """The steps at which ``policy`` tries the draft model, every draft of which has its
    first ``accepted`` tokens accepted; the other steps decode plainly."""
    helpers = {"model": CatchingUpDraft(behind=1)}
    trials = []
    for step in range(steps):
        plan_ = plan(policy, NOVEL, helpers=helpers)
        if plan_.drafter == "model":
            trials.append(step)
            ok = min(accepted, plan_.gamma)
            draft = Draft(tokens=[0] * plan_.gamma, confidences=[0.9] * plan_.gamma, seconds=0.15)
            policy.observe(StepOutcome("model", plan_.gamma, ok, draft, 0.182, 0.0, [0] * (ok + 1)))
        else:
            policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    return trials


def test_trials_of_a_draft_that_keeps_failing_grow_rarer(monkeypatch):
    """Every try pays a catch-up: after drafts that all failed (a trial, or steps that
    earned a ban), the next try waits twice as long, up to a limit. (The early trials are
    behind: three failures there would bring the wait to its limit at once. And the bound
    that the draft's own failures set on its best case is lifted here: it would stop the
    trials altogether, see the next test.)"""
    monkeypatch.setattr(controller, "_TRIAL_DOUBT", 100.0)
    stats = AcceptanceStats(model_steps=_EARLY_TRIALS)
    policy = AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16, stats=stats)
    trials = trial_steps(policy, accepted=0)
    gaps = np.diff(trials)
    later = gaps[gaps > 1]  # the gaps after the first trials in a row
    assert len(later) >= 3, trials
    assert all(b >= min(2 * a, _MAX_EXPLORE_EVERY) - 1 for a, b in itertools.pairwise(later)), trials
    assert later[-1] >= _MAX_EXPLORE_EVERY - 1, trials


def test_a_draft_that_failed_its_trials_in_this_answer_is_not_tried_again_in_it():
    """Once the draft has drafted in this answer, its best case is bounded by what it
    showed: a draft whose every trial fails is given up after a couple of tries (each
    costs a catch-up and a step verified at a loss), while one that gets a token or two
    right (near break-even on this curve) goes on being tried, and a new answer tries the
    draft again."""
    stats = AcceptanceStats(model_steps=_EARLY_TRIALS)
    failing = trial_steps(AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16, stats=stats), accepted=0)
    assert 1 <= len(failing) <= 2, failing
    stats = AcceptanceStats(model_steps=_EARLY_TRIALS)
    partly = trial_steps(AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16, stats=stats), accepted=1)
    assert len(partly) >= 8, partly
    # the next answer, with the failing draft's statistics: tried once more
    stats = AcceptanceStats(model_steps=_EARLY_TRIALS)
    trial_steps(AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16, stats=stats), accepted=0)
    again = trial_steps(
        AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16, stats=stats), accepted=0, steps=40
    )
    assert len(again) >= 1, again


def test_the_draft_models_record_from_earlier_answers_is_a_weak_prior_for_a_new_one():
    """A draft that failed all through the last answer (a translation) and drafts four
    right tokens in the first step of this one (a sum) is judged mostly on this answer:
    within one step it is back near its prior, where the old record alone would keep it far
    below break-even."""
    stats = AcceptanceStats()
    for _ in range(30):
        stats.observe_model([0.5] * 4, 0)
    assert stats.model < 0.1
    AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16, stats=stats)  # a new answer
    stats.observe_model([0.5] * 4, 4)
    assert stats.model > 0.45, stats.model


def test_the_draft_model_does_not_read_the_prompt_in_an_answers_first_steps():
    """An answer that copies its prompt shows it within a few tokens, and the lookups then
    beat a draft that has paid to read the prompt: however well the draft did before, it is
    not sent to read a new prompt before the answer has settled, and is right after."""
    stats = AcceptanceStats(model=0.95, model_steps=10)  # it paid on the last answers
    policy = AdaptivePolicy(f16_costs(), ("ngram", "model"), gamma_cap=16, stats=stats)
    helpers = {"ngram": NgramDrafter(), "model": CatchingUpDraft(behind=300)}
    chosen = []
    for _ in range(_SETTLE_STEPS + 1):
        chosen.append(plan(policy, NOVEL, helpers=helpers).drafter)
        policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    assert chosen == ["none"] * (_SETTLE_STEPS - 1) + ["model"] * 2, chosen


def test_every_answer_tries_the_draft_model_once():
    """The draft's acceptance carried over from the last answer says little about this
    one (a translation after a chat): each answer tries it once, early, where its best case
    could pay, and keeps to plain decoding after a failed trial."""
    stats = AcceptanceStats(model=0.3, model_steps=10)  # the last answer's drafts failed
    for _ in range(2):  # two answers, one loaded pair
        policy = AdaptivePolicy(f16_costs(), ("model",), gamma_cap=16, stats=stats)
        helpers = {"model": CatchingUpDraft(behind=1)}
        chosen = []
        for _ in range(_SETTLE_STEPS + 6):
            step = plan(policy, NOVEL, helpers=helpers)
            chosen.append(step.drafter)
            if step.drafter == "model":
                draft = Draft(tokens=[0] * step.gamma, confidences=[0.9] * step.gamma, seconds=0.15)
                policy.observe(StepOutcome("model", step.gamma, 0, draft, 0.182, 0.0, [0]))
            else:
                policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
        assert chosen.count("model") == 1 and chosen.index("model") == _SETTLE_STEPS - 1, chosen


def test_a_draft_model_trial_drafts_four_tokens_without_an_early_stop():
    """A calibration that says less confident tokens fail would cut every draft after its
    first token and never learn otherwise: the trial drafts γ = 4 whole."""
    stats = AcceptanceStats(model=0.3)  # the prior says the draft rarely pays
    stats.model_by_confidence[:] = 0.05  # ... and that no token would be accepted
    policy = AdaptivePolicy(costs(F16_TARGET, draft_ms=37), ("model",), gamma_cap=16, stats=stats)
    helpers = {"model": CatchingUpDraft(behind=1)}
    plans = []
    for _ in range(3):
        step = plan(policy, NOVEL, helpers=helpers)
        plans.append(step)
        policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    trials = [p for p in plans if p.drafter == "model"]
    assert trials, [p.drafter for p in plans]
    assert all(p.gamma == 4 and p.keep_going is None for p in trials)


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


def test_cpu_costs_keep_the_draft_model_untried():
    """Where even its best case cannot pay (a steep CPU curve, a dear draft), exploring it
    would only cost time: it is not tried."""
    policy = AdaptivePolicy(costs(CPU_TARGET, draft_ms=22), ("ngram", "model"), gamma_cap=16)
    helpers = {"ngram": NgramDrafter(), "model": CatchingUpDraft(behind=600)}
    chosen = []
    for _ in range(30):
        step = plan(policy, NOVEL, helpers=helpers)
        chosen.append(step.drafter)
        policy.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.04, 0.0, [0]))
    assert set(chosen) == {"none"}, chosen


def test_cost_curve_interpolates_and_learns():
    curve = CostCurve(33)
    assert np.isnan(curve.estimate(3))
    curve.set(1, 0.04)
    assert curve.estimate(4) == pytest.approx(0.16)  # one point: proportional
    curve.set(5, 0.2)
    assert curve.estimate(3) == pytest.approx(0.12)
    assert curve.estimate(9) == pytest.approx(0.36)  # extrapolated along the last segment
    curve.observe(5, 0.3)
    assert 0.2 < curve.estimate(5) < 0.3


def test_a_size_seen_online_beside_the_last_does_not_make_long_catch_ups_dear():
    """The draft's profile has 1, 2, 4 and 65 tokens; a catch-up of 64 seen online, a little
    cheaper than the profile's 65, must not turn the extrapolation for a 300-token prompt
    into the slope between 64 and 65 (which priced a prompt at 15 s instead of 3)."""
    curve = CostCurve(65)
    for k, seconds in {1: 0.031, 2: 0.046, 4: 0.070, 65: 0.684}.items():
        curve.set(k, seconds)
    curve.observe(64, 0.55)
    assert curve.estimate(65) == pytest.approx(0.684, rel=0.05)
    assert curve.estimate(300) <= curve.estimate(65) / 65 * 300 * 1.01
    assert curve.estimate(300) > curve.estimate(65)


def test_a_machine_that_slows_down_does_not_make_drafting_look_cheap():
    """Only single-token passes are observed while the machine runs 3× slower: every batch
    size must be re-priced alike, so plain decoding stays the choice."""
    model = costs(CPU_TARGET, draft_ms=22)
    policy = AdaptivePolicy(model, ("model",), gamma_cap=8)
    policy.stats.model = 0.6  # the draft is right 60 % of the time, as measured here
    ratio_before = model.target.estimate(5) / model.target.estimate(1)
    for _ in range(20):
        model.target.observe(1, 3 * CPU_TARGET[1] / 1000)
    assert model.target.estimate(1) == pytest.approx(3 * CPU_TARGET[1] / 1000, rel=0.05)
    assert model.target.estimate(5) / model.target.estimate(1) == pytest.approx(ratio_before, rel=0.05)
    assert plan(policy, [1, 2, 3]).drafter == "none"


def test_batches_dearer_than_the_profile_reprice_every_batch_size():
    """Answers pay 40 % more than the profile for 5-token passes while single tokens cost
    what it says: sizes never verified must be re-priced too (not one size at a time), and
    a single token must not be."""
    curve = CostCurve(17)
    for k, ms in CPU_TARGET.items():
        curve.set(k, ms / 1000)
    curve.freeze_baseline()
    for _ in range(12):
        curve.observe(5, 1.4 * CPU_TARGET[5] / 1000)
        curve.observe(1, CPU_TARGET[1] / 1000)
    assert curve.estimate(5) == pytest.approx(1.4 * CPU_TARGET[5] / 1000, rel=0.1)
    assert curve.estimate(1) == pytest.approx(CPU_TARGET[1] / 1000, rel=0.05)
    for k in (2, 9, 17):  # never observed
        assert curve.estimate(k) > 1.15 * CPU_TARGET[k] / 1000, k
    # and the factor is learned back when batches turn cheap again
    for _ in range(60):
        curve.observe(5, CPU_TARGET[5] / 1000)
        curve.observe(1, CPU_TARGET[1] / 1000)
    assert curve.estimate(9) == pytest.approx(CPU_TARGET[9] / 1000, rel=0.05)


def test_repeated_passes_cheaper_than_the_profile_do_not_make_it_stale():
    """On a GPU a pass after another of the same size reuses llama.cpp's graph and costs
    less than the profile, which times every size after plain steps. Runs of equal drafts
    still teach the estimates, but only passes after another size can show that the
    profile's shape is wrong."""

    def answer(repeated: bool) -> CostCurve:
        curve = CostCurve(17)
        for k, ms in CPU_TARGET.items():
            curve.set(k, ms / 1000)
        curve.freeze_baseline()
        for _ in range(12):
            curve.observe(1, CPU_TARGET[1] / 1000)
            curve.observe(5, 0.5 * CPU_TARGET[5] / 1000, repeated=repeated)
        return curve

    assert answer(repeated=False).disagrees() == [5]
    repeated = answer(repeated=True)
    assert repeated.disagrees() == []
    assert repeated.estimate(5) < 0.75 * CPU_TARGET[5] / 1000  # learned all the same


# -- the cost profile, measured on a real model -------------------------------------------


def quiet_machine() -> None:
    """The busy probe for tests: other tests' processes must not make these flaky."""
    return None


@pytest.fixture()
def smol(smol_path, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    small = EdgeSpec(str(smol_path), None, RuntimeOptions(n_ctx=160, max_gamma=5), quiet=True)
    yield small
    small.close()


def test_warm_up_measures_every_size_once_and_the_profile_keeps_what_others_measured(smol):
    costs = load_or_measure(smol.target, None, 4, quiet=True, busy=quiet_machine)
    assert all(costs.target.measured(k) for k in range(1, 5))  # every verification size
    path = costs.profile_path
    assert path is not None and set(json.loads(path.read_text())["target"]) == {"1", "2", "3", "4"}

    # A larger γ measures only what the profile lacks ... (from a settled profile: a tiny
    # model's passes take a few ms, and jitter can make a measurement implausible twice,
    # which keeps it provisional, to be measured anew at the next load, as it should)
    data = json.loads(path.read_text())
    data["target"] = {str(k): v for k, v in enumerate(sorted(data["target"].values()), start=1)}
    data["provisional"] = False
    path.write_text(json.dumps(data))
    stored = data["target"]
    costs = load_or_measure(smol.target, None, 6, quiet=True, busy=quiet_machine)
    assert costs.target.estimate(2) == pytest.approx(stored["2"])  # loaded, not re-measured
    assert set(json.loads(path.read_text())["target"]) == {str(k) for k in range(1, 7)}

    # ... and a smaller one neither re-measures nor forgets the larger sizes.
    before = path.read_text()
    load_or_measure(smol.target, None, 3, quiet=True, busy=quiet_machine)
    assert path.read_text() == before


def test_each_size_is_timed_right_after_single_token_passes(smol, monkeypatch):
    """As a step follows plain steps. On a GPU a pass after others of another shape costs
    more (llama.cpp rebuilds its graph): timed after a 4-token pass, a single token cost
    50 % more on an H200 than in every answer, which then marked the profile stale."""
    calls: list[tuple[int, int] | str] = []
    model = smol.target
    decode, reset = model.decode, model.reset
    monkeypatch.setattr(
        model, "decode", lambda tokens, n=1: (calls.append((len(tokens), n)), decode(tokens, n))[1]
    )
    monkeypatch.setattr(model, "reset", lambda: (calls.append("reset"), reset())[1])
    load_or_measure(model, None, 4, quiet=True, busy=quiet_machine)
    runs, run = [], []
    for call in [*calls, "reset"]:
        if call == "reset":
            if len(run) >= 2:
                runs.append(run)
            run = []
        else:
            run.append(call)
    timed = {run[-1][0] for run in runs}
    assert timed == {1, 2, 3, 4}  # every verification size ...
    assert all(run[-3:-1] == [(1, 1), (1, 1)] for run in runs)  # ... right after two single tokens


def test_the_profile_is_keyed_by_machine_build_and_exact_files(smol):
    facts = profile_facts(smol.target, None)
    assert {"cpu", "isa", "cores", "llama.cpp", "target", "draft"} <= set(facts)
    # two hosts a VM names alike ("AMD EPYC") but with other instruction sets keep apart
    other = facts | {"isa": "avx avx2" if facts["isa"] != "avx avx2" else "avx avx2 avx512f"}
    assert profile_path_for(other, "t", None) != profile_path_for(facts, "t", None)
    assert facts["cpu"] and facts["llama.cpp"].startswith(llama_cpp_version())
    assert smol.target.name in profile_path(smol.target, None).name


def llama_cpp_version() -> str:
    import llama_cpp

    return llama_cpp.__version__


def test_a_gpu_profile_is_plausible_and_a_falling_one_is_not():
    """Costs measured on an H200 (ms): after single tokens, 2 tokens cost 2.75 single ones."""
    assert implausible({1: 1.81, 2: 4.98, 3: 5.0, 5: 4.22, 9: 5.33, 17: 5.85}) is None
    assert implausible({1: 57.0, 2: 100.0, 3: 131.0, 4: 30.0}) == "4 tokens priced at 0.23× of 3 tokens"


@pytest.mark.parametrize(
    "damage",
    ["corrupt", "implausible", "stale", "older version"],
)
def test_a_bad_profile_is_detected_and_measured_again(smol, damage, capsys):
    costs = load_or_measure(smol.target, None, 4, quiet=True, busy=quiet_machine)
    path = costs.profile_path
    data = json.loads(path.read_text())
    if damage == "corrupt":
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
    elif damage == "implausible":
        data["target"]["4"] = data["target"]["3"] / 10  # cost falling as tokens grow
        path.write_text(json.dumps(data))
    elif damage == "stale":
        data["stale"] = True
        path.write_text(json.dumps(data))
    else:
        data["version"] = 1
        path.write_text(json.dumps(data))
    costs = load_or_measure(smol.target, None, 4, busy=quiet_machine)
    warning = [line for line in capsys.readouterr().err.splitlines() if "cost profile" in line]
    assert len(warning) == 1 and "measuring again" in warning[0], warning
    fresh = json.loads(path.read_text())
    # Measured anew: plausible, or (on a machine too disturbed to measure) kept provisional,
    # which makes the next load measure it again.
    assert fresh["provisional"] or implausible({int(k): v for k, v in fresh["target"].items()}) is None
    assert not fresh["stale"] and set(fresh["target"]) == {"1", "2", "3", "4"}


def test_a_profile_measured_on_a_busy_machine_is_provisional(smol, capsys):
    costs = load_or_measure(smol.target, None, 3, busy=lambda: 1.5)
    assert costs.provisional and "busy" in capsys.readouterr().err
    path = costs.profile_path
    assert json.loads(path.read_text())["provisional"] is True
    # Still busy at the next load: the provisional figures are kept, not re-measured.
    before = path.read_text()
    load_or_measure(smol.target, None, 3, quiet=True, busy=lambda: 1.5)
    assert path.read_text() == before
    # Quiet now: measured again, and no longer provisional.
    load_or_measure(smol.target, None, 3, quiet=True, busy=quiet_machine)
    assert json.loads(path.read_text())["provisional"] is False


def test_costs_seen_online_that_disagree_with_the_shape_mark_the_profile_stale(smol):
    state = ControllerState(load_or_measure(smol.target, None, 4, quiet=True, busy=quiet_machine), None)
    curve = state.costs.target
    one = curve.estimate(1)
    assert state.check_costs() == []
    for _ in range(12):  # 4-token passes keep costing 3× what the profile's shape says
        curve.observe(1, one)
        curve.observe(4, 3 * curve.estimate(4))
    assert 4 in state.check_costs()
    assert json.loads(state.costs.profile_path.read_text())["stale"] is True


WRITER = """
import sys
from pathlib import Path
from edgespec.decoding.costs import write_atomically
path, tag = Path(sys.argv[1]), sys.argv[2]
for i in range(300):
    write_atomically(path, '{"writer": "%s", "i": %d, "pad": "%s"}' % (tag, i, "x" * 20000))
"""


def test_two_processes_writing_a_profile_at_once_leave_a_valid_file(tmp_path):
    path = tmp_path / "costs" / "profile.json"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), tag]) for tag in ("a", "b")]
    seen = set()
    while any(w.poll() is None for w in writers):
        if path.exists():
            seen.add(json.loads(path.read_text())["writer"])  # never half written
    assert all(w.wait() == 0 for w in writers)
    assert json.loads(path.read_text())["i"] == 299
    assert not list(path.parent.glob("*.tmp")), "no temporary file may be left behind"


def test_drafts_stop_at_a_source_boundary_where_answers_keep_leaving_it():
    """Token 0 ends a sentence. Copies of a source have held for long (a long match),
    but the answer has left the source after every sentence end so far (a bullet
    summary): the draft stops at the boundary. Where the answer has gone on past them
    (an edit copying line after line), the draft runs through."""
    source = [*range(500, 510), 0, *range(510, 530)]
    context = [*source, 1, *source[:6]]

    def drafted(crossing_hits: float) -> int:
        flat = {1: 40, 2: 42, 5: 46, 9: 52, 17: 64}
        policy = AdaptivePolicy(costs(flat, draft_ms=2), ("ngram",), gamma_cap=16)
        ngram = policy.stats.lookup["ngram"]  # this answer's evidence so far
        ngram.hits[:] = ngram.seen[:] = 50.0
        ngram.cross_hits, ngram.cross_seen = crossing_hits, 10.0

        def boundaries(tokens: list[int]) -> list[int]:
            return [UNIT_END if t == 0 else 0 for t in tokens]

        view = StepView(context, 16, GREEDY, {"ngram": NgramDrafter()}, 256, boundaries)
        return policy.plan(view).gamma

    assert drafted(0.0) <= 5  # up to the sentence end, not past it
    assert drafted(10.0) >= 12


def test_a_return_to_the_draft_model_is_priced_with_its_catch_up():
    """The draft's first catch-up in an answer is its prompt prefill, paid once: priced by
    the share of the answer a step makes. A later catch-up (the draft coming back after
    steps of other options) is paid again at every return: priced over the few steps a
    return lasts. Neither counts against what the draft's steps realize: a return after a
    ban must not make the draft look worse and earn it a longer ban."""
    stats = AcceptanceStats(model=0.8)
    policy = AdaptivePolicy(costs(F16_TARGET, draft_ms=37), ("model",), gamma_cap=16, stats=stats)
    model = CatchingUpDraft(behind=40)
    helpers = {"model": model}
    view = StepView(NOVEL, 16, GREEDY, helpers, remaining=256)

    def model_step(catch_up_s: float) -> None:
        decodes = [(40, catch_up_s), (1, 0.037), (1, 0.037), (1, 0.037)]
        draft = Draft(tokens=[0] * 4, confidences=[0.9] * 4, seconds=catch_up_s + 0.111, decodes=decodes)
        policy.observe(StepOutcome("model", 4, 4, draft, 0.182, 0.0, [0] * 5))

    first = model_price(policy, view)
    model_step(0.6)  # the prompt prefill: 5 tokens in 0.29 s without it
    back = model_price(policy, view)
    assert back - first > 0.1  # (0.6 s − one draft token) over 4 steps, not over the answer
    for _ in range(2):
        model_step(0.6)  # every step follows a return, and pays 0.6 s to catch up
    assert policy.realized.rate("model") == pytest.approx(5 / 0.293)


def test_an_answer_that_copies_shares_the_draft_prefill_among_few_steps():
    """The draft's prompt prefill is paid once and shared by the steps the answer has left:
    after steps that each copied nine tokens there are few of them, and the draft model
    is priced dearer than at the start of the answer."""
    stats = AcceptanceStats(model=0.8)
    policy = AdaptivePolicy(
        costs(F16_TARGET, draft_ms=37), ("model",), gamma_cap=16, fixed_gamma=4, stats=stats
    )
    helpers = {"model": CatchingUpDraft(behind=400)}
    view = StepView(NOVEL, 16, GREEDY, helpers, remaining=256)

    before = model_price(policy, view)
    for _ in range(3):
        policy.observe(StepOutcome("ngram", 8, 8, Draft(tokens=[0] * 8), 0.25, 0.0, [0] * 9))
    prefill = 400 * 0.037  # the draft curve holds one point: 37 ms a token
    steps_left = (256 / 9, 256 / expected_tokens(np.full(4, 0.6))[-1])
    assert model_price(policy, view) - before == pytest.approx(
        prefill / steps_left[0] - prefill / steps_left[1], rel=0.05
    )

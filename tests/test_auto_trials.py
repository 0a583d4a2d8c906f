"""The controller's trials of the draft model (edgespec.decoding.auto.policy), on synthetic
costs: a draft whose acceptance cannot be judged without drafting is tried where its best
case could pay, found where it pays, and left alone where it cannot."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from synthetic_costs import (
    CPU_TARGET,
    F16_TARGET,
    LONG_ANSWER,
    NOVEL,
    acceptance_stats,
    costs,
    f16_costs,
    plan,
    policy,
)

from edgespec.decoding.auto import DEFAULT, AdaptivePolicy, PairState
from edgespec.decoding.drafters import Draft, NgramDrafter
from edgespec.decoding.policy import StepOutcome

EARLY_TRIALS = DEFAULT.early_trials
SETTLE_STEPS = DEFAULT.settle_steps
MAX_EXPLORE_EVERY = DEFAULT.max_explore_every
# Tests of how trials are scheduled lift the bound on what a trial may risk (tested on its
# own below): it would space the trials by what each answer can repay.
UNBOUNDED = dataclasses.replace(LONG_ANSWER, trial_risk_tokens=10**6)
XEON = {1: 86, 2: 118, 5: 123, 9: 224, 17: 267}  # the AMX Xeon's profile (no-amx build), ms


def test_the_draft_model_is_found_where_it_pays():
    """Verification nearly flat and a cheap draft (the F16 stand-in for a GPU) with a prior
    that says the draft barely pays, and 60 prompt tokens the draft has not seen: the
    controller drafts with the model once the answer has settled (the prior says it may pay
    here), learns its real acceptance, and keeps it. (The prompt is short enough for the
    draft's reading of it to fit what an answer may lose at worst: 30 tokens.)"""
    adaptive = policy(f16_costs(), ("ngram", "model"), stats=acceptance_stats())  # prior: 60 % per token
    lookups = {"ngram": NgramDrafter()}
    behind = 30
    chosen = []
    for _ in range(80):
        step = plan(adaptive, NOVEL, lookups=lookups, catch_up=behind)
        chosen.append(step.drafter)
        if step.drafter == "model":
            behind = 1  # caught up
            gamma = min(step.gamma, 4)
            draft = Draft(tokens=[0] * gamma, confidences=[0.9] * gamma, seconds=0.037 * gamma)
            adaptive.observe(StepOutcome("model", gamma, gamma, draft, 0.182, 0.0, [0] * (gamma + 1)))
        else:
            adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    assert "model" in chosen[:SETTLE_STEPS], chosen
    assert chosen[-4:] == ["model"] * 4, chosen


def test_a_long_prompt_for_a_short_answer_is_not_worth_a_trial():
    """A trial reads the whole prompt into the draft, paid whether the draft turns out to
    pay or not: 600 unseen prompt tokens are worth it for a long answer, not for one of 64
    tokens; a draft that has read the prompt is tried on the short answer too. (With the
    bound on a trial's risk lifted: the bound's own test is below.)"""

    def first_steps(behind: int, remaining: int) -> list[str]:
        adaptive = policy(f16_costs(), ("model",), tuning=UNBOUNDED)
        chosen = []
        for _ in range(4):
            chosen.append(plan(adaptive, NOVEL, lookups={}, catch_up=behind, remaining=remaining).drafter)
            adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
        return chosen

    assert "model" in first_steps(behind=600, remaining=256)
    assert "model" not in first_steps(behind=600, remaining=64)
    assert "model" in first_steps(behind=1, remaining=64)


def first_trial(cost_model, behind: int, steps: int, prior: float | None = None) -> int | None:
    """The step at which a fresh pair first tries its draft model over ``steps`` plain
    steps of an answer (each at the profile's single-token price), or None. ``prior``: the
    draft's acceptance before evidence (0.3: too low to choose it but in a trial)."""
    adaptive = policy(cost_model, ("model",), stats=acceptance_stats(model=prior))
    single = cost_model.target.estimate(1)
    for step in range(steps):
        chosen = plan(adaptive, NOVEL, lookups={}, catch_up=behind, remaining=256)
        if chosen.drafter == "model":
            return step
        adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), single, 0.0, [0]))
    return None


def test_a_trial_risks_only_what_the_answer_can_repay():
    """A one-line question on the AMX Xeon's curve, where a failed trial costs more than
    two plain steps and reading the prompt more again: no trial runs in an answer of up to
    64 tokens (a 23-token answer that tried the draft came back 30 % slower); where the
    draft's best case could pay, the trial waits until the answer can repay its loss, and
    a prompt too long to read for any answer of this length is never read."""
    xeon = costs(XEON, draft_ms=42)
    xeon.draft.set(17, 4 * 0.042)
    trial = first_trial(xeon, behind=30, steps=256)
    assert trial is None or trial > 64, trial
    f16 = f16_costs()
    early = first_trial(f16, behind=1, steps=128, prior=0.3)
    assert early is not None and 16 < early < 80, early
    assert first_trial(f16_costs(), behind=600, steps=128, prior=0.3) is None


def trial_steps(adaptive: AdaptivePolicy, accepted: int, steps: int = 300) -> list[int]:
    """The steps at which ``adaptive`` tries the draft model, every draft of which has its
    first ``accepted`` tokens accepted; the other steps decode plainly."""
    trials = []
    for step in range(steps):
        plan_ = plan(adaptive, NOVEL, lookups={}, catch_up=1)
        if plan_.drafter == "model":
            trials.append(step)
            ok = min(accepted, plan_.gamma)
            draft = Draft(tokens=[0] * plan_.gamma, confidences=[0.9] * plan_.gamma, seconds=0.15)
            adaptive.observe(StepOutcome("model", plan_.gamma, ok, draft, 0.182, 0.0, [0] * (ok + 1)))
        else:
            adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    return trials


def test_trials_of_a_draft_that_keeps_failing_grow_rarer():
    """Every try pays a catch-up: after drafts that all failed (a trial, or steps that
    earned a ban), the next try waits twice as long, up to a limit. (The early trials are
    behind: three failures there would bring the wait to its limit at once. And the bound
    that the draft's own failures set on its best case is lifted here: it would stop the
    trials altogether, see the next test.)"""
    tuning = dataclasses.replace(UNBOUNDED, trial_doubt=100.0)
    stats = acceptance_stats(model_steps=EARLY_TRIALS, tuning=tuning)
    adaptive = policy(f16_costs(), ("model",), stats=stats, tuning=tuning)
    trials = trial_steps(adaptive, accepted=0)
    gaps = np.diff(trials)
    later = gaps[gaps > 1]  # the gaps after the first trials in a row
    assert len(later) >= 3, trials
    assert all(b >= min(2 * a, MAX_EXPLORE_EVERY) - 1 for a, b in itertools.pairwise(later)), trials
    assert later[-1] >= MAX_EXPLORE_EVERY - 1, trials


def test_a_draft_that_failed_its_trials_in_this_answer_is_not_tried_again_in_it():
    """Once the draft has drafted in this answer, its best case is bounded by what it
    showed: a draft whose every trial fails is given up after a couple of tries (each
    costs a catch-up and a step verified at a loss), while one that gets a token or two
    right (near break-even on this curve) goes on being tried, and a new answer tries the
    draft again."""
    stats = acceptance_stats(model_steps=EARLY_TRIALS)
    failing = trial_steps(policy(f16_costs(), ("model",), stats=stats), accepted=0)
    assert 1 <= len(failing) <= 2, failing
    stats = acceptance_stats(model_steps=EARLY_TRIALS)
    partly = trial_steps(policy(f16_costs(), ("model",), stats=stats), accepted=1)
    assert len(partly) >= 8, partly
    # the next answer, with the failing draft's statistics: tried once more
    stats = acceptance_stats(model_steps=EARLY_TRIALS)
    trial_steps(policy(f16_costs(), ("model",), stats=stats), accepted=0)
    again = trial_steps(policy(f16_costs(), ("model",), stats=stats), accepted=0, steps=40)
    assert len(again) >= 1, again


def test_the_draft_model_does_not_read_the_prompt_in_an_answers_first_steps():
    """An answer that copies its prompt shows it within a few tokens, and the lookups then
    beat a draft that has paid to read the prompt: however well the draft did before, it is
    not sent to read a new prompt before the answer has settled, and is right after (where
    reading it fits what the answer may lose at worst)."""
    stats = acceptance_stats(model=0.95, model_steps=10)  # it paid on the last answers
    adaptive = policy(f16_costs(), ("ngram", "model"), stats=stats)
    lookups = {"ngram": NgramDrafter()}
    chosen = []
    for _ in range(SETTLE_STEPS + 1):
        chosen.append(plan(adaptive, NOVEL, lookups=lookups, catch_up=30).drafter)
        adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    assert chosen == ["none"] * (SETTLE_STEPS - 1) + ["model"] * 2, chosen


def test_every_answer_tries_the_draft_model_once():
    """The draft's acceptance carried over from the last answer says little about this
    one (a translation after a chat): each answer tries it once, early, where its best case
    could pay, and keeps to plain decoding after a failed trial."""
    pair = PairState(f16_costs(), UNBOUNDED, acceptance_stats(model=0.3, model_steps=10))  # its drafts failed
    for _ in range(2):  # two answers, one loaded pair
        adaptive = AdaptivePolicy(pair, ("model",), gamma_cap=16)
        adaptive.begin()
        chosen = []
        for _ in range(SETTLE_STEPS + 6):
            step = plan(adaptive, NOVEL, lookups={}, catch_up=1)
            chosen.append(step.drafter)
            if step.drafter == "model":
                draft = Draft(tokens=[0] * step.gamma, confidences=[0.9] * step.gamma, seconds=0.15)
                adaptive.observe(StepOutcome("model", step.gamma, 0, draft, 0.182, 0.0, [0]))
            else:
                adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
        assert chosen.count("model") == 1 and chosen.index("model") == SETTLE_STEPS - 1, chosen


def test_a_draft_model_trial_drafts_four_tokens_without_an_early_stop():
    """A calibration that says less confident tokens fail would cut every draft after its
    first token and never learn otherwise: the trial drafts γ = 4 whole."""
    stats = acceptance_stats(model=0.3)  # the prior says the draft rarely pays
    stats.model_by_confidence[:] = 0.05  # ... and that no token would be accepted
    adaptive = policy(costs(F16_TARGET, draft_ms=37), ("model",), stats=stats, tuning=UNBOUNDED)
    plans = []
    for _ in range(3):
        step = plan(adaptive, NOVEL, lookups={}, catch_up=1)
        plans.append(step)
        adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    trials = [p for p in plans if p.drafter == "model"]
    assert trials, [p.drafter for p in plans]
    assert all(p.gamma == 4 and p.keep_going is None for p in trials)


def test_cpu_costs_keep_the_draft_model_untried():
    """Where even its best case cannot pay (a steep CPU curve, a dear draft), exploring it
    would only cost time: it is not tried."""
    adaptive = policy(costs(CPU_TARGET, draft_ms=22), ("ngram", "model"))
    lookups = {"ngram": NgramDrafter()}
    chosen = []
    for _ in range(30):
        step = plan(adaptive, NOVEL, lookups=lookups, catch_up=600)
        chosen.append(step.drafter)
        adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.04, 0.0, [0]))
    assert set(chosen) == {"none"}, chosen

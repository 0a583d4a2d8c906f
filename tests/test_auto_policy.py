"""The adaptive controller (edgespec.decoding.auto.policy) over steps, on synthetic costs:
how fast it reacts to the text, where it stops looking, how it checks what its steps
realized, and the tuning it is given."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from synthetic_costs import (
    CPU_TARGET,
    FLAT_TARGET,
    H200_TARGET,
    LONG_ANSWER,
    NOVEL,
    acceptance_stats,
    banned,
    costs,
    f16_costs,
    frozen,
    plan,
    policy,
)

from edgespec.decoding.auto import DEFAULT, AdaptivePolicy, PairState
from edgespec.decoding.auto.state import StepScratch
from edgespec.decoding.drafters import Draft, NgramDrafter
from edgespec.decoding.policy import StepOutcome


def test_reacts_within_a_few_steps_when_text_turns_repetitive_and_back():
    """Counterfactual scoring of n-gram proposals moves the controller to n-grams once the
    target starts copying, and back to plain decoding once the copy ends."""
    adaptive = policy(costs(CPU_TARGET, draft_ms=22), ("ngram",))
    source = list(range(300, 340))
    context = [*source, 1]
    # The target starts repeating `source`: every step commits the next copied token.
    chosen_per_step = []
    for i in range(12):
        chosen = plan(adaptive, context)
        new = source[i : i + 1] if chosen.drafter == "none" else source[i : i + chosen.gamma + 1]
        outcome_gamma = 0 if chosen.drafter == "none" else chosen.gamma
        adaptive.observe(
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
        chosen = plan(adaptive, context)
        token = next(novel)
        adaptive.observe(StepOutcome(chosen.drafter, chosen.gamma if chosen.drafter != "none" else 0, 0,
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


def steps_on_novel_text(
    adaptive: AdaptivePolicy, lookups: dict, steps: int, start: int = 1000, seconds: float = 0.04
) -> list[str]:
    """Plan and commit ``steps`` plain tokens of text that never repeats, each step taking
    ``seconds``."""
    context, chosen = list(NOVEL), []
    for token in range(start, start + steps):
        step = plan(adaptive, context, lookups=lookups)
        chosen.append(step.reason)
        gamma = step.gamma if step.drafter != "none" else 0
        adaptive.observe(StepOutcome(step.drafter, gamma, 0, Draft(tokens=[]), seconds, 0.0, [token]))
        context.append(token)
    return chosen


def longest_idle_run(reasons: list[str]) -> int:
    idle = [r == "idle" for r in reasons]
    return max(len(list(run)) for is_idle, run in itertools.groupby(idle) if is_idle)


def test_a_long_match_ends_the_skipping_at_once():
    """A whole-file edit that opens with a sentence of its own: while planning is skipped
    the n-gram lookup is still asked, and a match of ``waking_match`` tokens wakes it."""
    adaptive = policy(costs(CPU_TARGET, draft_ms=22), ("ngram", "model"))
    lookups = {"ngram": NgramDrafter()}
    steps_on_novel_text(adaptive, lookups, 12)
    assert adaptive.answer.idle_until > adaptive.answer.steps + 1  # skipping
    source = list(range(2000, 2040))
    short = [*NOVEL, *source, 7, *source[: DEFAULT.waking_match - 1]]
    assert plan(adaptive, short, lookups=lookups).reason == "idle"
    long = [*NOVEL, *source, 7, *source[: DEFAULT.waking_match]]
    woken = plan(adaptive, long, lookups=lookups)
    assert woken.reason != "idle" and "ngram:" in woken.reason  # priced again


def test_where_nothing_comes_near_paying_the_controller_looks_less_often_but_keeps_looking():
    """On a steep CPU curve, over text that never repeats, no lookup comes near plain
    decoding's rate and the draft model cannot pay even at its best: planning (most of
    the controller's own time) is skipped for 1, 2, 4, then at most ``max_idle`` steps at
    a time, and a copy that starts is found within that many tokens."""
    ngram = CountingNgram()
    lookups = {"ngram": ngram}
    adaptive = policy(costs(CPU_TARGET, draft_ms=22), ("ngram", "model"))
    reasons = steps_on_novel_text(adaptive, lookups, 60)
    idle = [r == "idle" for r in reasons]
    assert sum(idle) > 40, reasons  # most steps skip planning ...
    assert ngram.lookups == 60  # ... and ask only the n-gram index, for a long match
    assert longest_idle_run(reasons) == DEFAULT.max_idle  # ... but never for long
    # The text turns into a copy of what came before: the first proposal looked at is
    # judged right twice in a row, every step is planned again, and the copy is drafted.
    source = list(range(1000, 1060))
    context = [*NOVEL, *source, *source[:3]]
    at, reasons, drafters_chosen = 3, [], []
    while at < 40:
        step = plan(adaptive, context, lookups=lookups)
        reasons.append(step.reason)
        drafters_chosen.append(step.drafter)
        gamma = step.gamma if step.drafter != "none" else 0
        new = source[at : at + gamma + 1]
        adaptive.observe(StepOutcome(step.drafter, gamma, gamma, Draft(tokens=[]), 0.04, 0.0, new))
        context, at = context + new, at + len(new)
    first_look = next(i for i, reason in enumerate(reasons) if reason != "idle")
    assert first_look <= DEFAULT.max_idle, reasons
    assert "idle" not in reasons[first_look + 2 :], reasons  # two tokens of its proposal hold
    first_copy = drafters_chosen.index("ngram")
    assert first_copy <= first_look + 8, drafters_chosen
    assert set(drafters_chosen[first_copy:]) == {"ngram"}, drafters_chosen


def test_where_the_draft_model_could_pay_the_controller_never_stops_looking():
    """The F16 stand-in on the AVX-512 EPYC: verifying 2 tokens costs 1.7x one, so no
    lookup comes near paying over text that never repeats, but a cheap draft's best case
    beats plain decoding: every step is planned (trials of the draft are decided there)."""
    epyc_f16 = {1: 78, 2: 132, 5: 159, 9: 232, 17: 382}
    adaptive = policy(costs(epyc_f16, draft_ms=23), ("ngram", "model"))
    reasons = steps_on_novel_text(adaptive, {"ngram": CountingNgram()}, 40, seconds=epyc_f16[1] / 1000)
    assert "idle" not in reasons


def test_an_option_whose_steps_realize_less_than_plain_decoding_is_dropped_and_taken_back():
    """The profile says verifying 17 tokens costs 48 ms (a GPU); the steps really take 2 s
    each (it is wrong). Within a few steps the controller stops choosing n-grams; once
    proposals judged for free are right again, it takes them back, and keeps them while
    their steps realize what they should. (The bound on what an answer may lose is lifted:
    the 2 s steps would put it behind plain decoding for good, and the bans are what this
    tests.)"""
    flat = {1: 40, 2: 41, 5: 42, 9: 44, 17: 48}
    stats = acceptance_stats()
    stats.lookup["ngram"].hits[:] = stats.lookup["ngram"].seen[:] = 50.0  # copies have held so far
    unbounded = dataclasses.replace(DEFAULT, risk_share=1e6)
    adaptive = policy(frozen(flat, draft_ms=2), ("ngram",), stats=stats, tuning=unbounded)
    source = list(range(300, 400))
    context = [*source, 1, *source[:4]]
    at = 4  # the next source token the answer copies
    chosen = []
    for _ in range(8):
        step = plan(adaptive, context)
        chosen.append(step.drafter)
        gamma = step.gamma if step.drafter != "none" else 0
        new = source[at : at + gamma + 1]  # every draft is right: only the time is wrong
        seconds = 2.0 if gamma else 0.04
        adaptive.observe(StepOutcome(step.drafter, gamma, gamma, Draft(tokens=[]), seconds, 0.0, new))
        context, at = context + new, at + len(new)
    assert chosen[0] == "ngram"
    assert "none" in chosen[:4], chosen  # the losing option is dropped within a few steps
    assert chosen[-3:] == ["none"] * 3, chosen
    # The evidence changes: its steps now take what the profile says. Proposals judged for
    # free against the committed text confirm the copy holds, and n-grams come back.
    chosen = []
    for _ in range(12):
        step = plan(adaptive, context)
        chosen.append(step.drafter)
        gamma = step.gamma if step.drafter != "none" else 0
        new = source[at : at + gamma + 1]
        adaptive.observe(StepOutcome(step.drafter, gamma, gamma, Draft(tokens=[]), 0.048, 0.0, new))
        context, at = context + new, at + len(new)
    assert chosen[-3:] == ["ngram"] * 3, chosen


def test_a_few_unlucky_draft_model_steps_are_not_taken_for_a_wrong_price():
    """At 60 % acceptance a draft-model step of γ = 2 makes 1, 2 or 3 tokens and pays 1.2×
    where verification is nearly flat. Three steps that made 3, 1 and 1 tokens realized
    less than plain decoding by luck, with every step costing what it was priced: no ban.
    Steps that really cost three times their price are banned within a few steps."""
    adaptive = policy(f16_costs(), ("model",), stats=acceptance_stats())
    draft = Draft(tokens=[0, 0], confidences=[0.9, 0.9], seconds=0.074, decodes=[(1, 0.037), (1, 0.037)])
    for accepted in (2, 0, 0):
        adaptive.observe(StepOutcome("model", 2, accepted, draft, 0.161, 0.0, [0] * (accepted + 1)))
    plain = 1 / 0.143
    assert adaptive.answer.realized.rate("model") < 0.98 * plain  # below plain decoding, by luck
    assert not banned(adaptive, "model")
    for _ in range(3):
        adaptive.observe(StepOutcome("model", 2, 1, draft, 0.161 + 0.47, 0.0, [0, 0]))
    assert banned(adaptive, "model")


def test_trials_of_the_draft_model_do_not_count_in_what_its_chosen_steps_realize():
    """A trial drafts four tokens with no early stop, to learn the draft's acceptance: where
    that is low its steps make fewer tokens a second than plain decoding, as they were
    bound to. That is not evidence that the draft's chosen steps cost more than priced:
    the trials leave no realized rate and no ban behind. (The bound on what a trial may
    risk is lifted: it would space the trials by what the answer can repay.)"""
    adaptive = policy(f16_costs(), ("model",), stats=acceptance_stats(model=0.3), tuning=UNBOUNDED_TRIALS)
    trials = 0
    for _ in range(12):
        step = plan(adaptive, NOVEL, lookups={})
        if step.drafter == "model":
            trials += 1
            accepted = trials % 2  # 0, 1, 0: a draft that rarely pays
            draft = Draft(tokens=[0] * step.gamma, confidences=[0.5] * step.gamma, seconds=0.037 * step.gamma)
            new = [0] * (accepted + 1)
            adaptive.observe(StepOutcome("model", step.gamma, accepted, draft, 0.193, 0.0, new))
        else:
            adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.143, 0.0, [0]))
    assert trials >= 3
    assert adaptive.answer.realized.rate("model") is None
    assert not banned(adaptive, "model")


UNBOUNDED_TRIALS = dataclasses.replace(LONG_ANSWER, trial_risk_tokens=10**6)


# -- tuning ---------------------------------------------------------------------------------


def test_the_tuning_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.model_gain = 2.0  # type: ignore[misc]


def test_a_policy_decides_with_the_tuning_its_pair_was_given():
    """A cheap, reliable draft on a flat curve is chosen, unless the pair's tuning asks the
    draft model for a hundred times plain decoding's rate; and the idle runs over novel
    text on a steep curve are as long as the tuning allows."""
    demanding = dataclasses.replace(DEFAULT, model_gain=100.0)
    for tuning, expected in ((DEFAULT, "model"), (demanding, "none")):
        adaptive = policy(
            costs(FLAT_TARGET, draft_ms=2), ("model",), stats=acceptance_stats(model=0.9), tuning=tuning
        )
        assert adaptive.tuning is tuning and adaptive.answer.tuning is tuning
        assert plan(adaptive, NOVEL).drafter == expected, tuning
    for max_idle in (DEFAULT.max_idle, 3):
        tuning = dataclasses.replace(DEFAULT, max_idle=max_idle)
        adaptive = policy(costs(CPU_TARGET, draft_ms=22), ("ngram", "model"), tuning=tuning)
        assert longest_idle_run(steps_on_novel_text(adaptive, {"ngram": NgramDrafter()}, 60)) == max_idle


def test_the_pair_state_carries_the_tuning_into_its_statistics():
    tuning = dataclasses.replace(DEFAULT, model_prior=0.2, carry_over=0.5)
    pair = PairState(costs(CPU_TARGET, draft_ms=22), tuning)
    assert pair.stats.tuning is tuning and pair.stats.model == pytest.approx(0.2)
    pair.stats.lookup["ngram"].seen[:] = 10.0
    pair.begin_answer()
    assert (pair.stats.lookup["ngram"].seen == 5.0).all()


def test_an_answer_behind_plain_decoding_decodes_plainly_and_says_so():
    """A 16-token draft whose first token failed on a steep CPU: the answer is behind plain
    decoding by more than a one-token draft could still risk. It decodes plainly without
    pricing anything (lookups and pricing would only add to the loss) and says why in the
    step's reason; as its tokens grow, so does what it may risk, and it looks again."""
    repeated = list(range(200, 240))
    context = [*repeated, 0, *repeated[:10]]
    stats = acceptance_stats()
    stats.lookup["ngram"].hits[:], stats.lookup["ngram"].seen[:] = 400.0, 400.0
    adaptive = policy(costs(CPU_TARGET, draft_ms=22), ("ngram",), stats=stats, tuning=DEFAULT)
    adaptive.pair.costs.plain_overhead = 0.0
    adaptive.begin()
    adaptive.observe(StepOutcome("ngram", 16, 0, Draft(tokens=[0] * 16), 0.759, 0.0, [999]))
    assert adaptive.answer.saved_s == pytest.approx(0.058 - 0.759)
    step = plan(adaptive, context)
    assert step.drafter == "none" and step.reason.startswith("behind plain decoding by 701.0 ms")
    for _ in range(500):  # plain steps at the price of plain steps
        adaptive.observe(StepOutcome("none", 0, 0, Draft(tokens=[]), 0.058, 0.0, [999]))
    assert not plan(adaptive, context).reason.startswith("behind")


def test_what_an_answer_gained_is_counted_against_plain_decoding_as_none_takes_it():
    """Plain decoding's yardstick is a step that prices nothing, as ``--drafter none``
    takes it: a step that priced its options and then decoded plainly still paid for the
    pricing; a drafting step gains the plain steps it replaces; the first plain steps after
    a draft pay what the return to single tokens costs (a GPU), but not those after the
    prompt's pass, which plain decoding pays as well. Each is counted at the prices the
    answer started with (what the pair learned before it), here where the clock agrees
    with them within ``price_margin``."""
    adaptive = policy(costs(H200_TARGET, draft_ms=2), ("ngram",))
    adaptive.pair.costs.plain_overhead = 0.0
    pair = adaptive.pair
    plain = Draft(tokens=[])
    # the first two steps after the prompt (idle: nothing priced, 0.1 ms of Python) are
    # dearer, and not counted against drafting
    for ms in (4.8, 3.6):
        adaptive.observe(StepOutcome("none", 0, 0, plain, ms / 1000, 0.0001, [0]))
    assert adaptive.answer.saved_s == 0.0
    assert pair.bare_overhead == pytest.approx(0.0001)
    plan(adaptive, NOVEL)  # priced: its step pays 0.4 ms of Python, which the pair learns
    adaptive.observe(StepOutcome("none", 0, 0, plain, 0.0018, 0.0004, [0]))
    assert pair.pricing_overhead == pytest.approx(0.0004)
    adaptive.begin()  # the next answer's prices
    answer, prices = adaptive.answer, adaptive.prices
    assert (prices.bare_s, prices.pricing_s) == pytest.approx((0.0001, 0.0003))
    plan(adaptive, NOVEL)
    adaptive.observe(StepOutcome("none", 0, 0, plain, 0.0019, 0.0004, [0]))  # (the clock: noise)
    assert answer.saved_s == pytest.approx(-0.0003)
    plan(adaptive, [*range(500, 540), 1, *range(500, 504)])
    adaptive.observe(StepOutcome("ngram", 4, 4, Draft(tokens=[0] * 4), 0.0042, 0.0004, [0] * 5))
    drafting = adaptive.costs.target.estimate(5) + adaptive.costs.overhead
    assert answer.saved_s == pytest.approx(-0.0003 + 5 * (prices.plain_s + 0.0001) - drafting)
    # the return to single tokens costs 5 ms more than a plain step: the answer's prices
    # know nothing of it yet (it is counted at them), the pair learns it, and the next
    # answer, whose prices it puts off by more than the margin, is charged it
    steady = pair.steady_plain(pair.costs)
    before = answer.saved_s
    adaptive.step = StepScratch()  # (a step that priced nothing)
    adaptive.observe(StepOutcome("none", 0, 0, plain, 0.0068, 0.0001, [0]))  # the return: 5 ms dearer
    assert answer.saved_s == pytest.approx(before, abs=1e-9)
    assert pair.return_excess[0] == pytest.approx(DEFAULT.return_ema * (0.0068 - steady))
    adaptive.begin()
    assert adaptive.prices.return_excess[0] == pair.return_excess[0]


def test_a_shared_drafting_step_is_counted_against_plain_decoding_at_once():
    """Beside other answers, plain decoding is each answer's share of a decode of all their
    single tokens (``--drafter none`` at once): on this CPU 4 tokens cost 202 ms, not 4 x
    58. Counted against a plain step alone, a drafting step would credit the batch's own
    saving to drafting, and the risk budget would grow with gains never made. (A step
    decoded alone is counted at the answer's prices; a shared one on the clock, since its
    price depends on the others'.)"""
    saved = {}
    for others in (0, 3):
        adaptive = policy(costs(CPU_TARGET, draft_ms=20), ("ngram",))
        adaptive.pair.costs.plain_overhead = 0.0
        adaptive.pair.bare_overhead = 0.0
        adaptive.begin()
        plan(adaptive, [*range(500, 540), 1, *range(500, 504)])
        step = StepOutcome("ngram", 4, 4, Draft(tokens=[0] * 4), 0.2, 0.0, [0] * 5, shared_with=others)
        adaptive.observe(step)
        steady = adaptive.pair.steady_plain(adaptive.costs)
        saved[others] = adaptive.answer.saved_s
        prices = (adaptive.prices.plain_step(), adaptive.prices.step(4, [], priced=True))
    plain_s, step_s = prices
    assert 0.2 / 1.5 < step_s < 0.2 * 1.5  # (its clock agreed with its price)
    assert saved[0] == pytest.approx(5 * plain_s - step_s)
    assert saved[3] == pytest.approx(5 * steady * 202 / (4 * 58) - 0.2)


def test_a_draft_at_long_odds_leaves_room_for_another_after_a_miss():
    """Verifying γ drafts costs 100 + 10γ ms: at an answer's start it may lose 48 ms, a
    four-token draft's worst case. A copy whose first token holds only half the time (its
    later ones nearly always) may stake 38 ms, so that a miss still leaves a one-token
    draft: three tokens. A copy sure of its first token drafts four; without the rule
    (``all_in_odds`` 0) the half-sure one stakes everything too."""
    stepped = {k: 100 + 10 * (k - 1) for k in range(1, 18)}
    context = [*range(200, 240), 0, *range(200, 203)]  # the n-gram lookup matches 3 tokens

    def first_step(first_holds: float, odds: float) -> tuple[AdaptivePolicy, int]:
        tuning = dataclasses.replace(DEFAULT, all_in_odds=odds)
        stats = acceptance_stats(tuning=tuning)
        ngram = stats.lookup["ngram"]
        ngram.seen[:] = 400.0
        ngram.hits[:] = 0.99 * 400.0
        ngram.hits[:, ngram.buckets.of[3]] = first_holds * 400.0
        adaptive = policy(costs(stepped, draft_ms=22), ("ngram",), stats=stats, tuning=tuning)
        adaptive.costs.plain_overhead = 0.0
        step = plan(adaptive, context)
        assert step.drafter == "ngram"
        return adaptive, step.gamma

    adaptive, gamma = first_step(0.5, DEFAULT.all_in_odds)
    assert gamma == 3
    adaptive.observe(StepOutcome("ngram", 3, 0, Draft(tokens=[0] * 3), 0.130, 0.0, [999]))
    assert not plan(adaptive, context).reason.startswith(("behind", "plain until"))
    assert first_step(0.99, DEFAULT.all_in_odds)[1] == 4
    assert first_step(0.5, 0.0)[1] == 4

"""``AdaptivePolicy``: the plan/observe glue of the cost-aware controller behind
``--drafter auto --gamma auto``.

Before every step it prices each option (``pricing``) with the measured costs and the
acceptance statistics (``stats``) and picks the highest expected tokens per second, among
options not banned (``realized``); after the step it learns from what happened. The draft
model, whose acceptance cannot be judged without drafting, is tried for a few steps early
on wherever its best case could pay, once in every answer after its first few steps, and
now and then afterwards, so a machine where it pays (a GPU, Apple Silicon) is found within
a few steps. Where nothing comes near paying (a steep CPU, over text that nothing copies,
with a draft model that cannot pay there even at its best), it stops looking for a while:
1, 2, 4, then at most ``max_idle`` steps at a time without lookups or pricing, until a
proposal it did look at proves right for ``waking_run`` tokens in a row.

On a GPU the first two plain steps after a drafting step cost more than plain steps
(llama.cpp rebuilds its graph for the new size): the controller learns that excess from
the plain steps that follow its drafting and charges it to any step that would start
drafting after plain steps, where it is worth pricing (on a CPU it is noise around zero).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.decoding.auto import pricing
from edgespec.decoding.auto.pricing import Choice
from edgespec.decoding.auto.state import AnswerState, ModelPrice, OpenProposal, PairState, StepScratch
from edgespec.decoding.auto.stats import ANY_COPY, HELD, PREDICTED, expected_tokens
from edgespec.decoding.drafters import DECODING_DRAFTERS, LOOKUP_DRAFTERS, REGISTRY
from edgespec.decoding.policy import Plan, StepOutcome, StepView


@dataclass(frozen=True)
class Priced:
    """Every option for a step, priced (plain decoding first); the lookup proposals priced
    (to be judged against what the answer commits); and the draft model's price, where it
    was priced."""

    options: list[Choice]
    opened: list[OpenProposal]
    model: ModelPrice | None = None
    shared: pricing.Sharing | None = None  # the decode the step is expected to share


class AdaptivePolicy:
    """Chooses drafter and γ per step from measured costs and acceptance. One policy
    serves one answer (``begin`` starts it); what it learns about the pair goes into the
    ``PairState`` it was given."""

    prefill_draft = False  # the draft model catches up only when it is chosen

    def __init__(
        self,
        pair: PairState,
        drafters: tuple[str, ...],
        gamma_cap: int | None = None,
        fixed_gamma: int | None = None,
    ):
        self.pair = pair
        self.tuning = pair.tuning
        self._take_prices()
        self.stats = pair.stats
        self.allowed = drafters
        # The allowed drafter priced by the draft model's decodes (the registry declares
        # it), or None: what the trials, the early stop and the catch-up concern.
        self.decoding = next((d for d in drafters if d in DECODING_DRAFTERS), None)
        self.gamma_cap = gamma_cap
        self.fixed_gamma = fixed_gamma
        # Tokens a draft-model step of the trial's γ makes at the prior's acceptance: the
        # pace at which the rest of an answer shares the draft's prompt prefill, before the
        # answer shows its own.
        self._model_pace = float(
            expected_tokens(np.full(self.tuning.trial_gamma, self.tuning.model_prior))[-1]
        )
        self.answer = AnswerState(self.tuning)
        self.step = StepScratch()

    def begin(self) -> None:
        """A new answer: fresh answer state, and the pair's evidence softened."""
        self.pair.begin_answer()
        self._take_prices()
        self.answer = AnswerState(self.tuning)
        self.step = StepScratch()

    def _take_prices(self) -> None:
        """The answer prices its steps from now on at the pair's prices (``self.costs``:
        their cost model; the pair's own goes on learning)."""
        self.prices = self.pair.prices()
        self.costs = self.prices.costs

    # -- planning -------------------------------------------------------------------------

    def plan(self, view: StepView) -> Plan:
        answer, t = self.answer, self.tuning
        answer.steps += 1
        if answer.steps < answer.idle_until and not self._long_match(view):
            # Nothing came near paying at the last plans (_note_idle): decode plainly.
            self.step = StepScratch()
            return Plan("none", 0, reason="idle")
        behind = self._behind()
        if behind:
            self.step = StepScratch()
            return Plan("none", 0, reason=behind)
        priced = self.choices(view)
        answer.open.extend(priced.opened)
        if priced.model is not None:
            answer.model_price = priced.model
        price = answer.model_price
        options = priced.options
        if self.fixed_gamma == 0 or not self.allowed:
            options = options[:1]
        # Drafting must beat plain decoding clearly: its estimates are noisy, and a wrong
        # bet on a steep CPU cost curve loses more than a right one wins. An option whose
        # steps realized less than plain decoding is left out while its ban lasts. Nor does
        # the draft model read the prompt in the answer's first steps: an answer that copies
        # its prompt (an edit) shows it within a few tokens, and then the lookups beat a
        # draft whose prompt prefill would already be paid.
        plain = options[0]
        settling = answer.steps < t.settle_steps and price.switch_s > 0.0 and not answer.draft_synced
        drafting = [
            c
            for c in options[1:]
            if c.rate > plain.rate * (t.model_gain if c.drafter == self.decoding else t.min_gain)
            and not answer.bans.banned(c.drafter, answer.steps)
            and not (settling and c.drafter == self.decoding)
        ]
        best = max(drafting, key=lambda c: c.rate) if drafting else plain
        best, exploring = self._trial(options, best, view, price, priced.shared)
        if best.drafter != "none":
            answer.last_used[best.drafter] = answer.steps
        self._note_idle(plain, options, price)
        reason = ", ".join(f"{c.drafter}:{c.gamma}@{c.rate:.1f}/s" for c in options)
        self.step = StepScratch(best, exploring, first_draft_s=price.catch_up_s)
        steering = best.drafter == self.decoding and self.fixed_gamma is None and not exploring
        keep_going = self._keep_going if steering else None
        return Plan(best.drafter, best.gamma, keep_going, reason, wants_confidence=True)

    def _long_match(self, view: StepView) -> bool:
        """While idle, only the lookups declared ``probed_while_idle`` are asked (the n-gram
        index: a probe): the answer may
        have started to copy its source, and a long match is evidence enough to plan
        again (a whole-file edit that starts with a sentence of its own)."""
        probes = [name for name in self.allowed if REGISTRY[name].probed_while_idle]
        if any(view.proposal(name, 1).evidence >= self.tuning.waking_match for name in probes):
            self.answer.idle, self.answer.idle_until = 0, 0
            return True
        return False

    def _risk(self, plain_s: float) -> float:
        """What a step may lose at worst against plain decoding: the answer's surplus over
        plain decoding (negative when behind) plus its allowance."""
        answer = self.answer
        return pricing.risk_budget(self.tuning, answer.saved_s, answer.tokens, plain_s)

    def _behind(self) -> str:
        """Why the step decodes plainly without pricing anything, when the answer is so
        far behind plain decoding that no draft's worst case fits what it may still lose
        (its allowance grows with every token): each lookup and pricing would only put it
        further behind. Empty when a draft may fit."""
        plain = pricing.plain_seconds(self.costs)
        cheapest = self._one_token_worst(plain)
        risk = self._risk(plain)
        if risk >= cheapest:
            return ""
        worst = f"a one-token draft's worst case ({1000 * cheapest:.1f} ms)"
        if self.answer.saved_s < 0.0:
            return f"behind plain decoding by {-1000 * self.answer.saved_s:.1f} ms: plain until {worst} fits"
        return f"plain until the answer's allowance ({1000 * risk:.1f} ms) covers {worst}"

    def _one_token_worst(self, plain_s: float) -> float:
        """What a one-token draft loses where it fails: the least any draft risks."""
        return float(pricing.verify_seconds(self.costs, np.array([1]))[0]) - plain_s

    def choices(self, view: StepView) -> Priced:
        """Every option for the next step, priced; it changes nothing."""
        answer, costs = self.answer, self.costs
        budget = view.budget
        alone = pricing.plain_seconds(costs)
        shared = pricing.sharing(costs, view.others, view.others_tokens, self.pair.shared_decodes)
        plain = pricing.plain_seconds(costs, shared)
        options = [Choice("none", 0, 1.0 / alone, 1.0, plain)]
        risk = self._risk(alone)
        # A lookup whose first token is less likely to hold than ``all_in_odds`` may not
        # stake all the answer may still lose: a miss would leave no room for even a
        # one-token draft, and the answer would decode plainly until its allowance grows
        # back (some 26 tokens on a steep CPU, however well a copy holds after it).
        long_odds_risk = risk - self._one_token_worst(alone)
        cap = min(budget, self.gamma_cap or budget, self._at_once_limit(shared, budget))
        if cap <= 0:
            return Priced(options, [], shared=shared)
        verify_row = pricing.verify_seconds(costs, np.arange(1, cap + 1), shared)  # γ = 1..cap
        return_s = self._return_cost()
        opened = self._open_proposals(view, cap)
        for proposal in opened:
            accept = self.stats.lookup[proposal.drafter].acceptance(
                proposal.evidence,
                len(proposal.tokens),
                proposal.crossings,
                proposal.agreement,
                proposal.source,
            )
            calibration = answer.realized.calibration(proposal.drafter)
            row = (verify_row, return_s, 0.0)
            stake = risk if accept[0] >= self.tuning.all_in_odds else long_odds_risk
            options.append(self._best(proposal.drafter, accept, row, calibration, stake, (shared, plain)))
        model = None
        if self.decoding is not None:
            model = self.model_price(view)
            accept = np.full(cap, self.stats.model)
            row = (verify_row, model.first + return_s, model.per_draft)
            # its worst case pays the whole catch-up, where its price shares a prefill out
            model_risk = risk - (model.catch_up_s - model.first)
            options.append(self._best(self.decoding, accept, row, 1.0, model_risk, (shared, plain)))
        return Priced(options, opened, model, shared)

    def _at_once_limit(self, shared: pricing.Sharing | None, most: int) -> int:
        """The most a draft may hold (``most`` where nothing limits it). Until a decode of
        several passes with a draft in it was measured, one short draft at once, in a
        decode of plain steps, shows what drafted tokens add to it; no answer drafts at
        once before that."""
        if shared is None or self.pair.shared_decodes.drafted_known():
            return most
        return 0 if shared.tokens > shared.answers else min(most, self.tuning.shared_trial_gamma)

    def _open_proposals(self, view: StepView, cap: int) -> list[OpenProposal]:
        """The allowed lookups' proposals for the step, with what their acceptance is
        looked up by: where they break lines or sentences, whether they agree, where they
        copy from."""
        answer, t = self.answer, self.tuning
        proposals = [view.proposal(name, cap) for name in LOOKUP_DRAFTERS if name in self.allowed]
        proposals = [p for p in proposals if p.tokens]
        firsts = [p.tokens[0] for p in proposals]
        opened = []
        for p in proposals:
            # Lookups that copy from different places, or blind to wrapping, and still
            # propose the same next token are right far more often than one alone.
            agreement = min(firsts.count(p.tokens[0]) - 1, t.agreement_levels - 1)
            crossings = pricing.crossings(view, list(p.tokens))
            source = PREDICTED if p.from_prediction else HELD if p.drafter in answer.held else ANY_COPY
            opened.append(OpenProposal(p.drafter, p.evidence, p.tokens, crossings, agreement, source))
        return opened

    def _best(
        self,
        drafter: str,
        accept: np.ndarray,
        row: tuple[np.ndarray, float, float],
        calibration: float,
        risk: float,
        sharing: tuple[pricing.Sharing | None, float],
    ) -> Choice:
        """``row``: the seconds to verify each γ, the drafting's fixed cost and per draft;
        ``sharing``: the decode the step is expected to share, and a plain step's price there."""
        verify_row, fixed_cost, per_draft = row
        shared, plain_s = sharing
        return pricing.best_gamma(
            drafter,
            accept,
            verify_row,
            fixed_cost,
            per_draft,
            calibration=calibration,
            fixed_gamma=self.fixed_gamma,
            risk=risk,
            plain_s=plain_s,
            shared=shared,
        )

    def model_price(self, view: StepView) -> ModelPrice:
        """The draft model's price at this step: the catch-up it must decode before
        drafting, and, where that is a prompt prefill, the step's share of it.
        The draft's first catch-up is its prompt prefill, paid once per answer: shared by
        the steps the answer has left, it does not hide for good a draft model that pays on
        every later step. An answer that has been making many tokens per step (a copy) has
        few steps left to share it. A later catch-up is the price of coming back after
        other steps, paid again at every return: shared only by the few model steps a
        return lasts."""
        answer, t = self.answer, self.tuning
        catch_up = view.catch_up(self.decoding) if self.decoding else 0
        catch_up_s = first = self.costs.draft.estimate(catch_up)
        per_draft = self.costs.draft.estimate(1)
        switch_s = max(first - per_draft, 0.0) if catch_up > t.prefill_batch else 0.0
        if switch_s > 0.0:
            steps_left = max(view.remaining / max(answer.pace(), self._model_pace), 1.0)
            horizon = min(steps_left, t.return_steps) if answer.draft_synced else steps_left
            first = per_draft + switch_s / horizon
        return ModelPrice(first, per_draft, catch_up_s, switch_s)

    def _return_cost(self) -> float:
        """Seconds a drafting step that follows plain steps will cost the plain steps after
        it (where that is worth pricing); nothing while a drafting run goes on."""
        if self.answer.plain_since_draft == 0:
            return 0.0
        excess = sum(self.prices.return_excess)
        return excess if excess > self.tuning.return_significant * self.costs.target.estimate(1) else 0.0

    def _trial(
        self,
        options: list[Choice],
        best: Choice,
        view: StepView,
        price: ModelPrice,
        shared: pricing.Sharing | None = None,
    ) -> tuple[Choice, bool]:
        """A drafter that is never chosen is never measured: the draft model is tried early
        for a few steps, and now and then later, while its best case could beat the choice.
        (Lookup proposals are judged for free at every step anyway.)"""
        answer, t = self.answer, self.tuning
        most = self._at_once_limit(shared, t.trial_gamma)
        if most <= 0:
            return best, False
        for option in options:
            name = option.drafter
            if name != self.decoding or name == best.drafter or answer.bans.banned(name, answer.steps):
                continue
            early = (answer.steps >= 2 and self.stats.model_steps < t.early_trials) or (
                answer.steps >= t.settle_steps and not answer.draft_synced
            )
            due = answer.steps - answer.last_used.get(name, 0) >= answer.explore_every
            if (
                (early or due)
                and self._could_win(best, view.remaining, price, shared)
                and self._affordable_trial(price)
            ):
                # A trial drafts a fixed γ with no early stop: cut short by a pessimistic
                # calibration it would only confirm that the draft's first token is right.
                gamma = max(1, min(most, view.budget, self.gamma_cap or most))
                return Choice(name, gamma, option.rate, option.expected, option.seconds), True
        return best, False

    def _affordable_trial(self, price: ModelPrice) -> bool:
        """What a trial risks is what the answer so far can repay: its switch (the draft
        reading the prompt) and what its step costs beyond a plain step where its first
        token fails must fit in the answer's risk budget (what drafting saved in it, plus
        a share of its plain time counted over at least ``trial_risk_tokens``). A trial
        that only a long answer could repay does not run in a short one."""
        answer, t, costs = self.answer, self.tuning, self.costs
        plain = pricing.plain_seconds(costs)
        step_s = pricing.trial_seconds(t, costs, price.catch_up_s, price.switch_s)
        risk = price.switch_s + step_s - plain
        return risk <= pricing.risk_budget(t, answer.saved_s, answer.tokens, plain, t.trial_risk_tokens)

    def _note_idle(self, plain: Choice, options: list[Choice], price: ModelPrice) -> None:
        """Count plans in a row where no drafting option came within ``idle_ratio`` of
        plain decoding; after n ≥ 2 of them, the next min(2^(n-2), max_idle) steps skip
        planning. (The draft's best case is priced only where the lookups are out of the
        running.)"""
        answer, t = self.answer, self.tuning
        closest = max((c.rate for c in options[1:]), default=0.0)
        if closest < plain.rate * t.idle_ratio and not (
            self.decoding is not None and self._best_case_rate(price) > plain.rate
        ):
            answer.idle += 1
            if answer.idle >= 2:
                answer.idle_until = answer.steps + 1 + min(2 ** (answer.idle - 2), t.max_idle)
        else:
            answer.idle = 0

    def _could_win(
        self, best: Choice, remaining: int, price: ModelPrice, shared: pricing.Sharing | None = None
    ) -> bool:
        """Is a trial of the draft model worth its price? Its steps must beat ``best`` at
        near-perfect acceptance, and what that would save over the rest of the answer must
        outweigh the switch (the catch-up: the prompt, the first time) at ``trial_odds``:
        the switch is paid for sure, the saving only if the draft turns out to pay. Where
        the draft reads a prompt in a blink (a GPU) trials always pass; a long prompt for a
        short answer on a CPU is not worth the gamble. At once (``shared``), its step is
        priced by what it adds to the shared decode, as every option's is."""
        optimistic = self._best_case_rate(price, shared)
        if optimistic <= best.rate:
            return False
        saving = remaining * (1.0 / best.rate - 1.0 / optimistic)
        return saving > self.tuning.trial_odds * price.switch_s

    def _best_case_rate(self, price: ModelPrice, shared: pricing.Sharing | None = None) -> float:
        """A trial's step of the draft model at its best case. Before the draft has drafted
        in this answer (and in the first trials ever) that is a near-perfect draft: this
        answer's text may suit it far better than the last one's. After that, what it
        showed bounds it, so a draft that keeps failing here is not tried again."""
        answer, t = self.answer, self.tuning
        best_case = t.optimistic
        if answer.draft_synced and self.stats.model_steps >= t.early_trials:
            best_case = min(t.optimistic, self.stats.model_upper(t.trial_doubt))
        return pricing.trial_rate(t, self.costs, best_case, price.catch_up_s, price.switch_s, shared)

    def _keep_going(self, i: int, confidence: float) -> bool:
        """Draft token i (0-based) has confidence ``confidence``: include it? Token 0 always
        is. Token i is included only if what it adds in expectation, per second it costs
        (one more verified position, and the draft decode that follows it), beats the
        expected rate of the step as it stands."""
        step = self.step
        p_new = step.included_p * self.stats.model_acceptance(confidence, optimistic=True)
        if i > 0:
            target, per_draft = self.costs.target, self.costs.draft.estimate(1)
            seconds = step.first_draft_s + i * per_draft + target.estimate(i + 1) + self.costs.overhead
            marginal = target.estimate(i + 2) - target.estimate(i + 1) + per_draft
            if p_new / max(marginal, 1e-6) < step.expected / seconds:
                return False
        step.included_p = p_new
        step.expected += p_new
        return True

    # -- learning -------------------------------------------------------------------------

    def observe(self, outcome: StepOutcome) -> None:
        # A catch-up decode (the prompt prefill, or a return after steps of other options
        # or after a ban) is a cost of switching to the draft model, priced when it is
        # chosen: counted in what drafting realizes, a return after a ban would make the
        # draft look worse and be banned again, longer.
        self.answer.draft_synced = self.answer.draft_synced or outcome.drafter == self.decoding
        step_s, prefill_s, on_clock = self._counted(outcome)
        self._learn_surplus(outcome, step_s + prefill_s)
        self._learn_realized(outcome, step_s)
        self._learn_costs(outcome, on_clock)
        if on_clock:  # (a pass the machine stalled once changes no price; a machine that changed does)
            self._take_prices()
        if outcome.drafter == self.decoding:
            self._learn_model(outcome)
        self._judge_open_proposals(outcome.new_tokens)

    def _counted(self, outcome: StepOutcome) -> tuple[float, float, bool]:
        """What the step is counted at, without and with the draft's catch-up decodes (a
        prompt prefill), and whether it was counted on the clock: at the answer's prices
        (``Prices``), unless what the pair has learned since the answer started puts them
        off by more than ``price_margin`` (a profile that does not fit the machine, a
        machine slowed down: one slow pass moves what is learned by a third of its
        surprise, a machine that changed moves it past the margin within a few), or the
        step's own clock is off its price by more than ``price_gross`` (no noise is); then
        on the clock, and the answer takes the pair's prices again (new ones only where the
        held ones no longer fit: ``PairState.prices``). A step shared with other answers is
        counted on the clock: its price depends on theirs."""
        prefill = [(size, s) for size, s in outcome.draft.decodes if size > self.tuning.prefill_batch]
        clock_prefill = sum(s for _, s in prefill)
        clock = outcome.draft.seconds - clock_prefill + outcome.verify_s + outcome.overhead_s
        if outcome.shared or outcome.draft.shared:
            return clock, clock_prefill, False
        prefill_s = sum(self.costs.draft.estimate(size) for size, _ in prefill)
        priced = self.prices.step(outcome.gamma, outcome.draft.decodes, priced=self.step.chosen is not None)
        scale, gross = self.pair.scale(self.prices), self.tuning.price_gross
        expected = priced * scale
        if (
            self.pair.off_price(self.prices, outcome.gamma + 1, scale)
            or not expected / gross <= clock + clock_prefill <= expected * gross
        ):
            return clock, clock_prefill, True
        return priced - prefill_s, prefill_s, False

    def _returning(self, outcome: StepOutcome) -> int | None:
        """0 or 1 for the first or second plain step after a drafting step's pass (on a GPU
        they cost more than plain steps), else None."""
        answer = self.answer
        if outcome.gamma == 0 and answer.plain_since_draft < 2 and answer.drafted:
            return answer.plain_since_draft
        return None

    def _learn_surplus(self, outcome: StepOutcome, step_s: float) -> None:
        """What the step gained or lost against plain decoding (``step_s``: all it cost,
        a prompt prefill of the draft included, at the answer's prices). Plain decoding is a
        step with nothing priced, as ``--drafter none`` takes it: its Python is learned from
        the steps that took none. A priced step that decoded plainly still paid its lookups
        and pricing (on a 34 ms step, half a millisecond is 1.5 %)."""
        pair, answer, prices = self.pair, self.answer, self.prices
        if self.step.chosen is None and outcome.gamma == 0:
            pair.learn_bare_overhead(outcome.overhead_s)
            return
        if outcome.gamma == 0:
            pair.learn_pricing_overhead(outcome.overhead_s)
            answer.saved_s -= prices.pricing_s
        elif outcome.shared:
            plain = pair.steady_plain(pair.costs) * self._plain_share(outcome.shared_with) + prices.bare_s
            answer.saved_s += (outcome.accepted + 1) * plain - step_s
        else:
            answer.saved_s += (outcome.accepted + 1) * prices.plain_step() - step_s

    def _plain_share(self, others: int) -> float:
        """A plain step's share of a decode shared with ``others`` answers' plain steps,
        as a share of a plain step alone: what each of them pays when every answer decodes
        plainly (``--drafter none`` at once). A shared drafting step measured against a
        plain step alone would credit the answer the batch's own saving as drafting's (on
        a CPU where 4 tokens cost 1.7–3.1 one, 25–55 % of every token), and the risk budget
        would let drafts through that lose against plain decoding at once."""
        if others <= 0:
            return 1.0
        curve = self.costs.target
        together = self.pair.shared_decodes.seconds(others + 1, others + 1, curve)
        return together / ((others + 1) * curve.estimate(1))

    def _learn_realized(self, outcome: StepOutcome, step_s: float) -> None:
        """What the step delivered: the option's realized rate (a trial is not what the
        draft model would be chosen to do, so it is left out), what drafting saved in this
        answer, the calibration of a lookup's prediction, and a ban where the option's
        steps fall short of plain decoding."""
        answer, chosen = self.answer, self.step.chosen
        if not self.step.exploring:
            answer.realized.observe(
                outcome.drafter, outcome.accepted + 1, step_s, outcome.gamma, outcome.accepted
            )
        answer.tokens += outcome.accepted + 1
        answer.passes += 1
        if chosen is not None and chosen.drafter == outcome.drafter and outcome.drafter in LOOKUP_DRAFTERS:
            answer.realized.calibrate(outcome.drafter, chosen.expected - 1.0, outcome.accepted)
        if outcome.drafter != "none" and outcome.drafter not in answer.bans.until:
            plain = answer.realized.rate("none")
            if plain is None:
                plain = 1.0 / pricing.plain_seconds(self.costs)
            answer.bans.check(outcome.drafter, answer.steps, answer.realized, plain)

    def _learn_costs(self, outcome: StepOutcome, on_clock: bool) -> None:
        """The step's costs: its Python, its target pass (and, right after drafting, what a
        return to plain decoding costs beyond a plain step), the draft's decodes."""
        answer, costs = self.answer, self.pair.costs
        costs.observe_overhead(outcome.overhead_s, plain=outcome.gamma == 0)
        # A share of a decode over several answers' tokens is not what it would cost
        # alone, which is what the cost curves price.
        if not outcome.draft.shared:
            for k, seconds in outcome.draft.decodes:
                costs.draft.observe(k, seconds)
        if outcome.shared:
            return
        size = outcome.gamma + 1
        ema = self.tuning.return_ema
        returning = self._returning(outcome)
        if returning is not None:
            # Signed: on a CPU a slow step and a fast one cancel, where clipping at zero
            # would add their noise up into a price.
            i = returning
            excess = outcome.verify_s - self.pair.steady_plain(costs)
            # (what the drafting before it cost these steps)
            answer.saved_s -= excess if on_clock else self.prices.return_excess[i]
            self.pair.return_excess[i] = (1 - ema) * self.pair.return_excess[i] + ema * excess
        elif size == 1 and answer.plain_since_draft >= 2:
            # (the first two after the prompt's pass return from it, as plain decoding's do)
            self.pair.learn_steady_plain(costs, outcome.verify_s)
        costs.target.observe(size, outcome.verify_s, repeated=size == answer.last_size)
        answer.plain_since_draft = 0 if size > 1 else min(answer.plain_since_draft + 1, 2)
        answer.drafted = answer.drafted or size > 1
        answer.last_size = size

    def _learn_model(self, outcome: StepOutcome) -> None:
        """The draft model's judged tokens; a trial is judged by its first token: a draft
        that pays on two tokens a step often fails a trial's longer draft later on, one
        that does not pays on none."""
        self.stats.observe_model(outcome.draft.confidences, outcome.accepted)
        if self.step.exploring:
            t = self.tuning
            failed = outcome.accepted == 0
            self.answer.explore_every = (
                min(2 * self.answer.explore_every, t.max_explore_every) if failed else t.explore_every
            )

    def _judge_open_proposals(self, committed: list[int]) -> None:
        """Each committed token confirms or refutes the next token of every open lookup
        proposal: free, counterfactual evidence of how lookup drafts would fare (exact
        under greedy decoding; under sampling, a match happens with the probability an
        accepted one-hot draft has)."""
        answer, t = self.answer, self.tuning
        for token in committed:
            for proposal in list(answer.open):
                hit = proposal.tokens[proposal.judged] == token
                crossing = proposal.crossings is not None and bool(proposal.crossings[proposal.judged])
                self.stats.lookup[proposal.drafter].observe(
                    proposal.evidence + proposal.judged,
                    hit,
                    crossing=crossing,
                    agreement=proposal.agreement,
                    source=proposal.source,
                )
                proposal.judged += 1
                if hit and proposal.judged == t.held_copy:
                    answer.held.add(proposal.drafter)  # this answer follows its source at length
                if hit and proposal.judged == t.confirming_run:
                    answer.bans.confirmed(proposal.drafter)  # new evidence: it copies right again
                if hit and proposal.judged == t.waking_run:
                    answer.idle, answer.idle_until = 0, 0  # a copy holds: look at every step again
                if not hit or proposal.judged == len(proposal.tokens):
                    answer.open.remove(proposal)

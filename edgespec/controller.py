"""The cost-aware controller behind ``--drafter auto --gamma auto``.

Before every step it prices each way of taking the step with the measured cost model
(edgespec.costs) and the measured acceptance statistics below, and picks the one with
the highest expected tokens per second:

* plain decoding (γ = 0): 1 token for one single-token target pass;
* the n-gram drafter: its proposal (free to compute) with γ chosen so that
  E[tokens] / (T(γ+1) + overhead) is largest, E from the acceptance of n-gram drafts
  with the same match length;
* the draft model: catch-up decode + (γ−1) draft decodes + T(γ+1); while drafting it
  stops early once the next token's expected gain per second (from the draft's own
  confidence, calibrated by measured acceptance) falls below the step's rate so far.

With p the probability that each next draft is accepted, a step that verifies γ drafts
yields E = 1 + p + p² + … + p^γ tokens (the accepted prefix plus the target's token).

Statistics react within a few steps (exponential averages), and the n-gram drafter's
acceptance is also scored counterfactually at every step (did its proposal match what
the target committed?), so the controller notices at once when text turns repetitive.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edgespec.costs import _DRAFT_WARMUP, _TARGET_WARMUP, CostModel, profile_path, warm_up
from edgespec.drafters import ModelDrafter, NgramDrafter
from edgespec.errors import EdgespecError
from edgespec.policy import Plan, StepOutcome
from edgespec.sampling import SamplingParams

if TYPE_CHECKING:
    from edgespec.engine import Engine

_FAST = 0.35  # EMA weight for acceptance levels: a handful of steps to turn around
_SLOW = 0.1  # EMA weight for the confidence calibration
_BUCKETS = 10
_NGRAM_LENGTHS = 40  # effective match lengths told apart (longer ones share the last)
_NGRAM_PRIOR = 0.3  # acceptance of a one-token match before any evidence
_PSEUDO = 2.0  # pseudo-observations pulling a length toward the one below it
_DECAY = 0.9  # per observation: evidence older than a dozen judgements fades
_CAUTION = 0.5  # standard deviations taken off thinly supported acceptance estimates
_EXPLORE_EVERY = 24  # steps between trials of a drafter that is not being chosen
_OPEN_PROPOSALS = 8
_MIN_GAIN = 1.08  # expected speed-up a drafting option needs over plain decoding


def expected_tokens(accept: np.ndarray) -> np.ndarray:
    """E[tokens] for γ = 0..len(accept): accept[i] is the chance that draft i+1 is
    accepted given the ones before it were."""
    return np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(accept))))


@dataclass
class AcceptanceStats:
    """Measured acceptance of each drafter."""

    # n-gram drafts: evidence on whether a proposed token is right given that the ones
    # before it in the proposal were, by its effective match length m (matched suffix plus
    # the proposal tokens before it): a copy in progress is a long match. Counts decay, so
    # the estimates follow the text.
    ngram_hits: np.ndarray = field(default_factory=lambda: np.zeros(_NGRAM_LENGTHS))
    ngram_seen: np.ndarray = field(default_factory=lambda: np.zeros(_NGRAM_LENGTHS))
    _ngram_estimates: np.ndarray | None = None
    # draft model: overall per-token acceptance, and calibration by the draft's confidence
    model: float = 0.6
    model_by_confidence: np.ndarray = field(
        default_factory=lambda: (np.arange(_BUCKETS) + 0.5) / _BUCKETS  # prior: calibrated
    )

    @staticmethod
    def _ema(old: float, hit: bool, weight: float) -> float:
        return (1 - weight) * old + weight * float(hit)

    @staticmethod
    def ngram_bucket(effective_len: int) -> int:
        return min(max(effective_len, 1), _NGRAM_LENGTHS) - 1

    def observe_ngram(self, effective_len: int, hit: bool) -> None:
        b = self.ngram_bucket(effective_len)
        self.ngram_hits[b] = _DECAY * self.ngram_hits[b] + hit
        self.ngram_seen[b] = _DECAY * self.ngram_seen[b] + 1
        self._ngram_estimates = None

    def ngram_estimates(self) -> np.ndarray:
        """Acceptance by effective length. Each length's evidence is smoothed toward the
        estimate for one token shorter (a few pseudo-observations), so a length with no
        evidence of its own behaves like the longest one that has some: a copy that holds
        is trusted to go on, until the lengths where copies end have been seen."""
        if self._ngram_estimates is None:
            estimates = np.empty(_NGRAM_LENGTHS)
            prior = _NGRAM_PRIOR
            for m in range(_NGRAM_LENGTHS):
                seen = self.ngram_seen[m] + _PSEUDO
                prior = (self.ngram_hits[m] + _PSEUDO * prior) / seen
                # Price with a lower confidence bound: where evidence is thin (lengths no
                # copy has reached yet) a bet on a long draft must not rest on a guess.
                estimates[m] = max(0.0, prior - _CAUTION * math.sqrt(prior * (1 - prior) / seen))
            self._ngram_estimates = estimates
        return self._ngram_estimates

    def ngram_acceptance(self, match_len: int, length: int) -> np.ndarray:
        lengths = np.minimum(max(match_len, 1) + np.arange(length), _NGRAM_LENGTHS)
        return self.ngram_estimates()[lengths - 1]

    def model_acceptance(self, confidence: float) -> float:
        return float(self.model_by_confidence[min(int(confidence * _BUCKETS), _BUCKETS - 1)])

    def observe_model(self, confidences: list[float], accepted: int) -> None:
        for i, confidence in enumerate(confidences[: accepted + 1]):
            hit = i < accepted
            self.model = self._ema(self.model, hit, _FAST)
            b = min(int(confidence * _BUCKETS), _BUCKETS - 1)
            self.model_by_confidence[b] = self._ema(self.model_by_confidence[b], hit, _SLOW)


@dataclass
class _OpenProposal:
    match_len: int
    tokens: list[int]
    judged: int = 0


@dataclass
class Choice:
    drafter: str
    gamma: int
    rate: float  # expected tokens per second
    expected: float  # expected tokens from the step
    seconds: float  # expected seconds of the step


class AdaptivePolicy:
    """Chooses drafter and γ per step from measured costs and acceptance."""

    prefill_draft = False  # the draft model catches up only when it is chosen

    def __init__(
        self,
        costs: CostModel,
        drafters: tuple[str, ...] = ("ngram", "model"),
        gamma_cap: int | None = None,
        fixed_gamma: int | None = None,
        stats: AcceptanceStats | None = None,
    ):
        self.costs = costs
        self.allowed = drafters
        self.gamma_cap = gamma_cap
        self.fixed_gamma = fixed_gamma
        self.stats = stats or AcceptanceStats()
        self._steps = 0
        self._last_used = {name: 0 for name in drafters}
        # Recent n-gram proposals, used or not, judged against the text as it is committed.
        self._open: deque[_OpenProposal] = deque(maxlen=_OPEN_PROPOSALS)
        self._expected = 1.0  # expected tokens of the model draft being built
        self._included_p = 1.0  # chance that every draft included so far is accepted
        self._catch_up_s = 0.0
        self._first_draft_s = 0.0

    # -- construction -------------------------------------------------------------------

    @classmethod
    def for_engine(cls, engine: Engine, drafter: str = "auto", gamma: int | str = "auto") -> AdaptivePolicy:
        """The policy for ``--drafter X --gamma Y`` where at least one of them is auto.
        Costs and statistics live on the engine, so they carry over between requests."""
        if drafter == "auto":
            names = tuple(n for n in ("ngram", "model") if n in engine.drafters)
        elif drafter == "none":
            names = ()
        elif drafter in engine.drafters:
            names = (drafter,)
        else:
            raise EdgespecError(f"drafter '{drafter}' needs a draft model, and none is loaded")
        fixed = None if gamma == "auto" else int(gamma)
        if fixed is not None and fixed < 0:
            raise EdgespecError(f"gamma must be >= 0 (got {fixed})")
        state = engine_state(engine)
        return cls(state.costs, names, gamma_cap=engine.max_gamma, fixed_gamma=fixed, stats=state.stats)

    def check(self, engine: Engine) -> None:
        if self.fixed_gamma is not None and self.fixed_gamma > engine.max_gamma:
            raise EdgespecError(
                f"gamma {self.fixed_gamma} is larger than this engine allows ({engine.max_gamma})"
            )

    # -- pricing ------------------------------------------------------------------------

    def _verify_seconds(self, gammas: np.ndarray) -> np.ndarray:
        table = self.costs.target.table()
        return table[np.minimum(gammas + 1, len(table) - 1)] + self.costs.overhead

    def _best(self, drafter: str, accept: np.ndarray, fixed_cost: float, per_draft: float) -> Choice:
        gammas = np.arange(1, len(accept) + 1)
        if self.fixed_gamma is not None:
            gammas = gammas[gammas == min(self.fixed_gamma, len(accept))]
        if gammas.size == 0:
            return Choice(drafter, 0, 0.0, 1.0, 1.0)
        expected = expected_tokens(accept)[gammas]
        seconds = self._verify_seconds(gammas) + fixed_cost + per_draft * (gammas - 1)
        rates = expected / seconds
        i = int(np.argmax(rates))
        return Choice(drafter, int(gammas[i]), float(rates[i]), float(expected[i]), float(seconds[i]))

    def choices(self, engine: Engine, context: list[int], budget: int) -> list[Choice]:
        """Every option for the next step, priced."""
        plain = self.costs.target.estimate(1) + self.costs.overhead
        options = [Choice("none", 0, 1.0 / plain, 1.0, plain)]
        cap = min(budget, self.gamma_cap or budget)
        if cap <= 0:
            return options
        if "ngram" in self.allowed:
            ngram: NgramDrafter = engine.drafters["ngram"]
            proposal, n = ngram.lookup(context, cap)
            if proposal:
                self._open.append(_OpenProposal(n, proposal))
                accept = self.stats.ngram_acceptance(n, len(proposal))
                options.append(self._best("ngram", accept, 0.0, 0.0))
        if "model" in self.allowed:
            drafter: ModelDrafter = engine.drafters["model"]
            catch_up = drafter.catch_up_cost_tokens(context)
            first = self.costs.draft.estimate(catch_up)
            self._catch_up_s = first
            per_draft = self.costs.draft.estimate(1)
            options.append(self._best("model", np.full(cap, self.stats.model), first, per_draft))
        return options

    def plan(self, engine: Engine, context: list[int], budget: int, params: SamplingParams) -> Plan:
        self._steps += 1
        options = self.choices(engine, context, budget)
        if self.fixed_gamma == 0 or not self.allowed:
            options = options[:1]
        # Drafting must beat plain decoding clearly: its estimates are noisy, and a wrong
        # bet on a steep CPU cost curve loses more than a right one wins.
        plain = options[0]
        drafting = [c for c in options[1:] if c.rate > plain.rate * _MIN_GAIN]
        best = max(drafting, key=lambda c: c.rate) if drafting else plain
        # A drafter that is never chosen is never measured: try it now and then while its
        # best case (near-perfect acceptance) could still beat the current choice.
        for option in options:
            name = option.drafter
            if name != "model" or name == best.drafter:
                continue  # n-gram proposals are judged for free at every step anyway
            if self._steps - self._last_used.get(name, 0) >= _EXPLORE_EVERY and self._could_win(option, best):
                best = Choice(
                    name, max(1, min(option.gamma, 4)), option.rate, option.expected, option.seconds
                )
                break
        if best.drafter != "none":
            self._last_used[best.drafter] = self._steps
        reason = ", ".join(f"{c.drafter}:{c.gamma}@{c.rate:.1f}/s" for c in options)
        self._expected, self._included_p = 1.0, 1.0
        self._first_draft_s = self._catch_up_s
        keep_going = self._keep_going if best.drafter == "model" and self.fixed_gamma is None else None
        return Plan(best.drafter, best.gamma, keep_going, reason)

    def _could_win(self, option: Choice, best: Choice) -> bool:
        optimistic = expected_tokens(np.full(max(option.gamma, 1), 0.95))[-1] / option.seconds
        return optimistic > best.rate

    def _keep_going(self, i: int, confidence: float) -> bool:
        """Draft token i (0-based) has confidence ``confidence``: include it? Token 0 always
        is. Token i is included only if what it adds in expectation, per second it costs
        (one more verified position, and the draft decode that follows it), beats the
        expected rate of the step as it stands."""
        p_new = self._included_p * self.stats.model_acceptance(confidence)
        if i > 0:
            target, per_draft = self.costs.target, self.costs.draft.estimate(1)
            seconds = self._first_draft_s + i * per_draft + target.estimate(i + 1) + self.costs.overhead
            marginal = target.estimate(i + 2) - target.estimate(i + 1) + per_draft
            if p_new / max(marginal, 1e-6) < self._expected / seconds:
                return False
        self._included_p = p_new
        self._expected += p_new
        return True

    # -- learning -----------------------------------------------------------------------

    def observe(self, outcome: StepOutcome) -> None:
        costs = self.costs
        costs.observe_overhead(outcome.overhead_s)
        costs.target.observe(outcome.gamma + 1, outcome.verify_s)
        for k, seconds in outcome.draft.decodes:
            costs.draft.observe(k, seconds)
        if outcome.drafter == "model":
            self.stats.observe_model(outcome.draft.confidences, outcome.accepted)
        self._judge_open_proposals(outcome.new_tokens)

    def _judge_open_proposals(self, committed: list[int]) -> None:
        """Each committed token confirms or refutes the next token of every open n-gram
        proposal: free, counterfactual evidence of how n-gram drafts would fare (exact
        under greedy decoding; under sampling, a match happens with the probability an
        accepted one-hot draft has)."""
        for token in committed:
            for proposal in list(self._open):
                hit = proposal.tokens[proposal.judged] == token
                self.stats.observe_ngram(proposal.match_len + proposal.judged, hit)
                proposal.judged += 1
                if not hit or proposal.judged == len(proposal.tokens):
                    self._open.remove(proposal)


@dataclass
class EngineState:
    costs: CostModel
    stats: AcceptanceStats


def engine_state(engine: Engine) -> EngineState:
    """Cost model and statistics of an engine, created (and warmed up) on first use."""
    state = getattr(engine, "_controller_state", None)
    if state is None:
        draft_model = engine.drafters["model"].model if "model" in engine.drafters else None
        costs = CostModel.empty(engine.max_gamma + 1)
        costs.profile_path = profile_path(engine.target, draft_model)
        if not costs.load():
            warm_up(engine.target, costs.target, _TARGET_WARMUP, all_logits=True)
            if draft_model is not None:
                warm_up(draft_model, costs.draft, _DRAFT_WARMUP, all_logits=False)
            costs.save()
        state = EngineState(costs=costs, stats=AcceptanceStats())
        engine._controller_state = state
    return state


def describe(costs: CostModel) -> str:
    """One line of what was measured, for --verbose and the bench header."""
    t = costs.target
    points = [
        f"T({k})={1000 * t.estimate(k):.0f}ms" for k in (1, 2, 5, 9, 17) if not math.isnan(t.estimate(k))
    ]
    d = costs.draft.estimate(1)
    return " ".join(points) + (f" draft={1000 * d:.0f}ms/token" if not math.isnan(d) else "")

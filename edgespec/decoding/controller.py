"""The cost-aware controller behind ``--drafter auto --gamma auto``.

Before every step it prices each way of taking the step with the measured cost model
(edgespec.decoding.costs) and the measured acceptance statistics below, and picks the one with
the highest expected tokens per second:

* plain decoding (γ = 0): 1 token for one single-token target pass;
* each lookup drafter (token n-grams, and "reflow", the same on text blind to line
  wrapping): its proposal (free to compute) with γ chosen so that
  E[tokens] / (T(γ+1) + overhead) is largest, E from the measured acceptance of that
  drafter's drafts with the same match length, kept apart for a proposal whose next token
  another lookup also proposes (two copies from different places that agree are right
  about twice as often at short matches) and one alone;
* the draft model: catch-up decode + (γ−1) draft decodes + T(γ+1); while drafting it
  stops early once the next token's expected gain per second (from the draft's own
  confidence, calibrated by measured acceptance) falls below the step's rate so far. Its
  prompt prefill is shared by the steps the answer has left (few, in an answer that
  copies); a catch-up after steps of other options, by the few steps a return lasts.

On a GPU the first two plain steps after a drafting step cost more than plain steps
(llama.cpp rebuilds its graph for the new size): the controller learns that excess from the
plain steps that follow its drafting and charges it to any step that would start drafting
after plain steps, where it is worth pricing (on a CPU it is noise around zero).

A draft longer than one token risks only what the answer can afford: what drafting has
saved in it so far plus a small share of its plain decoding time (_RISK_SHARE). On a steep
CPU, where a failed 16-token draft costs ten plain steps, an answer drafts long only once
its copies have paid for the bet; on a GPU the bound never binds.

With p the probability that each next draft is accepted, a step that verifies γ drafts
yields E = 1 + p + p² + … + p^γ tokens (the accepted prefix plus the target's token).

Statistics react within a few steps (decayed counts whose prior weighs a couple of
observations, not a dozen), and the lookup drafters' acceptance is also scored
counterfactually at every step (did their proposals match what the target committed?), so
the controller notices at once when text turns repetitive, and which of them copies the
way this answer does.

It also checks itself: predictions come from a model, so it keeps what the steps it took
actually delivered (tokens and seconds per option, and of plain decoding), and stops
choosing an option whose realized rate falls below plain decoding's by more than luck
explains (its tokens per step vary; its seconds, if priced right, do not). The option is
banned for a while (longer each time), and a lookup drafter's ban ends early when its
proposals, judged for free, turn out right again. The draft model, whose acceptance
cannot be judged without drafting, is tried for a few steps early on wherever its best
case could pay, once in every answer after its first few steps, and now and then
afterwards, so a machine where it pays (a GPU, Apple Silicon) is found within a few steps.

Where nothing comes near paying (a steep CPU, over text that nothing copies, with a draft
model that cannot pay there even at its best), it stops looking for a while: 1, 2, 4, then
at most 8 steps at a time without lookups or pricing, until a proposal it did look at
proves right for two tokens in a row.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from edgespec.decoding.costs import CostModel, load_or_measure
from edgespec.decoding.drafters import LookupDrafter, ModelDrafter
from edgespec.decoding.policy import LINE_BREAK, Plan, StepOutcome, StepView
from edgespec.errors import EdgespecError
from edgespec.runtime.model import Model

# The draft model's per-token acceptance: decayed counts of its judged tokens, so it follows
# the last two dozen or so (six or seven steps of four). A draft's tokens are right in runs
# (a stretch of arithmetic it gets, a name it does not): with a memory of a dozen, two failed
# steps in a row priced a draft that pays 1.2x on math below plain decoding, and it waited
# for its next trial. Each answer starts with a fifth of the last one's evidence
# (_CARRY_OVER): how well the draft does depends on the text.
_MODEL_DECAY = 0.96
_MODEL_PRIOR = 0.6  # before any evidence
# ... worth this many judged tokens: a first step or two of the draft's own outweighs it
# (as an EMA from the prior, the first dozen tokens would be needed)
_MODEL_PSEUDO = 2.0
_SLOW = 0.1  # EMA weight for the confidence calibration
_BUCKETS = 10
# Effective match lengths are pooled into roughly geometric buckets (1, 2, 3, 4-5, 6-8, …,
# 41+): a copy's chance to go on changes fast over its first tokens and slowly after, and
# a wide bucket gathers evidence in a few steps where one per length would stay empty.
_LENGTH_EDGES = np.array([1, 2, 3, 4, 6, 9, 13, 19, 27, 41, 61, 91])
# The bucket of every effective length up to the last edge (a longer one is in the last
# bucket), and of each token of a proposal by its match length (row) and index (column):
# looked up at every step for every judged and proposed token, where a search would cost more.
_LONGEST_EDGE = int(_LENGTH_EDGES[-1])
_BUCKET_OF = (np.searchsorted(_LENGTH_EDGES, np.arange(_LONGEST_EDGE + 1).clip(1), side="right") - 1).tolist()
_BUCKETS_FROM = np.array(_BUCKET_OF)[
    np.minimum(np.add.outer(np.arange(_LONGEST_EDGE + 1), np.arange(_LONGEST_EDGE + 1)), _LONGEST_EDGE)
]
_LOOKUP_PRIOR = 0.3  # acceptance of a one-token match before any evidence
# Evidence is kept apart for a proposal alone and one whose first token another lookup
# also proposes (more levels, or agreeing on more tokens, split the evidence for no gain).
_AGREEMENT_LEVELS = 2
_CROSS_PRIOR = 0.5  # chance a copy goes on past a sentence or line end, before evidence
_CROSS_PSEUDO = 2.0
_CROSS_DECAY = 0.9  # boundaries are rarer than tokens: remember the last ten or so
_PSEUDO = 1.0  # pseudo-observations pulling a bucket toward the one below it
_DECAY = 0.97  # per observation: a bucket remembers its last few dozen judgements
_CAUTION = 1.0  # standard deviations taken off thinly supported acceptance estimates
_EXPLORE_EVERY = 24  # steps between trials of a drafter that is not being chosen
_MAX_EXPLORE_EVERY = 96  # ... doubled after every trial whose first draft token failed, up to this
_OPEN_PROPOSALS = 8
_MIN_GAIN = 1.08  # expected speed-up a lookup option needs over plain decoding
# ... and the draft model: its estimate is the measured acceptance of its own recent tokens,
# not the best of several noisy proposals (which favours the ones that came out too high)
_MODEL_GAIN = 1.04
_REALIZED_DECAY = 0.85  # per step of an option: its realized rate follows the last ten or so
_REALIZED_EVIDENCE = 2.5  # (decayed) steps of an option before its realized rate is trusted
_REALIZED_MARGIN = 0.98  # an option realizing less than this share of plain decoding's rate loses
# ... by more than this many standard errors of its tokens per step: a draft model that
# pays 1.2x at 60 % acceptance makes 1, 2 or 3 tokens a step, and three steps of bad luck
# are no evidence that its costs were mispriced
_REALIZED_DOUBT = 1.0
_REALIZED_SPREAD = 1.0  # squared tokens of spread a step is assumed to have before evidence
_BAN_STEPS = 12  # steps a losing option is left out the first time; doubled at every new ban
_MAX_BAN = 192
_CONFIRMING_RUN = 8  # a banned lookup drafter whose proposal this long proves right is let back
_CALIBRATION_DECAY = 0.9  # per chosen step: the last ten or so steps of an option count
_CALIBRATION_PSEUDO = 3.0  # tokens of evidence that the predictions were right, before any
_CARRY_OVER = 0.2  # share of the drafters' evidence of earlier answers a new answer starts with
_PREFILL_BATCH = 4  # a draft decode of more tokens than this is a catch-up prefill, not drafting
_EARLY_TRIALS = 3  # draft-model steps tried early where its best case could pay
# ... and once in every answer (the last answer's text may not be this one's), after this
# many steps: before them the draft model does not read a new prompt (but for early trials)
_SETTLE_STEPS = 5
_OPTIMISTIC = 0.9  # per-token acceptance of the draft model's best case
# ... once the draft has drafted in this answer: at most its measured acceptance plus this
# many standard errors. Every trial pays a catch-up and a step verified at a loss where the
# draft fails (a translation on the F16 stand-in: three trials cost 9 % of the answer).
_TRIAL_DOUBT = 1.0
_RETURN_STEPS = 4  # model steps that share the catch-up of a return to the draft model
# Where no drafting option comes within this share of plain decoding's rate, and the draft
# model cannot pay even at its best (a steep CPU, over text nothing copies), planning is
# skipped for a while: planning (the lookups and their pricing) takes 0.4 ms of the 0.7 ms
# of Python around each step on the AVX-512 EPYC (a step: 31 ms), and most steps of
# a chat or a translation there decode plainly anyway.
_IDLE_RATIO = 0.85
_MAX_IDLE = 8  # most steps skipped in a row: a copy that starts is seen within this many
_WAKING_RUN = 2  # tokens in a row a proposal looked at must get right to end the skipping
_TRIAL_ODDS = 2.0  # a trial of the draft model must promise this multiple of its switch cost
# A draft may be longer than one token only by what the answer can afford to lose if its
# first token fails: what drafting has saved in this answer so far, plus this share of the
# answer's plain decoding time (counted over at least _RISK_TOKENS tokens: the promise is
# 0.97x plain decoding on every answer of 64 tokens or more). On a steep CPU a failed
# 16-token draft costs ten plain steps, a tenth of a short answer, however good its odds
# looked (replayed, such bets made 3 of 22 dev answers on the AVX-512 EPYC's curve 5-9 %
# slower than plain decoding); on a GPU a 64-token draft risks a step or two, and the
# bound never binds. What drafting at all costs (a catch-up, a return to plain steps) is
# priced with the rest, not bounded here.
_RISK_SHARE = 0.03
_RISK_TOKENS = 64
_TRIAL_GAMMA = 4  # tokens a trial of the draft model drafts
# On a GPU the first two single-token passes after a multi-token one cost more (llama.cpp
# rebuilds its graph, CUDA captures it again: 1-5 ms more each on an H200, where a token
# takes 1.8 ms). A step that starts drafting after plain steps is charged that return, as
# learned from the plain steps that followed earlier drafting, where it is worth pricing:
# above this share of a single-token pass (on a CPU it is noise around zero).
_RETURN_SIGNIFICANT = 0.1
_RETURN_EMA = 0.3
LOOKUP_DRAFTERS = ("ngram", "reflow", "copy")  # draftless: proposals copied out of the context
AUTO_DRAFTERS = (*LOOKUP_DRAFTERS, "model")  # what auto chooses among


def expected_tokens(accept: np.ndarray) -> np.ndarray:
    """E[tokens] for γ = 0..len(accept): accept[i] is the chance that draft i+1 is
    accepted given the ones before it were."""
    return np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(accept))))


Rate = float | np.ndarray  # one estimate, or one per bucket


def posterior_mean(hits: Rate, seen: Rate, prior: Rate, pseudo: float) -> Rate:
    """Decayed counts of hits among judged tokens, pulled toward ``prior`` as if it had
    been seen ``pseudo`` times: the one smoothing every acceptance estimate here uses."""
    return (hits + pseudo * prior) / (seen + pseudo)


# Tokens a draft-model step of γ = 4 makes at the prior's 60 % per token: the pace at which
# the rest of an answer would share the draft's prompt prefill, before the answer shows its own.
_MODEL_PACE = float(expected_tokens(np.full(4, 0.6))[-1])


class LookupStats:
    """Measured acceptance of one lookup drafter's proposals: evidence on whether a
    proposed token is right given that the ones before it in the proposal were, by its
    effective match length m (matched suffix plus the proposal tokens before it): a copy
    in progress is a long match. Counts decay, so the estimates follow the text.

    Tokens right after the end of a sentence or a line of the source are scored apart: that
    is where copies end (a bullet summary starts a new bullet where its source ran on; an
    answer that quotes one sentence stops after it), or, in an edit, where they go on line
    after line. Which of the two this answer does is learned like the rest, so a draft
    stops at a boundary exactly when the answer keeps leaving the source there."""

    def __init__(self) -> None:
        # by agreement (does another lookup propose the same first token?), then length
        self.hits = np.zeros((_AGREEMENT_LEVELS, len(_LENGTH_EDGES)))
        self.seen = np.zeros((_AGREEMENT_LEVELS, len(_LENGTH_EDGES)))
        self.cross_hits = 0.0
        self.cross_seen = 0.0
        # per agreement level, rebuilt after that level's evidence changed
        self._estimates: list[np.ndarray | None] = [None] * _AGREEMENT_LEVELS
        self._cross: float | None = None

    def observe(self, effective_len: int, hit: bool, *, crossing: bool = False, agreement: int = 0) -> None:
        if crossing:
            self.cross_hits = _CROSS_DECAY * self.cross_hits + hit
            self.cross_seen = _CROSS_DECAY * self.cross_seen + 1
            self._cross = None
            return
        b = _BUCKET_OF[min(effective_len, _LONGEST_EDGE)]
        self.hits[agreement, b] = _DECAY * self.hits[agreement, b] + hit
        self.seen[agreement, b] = _DECAY * self.seen[agreement, b] + 1
        self._estimates[agreement] = None

    def soften(self, keep: float) -> None:
        """Keep only a share of the evidence (see AcceptanceStats.soften)."""
        self.hits *= keep
        self.seen *= keep
        self.cross_hits *= keep
        self.cross_seen *= keep
        self._estimates = [None] * _AGREEMENT_LEVELS
        self._cross = None

    def crossing(self) -> float:
        """Chance that a copy goes on past a boundary of its source. A plain posterior mean,
        not a lower bound: boundaries come every line or sentence, so evidence arrives fast,
        and the copy's acceptance around them is already priced cautiously."""
        if self._cross is None:
            self._cross = posterior_mean(self.cross_hits, self.cross_seen, _CROSS_PRIOR, _CROSS_PSEUDO)
        return self._cross

    def estimates(self, agreement: int = 0) -> np.ndarray:
        """Acceptance by length bucket, for proposals at this agreement level. Each
        bucket's evidence is smoothed toward the estimate for the bucket below (a
        pseudo-observation), so a bucket with no evidence of its own behaves like the
        longest one that has some: a copy that holds is trusted to go on, until the lengths
        where copies end have been seen."""
        row = self._estimates[agreement]
        if row is None:
            # Rebuilt at most once a step (every step brings evidence), 12 scalars: plain
            # floats, as numpy calls on arrays this small would cost several times more.
            prior, values = _LOOKUP_PRIOR, []
            for h, n in zip(self.hits[agreement].tolist(), self.seen[agreement].tolist(), strict=True):
                prior = (h + _PSEUDO * prior) / (n + _PSEUDO)  # posterior_mean, inlined
                # Price with a lower confidence bound: where evidence is thin (lengths no
                # copy has reached yet) a bet on a long draft must not rest on a guess.
                values.append(max(0.0, prior - _CAUTION * math.sqrt(prior * (1 - prior) / (n + _PSEUDO))))
            row = self._estimates[agreement] = np.array(values)
        return row

    def acceptance(
        self, match_len: int, length: int, crossings: np.ndarray | None = None, agreement: int = 0
    ) -> np.ndarray:
        buckets = _BUCKETS_FROM[min(match_len, _LONGEST_EDGE), :length]
        if length > len(buckets):  # longer than any bucket edge: the rest is in the last
            buckets = np.concatenate((buckets, np.full(length - len(buckets), _BUCKET_OF[-1])))
        accept = self.estimates(agreement)[buckets]
        if crossings is not None and crossings.any():
            accept = np.where(crossings[:length], self.crossing(), accept)
        return accept


@dataclass
class AcceptanceStats:
    """Measured acceptance of each drafter."""

    # lookup drafters (n-gram, reflow), by name
    lookup: dict[str, LookupStats] = field(
        default_factory=lambda: {name: LookupStats() for name in LOOKUP_DRAFTERS}
    )
    # draft model: overall per-token acceptance, and calibration by the draft's confidence
    model: float = _MODEL_PRIOR  # (as constructed: the prior, before any evidence)
    model_hits: float = 0.0  # decayed counts of the draft model's judged tokens
    model_seen: float = 0.0
    model_by_confidence: np.ndarray = field(
        default_factory=lambda: (np.arange(_BUCKETS) + 0.5) / _BUCKETS  # prior: calibrated
    )

    @staticmethod
    def _ema(old: float, hit: bool, weight: float) -> float:
        return (1 - weight) * old + weight * float(hit)

    # decayed count of judged draft tokens per confidence bucket: how sure each entry is
    model_confidence_seen: np.ndarray = field(default_factory=lambda: np.zeros(_BUCKETS))

    @staticmethod
    def _confidence_bucket(confidence: float) -> int:
        return min(int(confidence * _BUCKETS), _BUCKETS - 1)

    def model_acceptance(self, confidence: float, *, optimistic: bool = False) -> float:
        """Chance that a draft token with this confidence is accepted. ``optimistic`` adds
        one standard error where the bucket has little evidence: a draft that is always cut
        before its less confident tokens would never learn that those are often right."""
        b = self._confidence_bucket(confidence)
        p = float(self.model_by_confidence[b])
        if optimistic:
            p = min(1.0, p + math.sqrt(p * (1 - p) / (self.model_confidence_seen[b] + 1.0)))
        return p

    model_steps: int = 0  # steps the draft model has drafted for this pair

    def __post_init__(self) -> None:
        self._model_prior = self.model

    def observe_model(self, confidences: list[float], accepted: int) -> None:
        self.model_steps += 1
        for i, confidence in enumerate(confidences[: accepted + 1]):
            hit = i < accepted
            self.model_hits = _MODEL_DECAY * self.model_hits + hit
            self.model_seen = _MODEL_DECAY * self.model_seen + 1.0
            b = self._confidence_bucket(confidence)
            self.model_by_confidence[b] = self._ema(self.model_by_confidence[b], hit, _SLOW)
            self.model_confidence_seen *= _DECAY
            self.model_confidence_seen[b] += 1.0
        self._update_model()

    def _update_model(self) -> None:
        self.model = posterior_mean(self.model_hits, self.model_seen, self._model_prior, _MODEL_PSEUDO)

    def soften(self, keep: float) -> None:
        """Keep only a share of every drafter's evidence, as a new answer starts: how well
        each drafts depends on the text (an edit after a summary, a sum after a chat), so
        what the last answer showed is a weak prior for this one, not a verdict."""
        for lookup in self.lookup.values():
            lookup.soften(keep)
        self.model_hits *= keep
        self.model_seen *= keep
        self._update_model()

    def model_upper(self, doubt: float) -> float:
        """The draft model's acceptance plus ``doubt`` standard errors of its evidence (a
        few tokens' worth, as the counts decay): what it could still turn out to be."""
        p = self.model
        return min(1.0, p + doubt * math.sqrt(p * (1 - p) / (self.model_seen + _MODEL_PSEUDO)))


class RealizedRates:
    """What the steps taken actually delivered, per option ("none" for plain decoding):
    decayed sums of tokens and of seconds (drafting, verifying and the Python around it)."""

    def __init__(self) -> None:
        self._tokens: dict[str, float] = {}
        self._squares: dict[str, float] = {}  # of tokens per step: their spread
        self._seconds: dict[str, float] = {}
        self._steps: dict[str, float] = {}
        self._drafted: dict[str, float] = {}
        self._accepted: dict[str, float] = {}
        self._predicted: dict[str, float] = {}  # extra tokens predicted for the chosen steps
        self._delivered: dict[str, float] = {}  # ... and accepted

    def observe(self, option: str, tokens: int, seconds: float, drafted: int = 0, accepted: int = 0) -> None:
        if seconds <= 0:
            return
        d = _REALIZED_DECAY
        for table, value in (
            (self._tokens, tokens),
            (self._squares, tokens * tokens),
            (self._seconds, seconds),
            (self._steps, 1),
            (self._drafted, drafted),
            (self._accepted, accepted),
        ):
            table[option] = d * table.get(option, 0.0) + value

    def calibrate(self, option: str, predicted_extra: float, accepted: int) -> None:
        """The tokens beyond one that a chosen step was predicted to yield, against what it
        yielded: choosing the best of several noisy estimates favours the ones that came
        out too high, and this measures by how much."""
        self._predicted[option] = _CALIBRATION_DECAY * self._predicted.get(option, 0.0) + predicted_extra
        self._delivered[option] = _CALIBRATION_DECAY * self._delivered.get(option, 0.0) + accepted

    def calibration(self, option: str) -> float:
        """Delivered over predicted extra tokens, pulled toward 1 while evidence is thin."""
        predicted = self._predicted.get(option, 0.0) + _CALIBRATION_PSEUDO
        delivered = self._delivered.get(option, 0.0) + _CALIBRATION_PSEUDO
        return min(max(delivered / predicted, 0.2), 1.2)

    def acceptance(self, option: str) -> float:
        drafted = self._drafted.get(option, 0.0)
        return self._accepted.get(option, 0.0) / drafted if drafted > 0 else 0.0

    def rate(self, option: str, doubt: float = 0.0) -> float | None:
        """Tokens per second, once there is enough evidence for it; with ``doubt`` > 0, the
        rate the steps could have realized with that many standard errors more tokens (an
        upper bound: luck, not a wrong price, may explain a low rate)."""
        steps = self._steps.get(option, 0.0)
        if steps < _REALIZED_EVIDENCE:
            return None
        tokens = self._tokens[option]
        if doubt > 0.0:
            spread = (max(self._squares[option] - tokens * tokens / steps, 0.0) + _REALIZED_SPREAD) / steps
            tokens += doubt * math.sqrt(spread * steps)
        return tokens / self._seconds[option]

    def forget(self, option: str) -> None:
        for table in (self._tokens, self._squares, self._seconds, self._steps, self._drafted, self._accepted):
            table.pop(option, None)


@dataclass
class _OpenProposal:
    drafter: str
    match_len: int
    tokens: list[int]
    crossings: np.ndarray | None = None  # token i follows a sentence or line end
    agreement: int = 0  # 1: another lookup proposed the same first token
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
        drafters: tuple[str, ...] = AUTO_DRAFTERS,
        gamma_cap: int | None = None,
        fixed_gamma: int | None = None,
        stats: AcceptanceStats | None = None,
    ):
        self.costs = costs
        self.allowed = drafters
        self.gamma_cap = gamma_cap
        self.fixed_gamma = fixed_gamma
        self.stats = stats or AcceptanceStats()
        self.stats.soften(_CARRY_OVER)
        self._steps = 0
        self._last_used = {name: 0 for name in drafters}
        # Recent lookup proposals, used or not, judged against the text as it is committed.
        self._open: deque[_OpenProposal] = deque(maxlen=_OPEN_PROPOSALS * len(LOOKUP_DRAFTERS))
        self._expected = 1.0  # expected tokens of the model draft being built
        self._included_p = 1.0  # chance that every draft included so far is accepted
        self._catch_up_s = 0.0
        self._switch_s = 0.0  # of the catch-up, what switching to the draft model costs (a prefill)
        self._exploring = False  # the step planned is a trial of the draft model
        # Steps between trials: every trial pays a catch-up, so one whose draft failed at
        # once makes the next wait twice as long (a translation the draft cannot do).
        self._explore_every = _EXPLORE_EVERY
        self._first_draft_s = 0.0
        self._draft_synced = False  # the draft model has drafted in this answer (read its prompt)
        self._saved_s = 0.0  # what drafting saved in this answer over plain steps (negative: lost)
        self._risk_budget = 0.0  # the most a longer draft may add to a step that fails at once
        self._answer_tokens = 0  # tokens and target passes of this answer so far
        self._answer_passes = 0
        self.realized = RealizedRates()
        self._chosen: Choice | None = None
        self._verify_row = np.zeros(0)  # seconds to verify γ = 1, 2, … drafts, priced per step
        self._last_size = 0  # tokens of the last target pass (see CostCurve.observe)
        self._plain_since_draft = 2  # plain steps since the last drafting step, up to 2
        # What the first and the second plain step after drafting cost beyond a plain
        # step: carried between answers (a property of the machine, not of the text).
        self._return_excess = costs.return_excess
        self._idle = 0  # plans in a row where nothing came near paying
        self._idle_until = 0  # first step planned again
        self._banned: dict[str, int] = {}  # option -> first step it may be chosen again
        self._strikes: dict[str, int] = {}
        # Banned because its drafts failed (not because its steps cost more than priced):
        # then proposals judged right again are the new evidence that lifts the ban.
        self._failed_drafts: set[str] = set()

    # -- construction -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        state: ControllerState,
        loaded: Collection[str],
        max_gamma: int,
        drafter: str = "auto",
        gamma: int | str = "auto",
    ) -> AdaptivePolicy:
        """The policy for ``--drafter X --gamma Y`` where at least one of them is auto,
        over the drafters ``loaded``. ``state`` (costs and statistics of the loaded pair)
        is owned by the caller, so what one request learns carries over to the next."""
        if drafter == "auto":
            names = tuple(n for n in AUTO_DRAFTERS if n in loaded)
        elif drafter == "none":
            names = ()
        elif drafter in loaded:
            names = (drafter,)
        else:
            raise EdgespecError(f"drafter '{drafter}' needs a draft model, and none is loaded")
        fixed = None if gamma == "auto" else int(gamma)
        if fixed is not None and fixed < 0:
            raise EdgespecError(f"gamma must be >= 0 (got {fixed})")
        return cls(state.costs, names, gamma_cap=max_gamma, fixed_gamma=fixed, stats=state.stats)

    def check(self, drafters: Collection[str], max_gamma: int) -> None:
        if self.fixed_gamma is not None and self.fixed_gamma > max_gamma:
            raise EdgespecError(f"gamma {self.fixed_gamma} is larger than this engine allows ({max_gamma})")

    # -- pricing ------------------------------------------------------------------------

    def _verify_seconds(self, gammas: np.ndarray) -> np.ndarray:
        table = self.costs.target.table()
        return table[np.minimum(gammas + 1, len(table) - 1)] + self.costs.overhead

    def _best(
        self, drafter: str, accept: np.ndarray, fixed_cost: float, per_draft: float, calibration: float = 1.0
    ) -> Choice:
        """The best γ for a drafter whose i-th draft is accepted with chance accept[i], at
        ``fixed_cost`` + ``per_draft`` × (γ − 1) seconds of drafting. (Runs for every option
        at every planned step: the verification costs come from ``_verify_row``, and the
        arrays are the length of the proposal.)"""
        longest = len(accept) if self.fixed_gamma is None else min(self.fixed_gamma, len(accept))
        if self.fixed_gamma is None:
            # Only γ whose worst case the answer can afford (_RISK_SHARE).
            worst = self._verify_row[:longest] - self._verify_row[0]
            if per_draft:
                worst = worst + per_draft * np.arange(longest)
            too_dear = worst > max(self._risk_budget, 0.0)
            if too_dear.any():
                longest = int(too_dear.argmax())
        if longest < 1:
            return Choice(drafter, 0, 0.0, 1.0, 1.0)
        # expected_tokens(accept)[γ] - 1, without building the γ = 0 entry
        extra = np.cumsum(np.cumprod(accept[:longest]))
        if self.fixed_gamma is None:
            seconds = self._verify_row[:longest]
        else:
            extra, seconds = extra[longest - 1 : longest], self._verify_row[longest - 1 : longest]
        if fixed_cost:
            seconds = seconds + fixed_cost
        if per_draft:  # γ − 1 draft decodes after the first
            seconds = seconds + per_draft * np.arange(longest - len(seconds), longest)
        expected = 1.0 + calibration * extra
        rates = expected / seconds
        i = int(rates.argmax())
        gamma = i + 1 if self.fixed_gamma is None else longest
        return Choice(drafter, gamma, float(rates[i]), float(expected[i]), float(seconds[i]))

    def choices(self, view: StepView) -> list[Choice]:
        """Every option for the next step, priced."""
        context, budget = view.context, view.budget
        plain = self._plain_seconds()
        options = [Choice("none", 0, 1.0 / plain, 1.0, plain)]
        self._risk_budget = self._saved_s + _RISK_SHARE * plain * max(self._answer_tokens, _RISK_TOKENS)
        cap = min(budget, self.gamma_cap or budget)
        if cap <= 0:
            return options
        self._verify_row = self._verify_seconds(np.arange(1, cap + 1))  # γ = 1..cap
        return_s = self._return_cost()
        proposals = {}
        for name in LOOKUP_DRAFTERS:
            if name in self.allowed:
                lookup: LookupDrafter = view.drafters[name]
                proposal, n = lookup.lookup(context, cap)
                if proposal:
                    proposals[name] = (proposal, n)
        firsts = [proposal[0] for proposal, _ in proposals.values()]
        for name, (proposal, n) in proposals.items():
            # Lookups that copy from different places, or blind to wrapping, and still
            # propose the same next token are right far more often than one alone.
            agreement = min(firsts.count(proposal[0]) - 1, _AGREEMENT_LEVELS - 1)
            crossings = self._crossings(view, proposal)
            self._open.append(_OpenProposal(name, n, proposal, crossings, agreement))
            accept = self.stats.lookup[name].acceptance(n, len(proposal), crossings, agreement)
            options.append(self._best(name, accept, return_s, 0.0, self.realized.calibration(name)))
        if "model" in self.allowed:
            drafter: ModelDrafter = view.drafters["model"]
            catch_up = drafter.catch_up_cost_tokens(context)
            first = self.costs.draft.estimate(catch_up)
            self._catch_up_s = first
            per_draft = self.costs.draft.estimate(1)
            self._switch_s = max(first - per_draft, 0.0) if catch_up > _PREFILL_BATCH else 0.0
            if self._switch_s > 0.0:
                # The draft's first catch-up is its prompt prefill, paid once per answer:
                # shared by the steps the answer has left, it does not hide for good a
                # draft model that pays on every later step. An answer that has been
                # making many tokens per step (a copy) has few steps left to share it. A
                # later catch-up is the price of coming back after other steps, paid again
                # at every return: shared only by the few model steps a return lasts.
                steps_left = max(view.remaining / max(self._answer_pace(), _MODEL_PACE), 1.0)
                horizon = min(steps_left, _RETURN_STEPS) if self._draft_synced else steps_left
                first = per_draft + self._switch_s / horizon
            options.append(self._best("model", np.full(cap, self.stats.model), first + return_s, per_draft))
        return options

    def _plain_seconds(self) -> float:
        """A plain step: one single-token pass and a plain step's own Python (a drafting
        step's lookups and pricing cost several times more: priced alike, plain decoding
        looked slower than it is wherever a step is short, on a GPU)."""
        return self.costs.target.estimate(1) + self.costs.plain_overhead

    def _return_cost(self) -> float:
        """Seconds a drafting step that follows plain steps will cost the plain steps after
        it (where that is worth pricing: _RETURN_SIGNIFICANT); nothing while a drafting
        run goes on."""
        if self._plain_since_draft == 0:
            return 0.0
        excess = sum(self._return_excess)
        return excess if excess > _RETURN_SIGNIFICANT * self.costs.target.estimate(1) else 0.0

    def _answer_pace(self) -> float:
        """Tokens per target pass this answer has made so far (1 before any step)."""
        return self._answer_tokens / self._answer_passes if self._answer_passes else 1.0

    @staticmethod
    def _crossings(view: StepView, proposal: list[int]) -> np.ndarray | None:
        """Which proposed tokens sit at a boundary of the source: a token that breaks the
        line, or the first one after a sentence or line end. A token that ends a sentence
        with its punctuation alone ("." in "80 percent.") is copied as readily as any
        other; one that carries a line break is not."""
        if view.boundaries is None:
            return None
        if view.context:
            kinds = np.array(view.boundaries([view.context[-1], *proposal]))
        else:
            kinds = np.array([0, *view.boundaries(proposal)])
        return (kinds[:-1] != 0) | (kinds[1:] == LINE_BREAK)

    def plan(self, view: StepView) -> Plan:
        self._steps += 1
        if self._steps < self._idle_until:
            # Nothing came near paying at the last plans (_note_idle): decode plainly.
            self._chosen, self._exploring = None, False
            return Plan("none", 0, reason="idle")
        options = self.choices(view)
        if self.fixed_gamma == 0 or not self.allowed:
            options = options[:1]
        # Drafting must beat plain decoding clearly: its estimates are noisy, and a wrong
        # bet on a steep CPU cost curve loses more than a right one wins. An option whose
        # steps realized less than plain decoding is left out while its ban lasts.
        plain = options[0]
        # Nor does the draft model read the prompt in the answer's first steps: an answer
        # that copies its prompt (an edit) shows it within a few tokens, and then the
        # lookups beat a draft whose prompt prefill would already be paid.
        settling = self._steps < _SETTLE_STEPS and self._switch_s > 0.0 and not self._draft_synced
        drafting = [
            c
            for c in options[1:]
            if c.rate > plain.rate * self._min_gain(c)
            and not self.banned(c.drafter)
            and not (settling and c.drafter == "model")
        ]
        best = max(drafting, key=lambda c: c.rate) if drafting else plain
        exploring = False
        # A drafter that is never chosen is never measured: try the draft model early for
        # a few steps, and now and then later, while its best case could beat the choice.
        for option in options:
            name = option.drafter
            if name != "model" or name == best.drafter or self.banned(name):
                continue  # lookup proposals are judged for free at every step anyway
            early = (self._steps >= 2 and self.stats.model_steps < _EARLY_TRIALS) or (
                self._steps >= _SETTLE_STEPS and not self._draft_synced
            )
            due = self._steps - self._last_used.get(name, 0) >= self._explore_every
            if (early or due) and self._could_win(best, view.remaining):
                # A trial drafts a fixed γ = 4 with no early stop: cut short by a pessimistic
                # calibration it would only confirm that the draft's first token is right.
                gamma = max(1, min(_TRIAL_GAMMA, view.budget, self.gamma_cap or _TRIAL_GAMMA))
                best = Choice(name, gamma, option.rate, option.expected, option.seconds)
                exploring = True
                break
        if best.drafter != "none":
            self._last_used[best.drafter] = self._steps
        self._note_idle(plain, options)
        self._chosen = best
        reason = ", ".join(f"{c.drafter}:{c.gamma}@{c.rate:.1f}/s" for c in options)
        self._expected, self._included_p = 1.0, 1.0
        self._first_draft_s = self._catch_up_s
        self._exploring = exploring
        steering = best.drafter == "model" and self.fixed_gamma is None and not exploring
        keep_going = self._keep_going if steering else None
        return Plan(best.drafter, best.gamma, keep_going, reason, wants_confidence=True)

    def _note_idle(self, plain: Choice, options: list[Choice]) -> None:
        """Count plans in a row where no drafting option came within _IDLE_RATIO of plain
        decoding; after n ≥ 2 of them, the next min(2^(n-2), _MAX_IDLE) steps skip planning."""
        closest = max((c.rate for c in options[1:]), default=0.0)
        # (the draft's best case is priced only where the lookups are out of the running)
        if closest < plain.rate * _IDLE_RATIO and not (
            "model" in self.allowed and self._best_case_rate() > plain.rate
        ):
            self._idle += 1
            if self._idle >= 2:
                self._idle_until = self._steps + 1 + min(2 ** (self._idle - 2), _MAX_IDLE)
        else:
            self._idle = 0

    @staticmethod
    def _min_gain(option: Choice) -> float:
        return _MODEL_GAIN if option.drafter == "model" else _MIN_GAIN

    def _could_win(self, best: Choice, remaining: int) -> bool:
        """Is a trial of the draft model worth its price? Its steps must beat
        ``best`` at near-perfect acceptance, and what that would save over the rest of the
        answer must outweigh the switch (the catch-up: the prompt, the first time) at
        ``_TRIAL_ODDS``: the switch is paid for sure, the saving only if the draft turns
        out to pay. Where the draft reads a prompt in a blink (a GPU) trials always pass;
        a long prompt for a short answer on a CPU is not worth the gamble.

        Before the draft has drafted in this answer (and in the first trials ever) its
        best case is a near-perfect draft: this answer's text may suit it far better than
        the last one's. After that, what it showed bounds it, so a draft that keeps failing
        here is not tried again in this answer."""
        optimistic = self._best_case_rate()
        if optimistic <= best.rate:
            return False
        saving = remaining * (1.0 / best.rate - 1.0 / optimistic)
        return saving > _TRIAL_ODDS * self._switch_s

    def _best_case_rate(self) -> float:
        """Tokens per second of a trial's step of the draft model at its best case (its
        switch cost aside): see _could_win."""
        gamma = _TRIAL_GAMMA
        best_case = _OPTIMISTIC
        if self._draft_synced and self.stats.model_steps >= _EARLY_TRIALS:
            best_case = min(_OPTIMISTIC, self.stats.model_upper(_TRIAL_DOUBT))
        table = self.costs.target.table()
        verify_s = float(table[min(gamma + 1, len(table) - 1)]) + self.costs.overhead
        step_s = verify_s + self._catch_up_s - self._switch_s
        step_s += self.costs.draft.estimate(1) * (gamma - 1)
        # expected_tokens(np.full(gamma, best_case))[-1], in scalars: this runs at every plan
        expected, p = 0.0, 1.0
        for _ in range(gamma):
            p *= best_case
            expected += p
        return (1.0 + expected) / max(step_s, 1e-9)

    def banned(self, option: str) -> bool:
        until = self._banned.get(option)
        if until is None:
            return False
        if self._steps >= until:
            del self._banned[option]  # served: its next steps are fresh evidence
            return False
        return True

    def _check_realized(self, option: str) -> None:
        """Ban ``option`` if what its steps delivered fell below plain decoding's rate."""
        if option == "none" or option in self._banned:
            return
        realized = self.realized.rate(option, _REALIZED_DOUBT)
        if realized is None:
            return
        plain = self.realized.rate("none")
        if plain is None:
            plain = 1.0 / self._plain_seconds()
        if realized < plain * _REALIZED_MARGIN:
            strikes = self._strikes.get(option, 0)
            self._banned[option] = self._steps + min(_BAN_STEPS * 2**strikes, _MAX_BAN)
            self._strikes[option] = strikes + 1
            if self.realized.acceptance(option) < 0.8:
                self._failed_drafts.add(option)
            else:
                self._failed_drafts.discard(option)
            self.realized.forget(option)

    def _keep_going(self, i: int, confidence: float) -> bool:
        """Draft token i (0-based) has confidence ``confidence``: include it? Token 0 always
        is. Token i is included only if what it adds in expectation, per second it costs
        (one more verified position, and the draft decode that follows it), beats the
        expected rate of the step as it stands."""
        p_new = self._included_p * self.stats.model_acceptance(confidence, optimistic=True)
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
        # A catch-up decode (the prompt prefill, or a return after steps of other options
        # or after a ban) is a cost of switching to the draft model, priced when it is
        # chosen: counted in what drafting realizes, a return after a ban would make the
        # draft look worse and be banned again, longer.
        prefill_s = sum(seconds for size, seconds in outcome.draft.decodes if size > _PREFILL_BATCH)
        self._draft_synced = self._draft_synced or outcome.drafter == "model"
        step_s = outcome.draft.seconds - prefill_s + outcome.verify_s + outcome.overhead_s
        # A trial is not what the draft model would be chosen to do (four tokens, no early
        # stop, paid for what it teaches): at 60 % acceptance it makes fewer tokens a second
        # than plain decoding even where the draft's chosen steps pay 1.2x.
        if not self._exploring:
            tokens = outcome.accepted + 1
            self.realized.observe(outcome.drafter, tokens, step_s, outcome.gamma, outcome.accepted)
        self._answer_tokens += outcome.accepted + 1
        self._answer_passes += 1
        if outcome.gamma:
            self._saved_s += (outcome.accepted + 1) * self._plain_seconds() - step_s
        chosen = self._chosen
        if chosen is not None and chosen.drafter == outcome.drafter and outcome.drafter in LOOKUP_DRAFTERS:
            self.realized.calibrate(outcome.drafter, chosen.expected - 1.0, outcome.accepted)
        self._check_realized(outcome.drafter)
        costs.observe_overhead(outcome.overhead_s, plain=outcome.gamma == 0)
        size = outcome.gamma + 1
        if size == 1 and self._plain_since_draft < 2:
            # A return to plain decoding: what it costs beyond a plain step. (It also moves
            # the plain step's own price, as any single-token pass does: kept out of it, the
            # replay of the dev half on the h200-history curve did no better, 1.32 to 1.33.)
            # (Signed: on a CPU, a slow step and a fast one cancel, where clipping at zero
            # would add their noise up into a price.)
            i = self._plain_since_draft
            excess = outcome.verify_s - costs.target.estimate(1)
            self._saved_s -= excess  # (what the drafting before it cost these steps)
            self._return_excess[i] = (1 - _RETURN_EMA) * self._return_excess[i] + _RETURN_EMA * excess
        costs.target.observe(size, outcome.verify_s, repeated=size == self._last_size)
        self._plain_since_draft = 0 if size > 1 else min(self._plain_since_draft + 1, 2)
        self._last_size = size
        for k, seconds in outcome.draft.decodes:
            costs.draft.observe(k, seconds)
        if outcome.drafter == "model":
            self.stats.observe_model(outcome.draft.confidences, outcome.accepted)
            if self._exploring:
                # Judged by its first token: a draft that pays on two tokens a step often
                # fails a trial's longer draft later on, one that does not pays on none.
                failed = outcome.accepted == 0
                self._explore_every = (
                    min(2 * self._explore_every, _MAX_EXPLORE_EVERY) if failed else _EXPLORE_EVERY
                )
        self._judge_open_proposals(outcome.new_tokens)

    def _judge_open_proposals(self, committed: list[int]) -> None:
        """Each committed token confirms or refutes the next token of every open lookup
        proposal: free, counterfactual evidence of how lookup drafts would fare (exact
        under greedy decoding; under sampling, a match happens with the probability an
        accepted one-hot draft has)."""
        for token in committed:
            for proposal in list(self._open):
                hit = proposal.tokens[proposal.judged] == token
                crossing = proposal.crossings is not None and bool(proposal.crossings[proposal.judged])
                stats = self.stats.lookup[proposal.drafter]
                stats.observe(
                    proposal.match_len + proposal.judged, hit, crossing=crossing, agreement=proposal.agreement
                )
                proposal.judged += 1
                name = proposal.drafter
                if (
                    hit
                    and proposal.judged == _CONFIRMING_RUN
                    and name in self._banned
                    and name in self._failed_drafts
                ):
                    del self._banned[name]  # new evidence: it copies right again
                if hit and proposal.judged == _WAKING_RUN:
                    self._idle, self._idle_until = 0, 0  # a copy holds: look at every step again
                if not hit or proposal.judged == len(proposal.tokens):
                    self._open.remove(proposal)


@dataclass
class ControllerState:
    """What the controller knows about one loaded pair on this machine: the cost model and
    the acceptance statistics. Its owner (the API object that loaded the pair) creates it
    once and hands it to every adaptive policy, so learning carries over between requests."""

    costs: CostModel
    stats: AcceptanceStats

    @classmethod
    def prepare(
        cls, target: Model, draft: Model | None, k_max: int, *, quiet: bool = False
    ) -> ControllerState:
        """Costs from the profile kept on disk for this pair and machine when it can be
        trusted, else measured now (a progress bar unless ``quiet``)."""
        return cls(costs=load_or_measure(target, draft, k_max, quiet=quiet), stats=AcceptanceStats())

    def check_costs(self) -> list[int]:
        """Sizes whose costs seen while generating disagree with the profile's shape; the
        profile is then marked so that the next load measures it again."""
        sizes = self.costs.target.disagrees()
        if sizes:
            self.costs.mark_stale()
        return sizes


def describe(costs: CostModel) -> str:
    """One line of what was measured, for --verbose and the bench header."""
    t = costs.target
    points = [
        f"T({k})={1000 * t.estimate(k):.0f}ms"
        for k in (1, 2, 5, 9, 17, 33, 65)
        if k <= t.k_max and not math.isnan(t.estimate(k))
    ]
    d = costs.draft.estimate(1)
    return " ".join(points) + (f" draft={1000 * d:.0f}ms/token" if not math.isnan(d) else "")

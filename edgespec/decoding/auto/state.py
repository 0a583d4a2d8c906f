"""The controller's state, by lifetime: a pair's across answers, an answer's, a step's."""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgespec.decoding.auto.pricing import Choice
from edgespec.decoding.auto.realized import Bans, RealizedRates
from edgespec.decoding.auto.stats import AcceptanceStats
from edgespec.decoding.auto.tuning import DEFAULT, Tuning
from edgespec.decoding.costs import CostModel, load_or_measure
from edgespec.decoding.costs.shared import SharedDecodes
from edgespec.decoding.drafters import LOOKUP_DRAFTERS
from edgespec.runtime.model import Model


class PairState:
    """What the controller knows about one loaded pair on this machine, carried from one
    answer to the next: the cost model, the acceptance statistics, and what a return to
    plain decoding costs (a property of the machine, not of the text). Its owner (the API
    object that loaded the pair) creates it once and hands it to every adaptive policy."""

    def __init__(self, costs: CostModel, tuning: Tuning = DEFAULT, stats: AcceptanceStats | None = None):
        self.costs = costs
        self.tuning = tuning
        self.stats = stats or AcceptanceStats(tuning)
        # What the first and the second plain step after drafting cost beyond a plain step.
        self.return_excess = [0.0, 0.0]
        # A plain step's Python with nothing priced (what ``--drafter none`` pays), learned
        # from the steps the controller decodes plainly without looking: the yardstick of
        # what an answer gained or lost against plain decoding. None before any.
        self.bare_overhead: float | None = None
        # A single-token pass two or more plain steps after drafting: what plain decoding's
        # pass costs. (The cost curve's level also learns from the first two after
        # drafting, which cost more on a GPU: priced by it, plain decoding looks dearer
        # than it is, and an answer would count gains it never made.) None before any.
        self.steady_plain_s: float | None = None
        # A step that priced its options and decoded plainly: its Python (lookups and
        # pricing included), learned as ``bare_overhead`` is. None before any.
        self.pricing_overhead: float | None = None
        # The prices answers start at, held from one answer to the next while they fit
        # what the pair has learned (``prices``). None before the first answer.
        self.held: Prices | None = None
        # What decodes of several answers' passes cost, measured (``costs.shared``): a
        # shared step's price.
        self.shared_decodes = SharedDecodes()

    def learn_shared_decode(self, sequences: int, tokens: int, seconds: float) -> None:
        """A decode of ``sequences`` answers' passes, ``tokens`` in all, took ``seconds``."""
        self.shared_decodes.observe(sequences, tokens, seconds, self.costs.target)

    def learn_bare_overhead(self, seconds: float) -> None:
        """A step that priced nothing took ``seconds`` of Python (the first one seen
        starts the moving average)."""
        old, ema = self.bare_overhead, self.tuning.return_ema
        self.bare_overhead = seconds if old is None else (1 - ema) * old + ema * seconds

    def learn_pricing_overhead(self, seconds: float) -> None:
        """A step that priced its options and decoded plainly took ``seconds`` of Python."""
        old, ema = self.pricing_overhead, self.tuning.return_ema
        self.pricing_overhead = seconds if old is None else (1 - ema) * old + ema * seconds

    def prices(self) -> Prices:
        """What an answer starting now (or one whose step was counted on the clock) prices
        its steps at, and counts them at (see ``Prices``): the prices the last answer started
        at, while they fit what the pair has learned since (``fits``), else the costs as
        learned so far. Taken afresh at every answer, the prices of a session's later answers
        moved with every pass the machine happened to make slow, and the same prompt in two
        processes took other decisions from its session's second answer on. A step's
        Python is held apart (``python_fits``): where it moved, the held prices take what
        was learned of it and keep their passes, so that no pass's noise comes in with it."""
        held = self.held
        if held is None or not self.fits(held):
            self.held = self._learned_prices()
        elif not self.python_fits(held):
            costs = copy.deepcopy(held.costs)
            costs.overhead, costs.plain_overhead, bare, pricing = self._python()
            self.held = dataclasses.replace(held, costs=costs, bare_s=bare, pricing_s=pricing)
        return self.held

    def _learned_prices(self) -> Prices:
        costs = copy.deepcopy(self.costs)
        _, _, bare, pricing = self._python()
        excess = (self.return_excess[0], self.return_excess[1])
        return Prices(costs, self.steady_plain(costs), bare, pricing, excess)

    def _python(self) -> tuple[float, float, float, float]:
        """A step's Python as learned so far, as ``Prices.python`` has it."""
        costs = self.costs
        bare = costs.plain_overhead if self.bare_overhead is None else self.bare_overhead
        # (before any such step: a drafting step's, which looks up and prices as it does)
        looked = costs.overhead if self.pricing_overhead is None else self.pricing_overhead
        return costs.overhead, costs.plain_overhead, bare, max(looked - bare, 0.0)

    def python_fits(self, prices: Prices) -> bool:
        """Is each of a step's Python figures in ``prices`` within ``price_python`` of a
        plain step of what the pair has learned? On a CPU's step of 30-90 ms that is a few
        tenths of a millisecond, which no jitter of the Python reaches; on an H200's 2 ms
        step, where the Python is a fifth of the step, the prices follow what is learned."""
        tolerance = self.tuning.price_python * step_seconds(self.costs, 1)
        return all(
            abs(now - then) <= tolerance for now, then in zip(self._python(), prices.python(), strict=True)
        )

    def scale(self, prices: Prices) -> float:
        """How much slower (> 1) or faster the machine now runs than ``prices`` say, every
        size alike, as the pair has learned a plain step: no decision changes with it
        (every price, every worst case and the allowance scale together), so prices are
        judged by their shape, not by their level. A VM's speed drifts by a third between
        minutes, and that alone must not start decisions the noise picks."""
        return step_seconds(self.costs, 1) / step_seconds(prices.costs, 1)

    def off_price(self, prices: Prices, size: int, scale: float) -> bool:
        """Has the pair learned that a step with a pass of ``size`` tokens (its Python
        included: what the clock gives to one or the other is no change of price) or a
        return to single tokens costs more than ``price_margin`` off ``prices``, these
        scaled by ``scale``? (Not the draft model's tokens: see ``fits``.)"""
        return self._step_off(prices, size, scale) or self._return_off(prices, scale)

    def _step_off(self, prices: Prices, size: int, scale: float) -> bool:
        margin = self.tuning.price_margin
        price = step_seconds(prices.costs, size) * scale
        return not price / margin <= step_seconds(self.costs, size) <= price * margin

    def _return_off(self, prices: Prices, scale: float) -> bool:
        pairs = zip(self.return_excess, prices.return_excess, strict=True)
        drift = max(abs(learned - held * scale) for learned, held in pairs)
        return drift > (self.tuning.price_margin - 1.0) * prices.plain_s * scale

    def fits(self, prices: Prices) -> bool:
        """Do ``prices`` still fit what the pair has learned? A step of every pass size (its
        Python included: how a clock shares a step out between the pass and the Python is
        no change of price) and a steady plain pass within ``price_margin`` in shape
        (``off_price``): one pass's noise moves what is learned by some 4 %. The draft
        model's token is judged by what it moved, not scaled: it is learned only while the
        draft drafts, so beside a target that sped up or slowed down since, it would look
        off by the target's drift alone."""
        scale, margin = self.scale(prices), self.tuning.price_margin
        sizes = range(1, self.costs.target.k_max + 1)
        if self._return_off(prices, scale) or any(self._step_off(prices, size, scale) for size in sizes):
            return False
        # (a steady plain pass beside a single-token pass as the curve prices it: shape
        # again, and no Python in either)
        then = prices.plain_s / prices.costs.target.estimate(1)
        now = self.steady_plain(self.costs) / self.costs.target.estimate(1)
        if not then / margin <= now <= then * margin:
            return False
        held, learned = prices.costs.draft.estimate(1), self.costs.draft.estimate(1)
        return not held > 0.0 or held / margin <= learned <= held * margin  # (no draft: nothing to judge)

    def learn_steady_plain(self, costs: CostModel, seconds: float) -> None:
        """A steady plain step's pass took ``seconds`` (moving from the profile's price)."""
        ema = self.tuning.return_ema
        self.steady_plain_s = (1 - ema) * self.steady_plain(costs) + ema * seconds

    def steady_plain(self, costs: CostModel) -> float:
        """What a plain step's pass costs, as learned, else as the profile says."""
        return costs.target.estimate(1) if self.steady_plain_s is None else self.steady_plain_s

    @classmethod
    def prepare(
        cls,
        target: Model,
        draft: Model | None,
        k_max: int,
        *,
        quiet: bool = False,
        tuning: Tuning = DEFAULT,
        notify: Callable[[str], None] | None = None,
    ) -> PairState:
        """Costs from the profile kept on disk for this pair and machine when it can be
        trusted, else measured now (a progress bar unless ``quiet``). ``notify`` receives
        the measurement's notes for the user (why a profile is measured again, a busy
        machine) unless ``quiet``: the front end decides where they go."""
        return cls(load_or_measure(target, draft, k_max, quiet=quiet, notify=notify), tuning)

    def begin_answer(self) -> None:
        """A new answer starts: only a share of the drafters' evidence carries into it, and
        the costs the earlier answers saw are checked against the profile."""
        self.stats.soften(self.tuning.carry_over)
        self.check_costs()

    def check_costs(self) -> list[int]:
        """Sizes whose costs seen while generating disagree with the profile's shape; the
        profile is then marked so that the next load measures it again."""
        sizes = self.costs.target.disagrees()
        if sizes:
            self.costs.mark_stale()
        return sizes


@dataclass(frozen=True)
class Prices:
    """One answer's prices, fixed when it starts: what its options are priced at and what
    its steps are counted at, against plain decoding and in its realized rates. Counted on
    the clock, a pass the machine happened to make slow moved the answer's surplus, and
    with it which bets fitted: the same prompt took other decisions in two processes and
    ended 10–20 % apart. Counted at prices, the decisions are a function of the text and
    the costs the answer started with; what the clock says still teaches the pair's costs
    (``PairState.costs``), from the next answer on."""

    costs: CostModel  # a copy of the pair's, as it stood
    plain_s: float  # a plain step's pass
    bare_s: float  # a plain step's Python with nothing priced (what --drafter none pays)
    pricing_s: float  # what a step that priced its options and decoded plainly paid beyond that
    return_excess: tuple[float, float]  # the first and second plain step after drafting, beyond a plain one

    def python(self) -> tuple[float, float, float, float]:
        """A step's Python: a drafting step's and a plain step's (the cost model's), a
        plain step's with nothing priced, and what pricing adds to that."""
        return self.costs.overhead, self.costs.plain_overhead, self.bare_s, self.pricing_s

    def plain_step(self) -> float:
        """A plain step as ``--drafter none`` takes it."""
        return self.plain_s + self.bare_s

    def step(self, gamma: int, draft_decodes: list[tuple[int, float]], *, priced: bool) -> float:
        """A step that verified ``gamma`` drafted tokens after these draft decodes (sizes);
        ``priced``: it priced its options."""
        if gamma == 0:
            return self.plain_step() + (self.pricing_s if priced else 0.0)
        drafting = sum(self.costs.draft.estimate(size) for size, _ in draft_decodes)
        return self.costs.target.estimate(gamma + 1) + self.costs.overhead + drafting


@dataclass(frozen=True)
class ModelPrice:
    """The draft model's price at a step, as ``AdaptivePolicy.model_price`` computes it."""

    first: float = 0.0  # its first decode as priced (a prompt prefill: this step's share)
    per_draft: float = 0.0  # one draft token
    catch_up_s: float = 0.0  # the whole catch-up it must decode before drafting
    switch_s: float = 0.0  # of that, the switch (a prompt prefill); 0 for a short catch-up


NOT_PRICED = ModelPrice()


@dataclass
class OpenProposal:
    """A lookup proposal, used or not, judged token by token against the committed text."""

    drafter: str
    evidence: int  # see drafters.Proposal.evidence
    tokens: tuple[int, ...]
    crossings: np.ndarray | None = None  # token i follows a sentence or line end
    agreement: int = 0  # 1: another lookup proposed the same first token
    source: int = 0  # ANY_COPY, HELD (a copy by its drafter held long in this answer), PREDICTED
    judged: int = 0


@dataclass
class AnswerState:
    """One answer's running state: its steps, what drafting saved in it, its bans and
    realized rates, the lookup proposals still being judged, the trial schedule."""

    tuning: Tuning
    steps: int = 0
    saved_s: float = 0.0  # what drafting saved over plain steps (negative: lost)
    tokens: int = 0  # tokens and target passes so far
    passes: int = 0
    draft_synced: bool = False  # the draft model has drafted (so read its prompt)
    model_price: ModelPrice = field(default_factory=lambda: NOT_PRICED)  # as last priced
    # Steps between trials: every trial pays a catch-up, so one whose draft failed at once
    # makes the next wait twice as long (a translation the draft cannot do).
    explore_every: int = 0
    last_used: dict[str, int] = field(default_factory=dict)  # drafter -> step it last drafted
    idle: int = 0  # plans in a row where nothing came near paying
    idle_until: int = 0  # first step planned again
    # plain steps since the last multi-token pass (the prompt's, then drafting's), up to 2
    plain_since_draft: int = 0
    drafted: bool = False  # a drafting step's pass was decoded in this answer
    last_size: int = 0  # tokens of the last target pass (see CostCurve.observe)
    held: set[str] = field(default_factory=set)  # lookups one of whose copies held long here
    open: deque[OpenProposal] = field(init=False)
    realized: RealizedRates = field(init=False)
    bans: Bans = field(init=False)

    def __post_init__(self) -> None:
        self.explore_every = self.explore_every or self.tuning.explore_every
        self.open = deque(maxlen=self.tuning.open_proposals * len(LOOKUP_DRAFTERS))
        self.realized = RealizedRates(self.tuning)
        self.bans = Bans(self.tuning)

    def pace(self) -> float:
        """Tokens per target pass this answer has made so far (1 before any step)."""
        return self.tokens / self.passes if self.passes else 1.0


@dataclass
class StepScratch:
    """What one plan leaves for its own step: the choice (judged when the step is
    observed) and the running sums of the draft model's early stop."""

    chosen: Choice | None = None
    exploring: bool = False  # the step is a trial of the draft model
    expected: float = 1.0  # expected tokens of the model draft being built
    included_p: float = 1.0  # chance that every draft included so far is accepted
    first_draft_s: float = 0.0  # the draft's first decode (its catch-up)


def step_seconds(costs: CostModel, size: int) -> float:
    """A step with a target pass over ``size`` tokens, its Python included."""
    return costs.target.estimate(size) + (costs.overhead if size > 1 else costs.plain_overhead)

"""The controller's state, by lifetime: a pair's across answers, an answer's, a step's."""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgespec.decoding.auto.pricing import Choice
from edgespec.decoding.auto.realized import Bans, RealizedRates
from edgespec.decoding.auto.stats import AcceptanceStats
from edgespec.decoding.auto.tuning import DEFAULT, Tuning
from edgespec.decoding.costs import CostModel, load_or_measure
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
        """What an answer starting now prices its steps at, and counts them at: the costs
        learned so far, fixed for the answer (see ``Prices``)."""
        costs = copy.deepcopy(self.costs)
        bare = costs.plain_overhead if self.bare_overhead is None else self.bare_overhead
        # (before any such step: a drafting step's, which looks up and prices as it does)
        looked = costs.overhead if self.pricing_overhead is None else self.pricing_overhead
        pricing = max(looked - bare, 0.0)
        excess = (self.return_excess[0], self.return_excess[1])
        return Prices(costs, self.steady_plain(costs), bare, pricing, excess)

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
        """A new answer starts: only a share of the drafters' evidence carries into it."""
        self.stats.soften(self.tuning.carry_over)

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

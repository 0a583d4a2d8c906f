"""Every tuning value of the adaptive controller, in one frozen structure.

Tests and replays pass another instance (``dataclasses.replace(DEFAULT, ...)``) instead of
patching module constants. Why each value is what it is, with the measurements behind it,
is written down in docs/controller.md.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HOLDS_FILE = Path(__file__).parent / "data" / "holds.toml"


@dataclass(frozen=True)
class Tuning:
    # -- the draft model's acceptance ------------------------------------------------------
    model_decay: float = 0.96  # per judged token: its acceptance follows the last two dozen
    model_prior: float = 0.6  # per-token acceptance before any evidence
    model_pseudo: float = 2.0  # judged tokens the prior is worth
    confidence_ema: float = 0.1  # weight of a new token in the confidence calibration
    confidence_buckets: int = 10  # buckets of the draft's confidence, calibrated apart
    model_gain: float = 1.04  # expected speed-up the draft model needs over plain decoding
    # -- the lookup drafters' acceptance ---------------------------------------------------
    # Effective match lengths pooled into roughly geometric buckets (1, 2, 3, 4-5, 6-8, …):
    # a copy's chance to go on changes fast over its first tokens and slowly after.
    length_edges: tuple[int, ...] = (1, 2, 3, 4, 6, 9, 13, 19, 27, 41, 61, 91)
    lookup_prior: float = 0.3  # acceptance of a one-token match before any evidence
    # Judgements the measured acceptance by match length (data/holds.toml) is worth in
    # each length bucket, for the drafters it was measured for.
    measured_pseudo: float = 4.0
    measured_from: int = 1  # ... in the buckets of matches at least this long
    # ... taken as at most this: no length makes a copy certain, and a prior of 1 would
    # leave no doubt to price
    measured_cap: float = 0.99
    agreement_levels: int = 2  # a proposal alone, or one whose first token another lookup shares
    # A lookup one of whose proposals held this many tokens in a row in this answer copies
    # from a source the answer follows at length (a summary that lifts sentences, an edit
    # of a file): its later proposals are judged apart, starting from the others' evidence.
    held_copy: int = 16
    held_pseudo: float = 2.0  # judgements the others' evidence is worth there
    held_caution: float = 0.0  # share of the caution below taken there: none, the answer has shown it
    cross_prior: float = 0.5  # chance a copy goes on past a sentence or line end, before evidence
    cross_pseudo: float = 2.0
    cross_decay: float = 0.9  # boundaries are rarer than tokens: remember the last ten or so
    pseudo: float = 1.0  # pseudo-observations pulling a length bucket toward the one below
    decay: float = 0.97  # per observation: a bucket remembers its last few dozen judgements
    caution: float = 1.0  # standard deviations taken off thinly supported estimates
    # ... for the grammar's drafter: forced text recurs at every key of an answer, so its
    # proposals are judged many times an answer and a thin bucket fills within a few steps
    forced_caution: float = 0.5
    open_proposals: int = 8  # recent proposals per lookup judged against the committed text
    min_gain: float = 1.08  # expected speed-up a lookup option needs over plain decoding
    # -- realized rates and bans -----------------------------------------------------------
    realized_decay: float = 0.85  # per step of an option: its realized rate follows the last ten
    realized_evidence: float = 2.5  # decayed steps before a realized rate is trusted
    realized_margin: float = 0.98  # below this share of plain decoding's rate an option loses
    realized_doubt: float = 1.0  # ... by more than this many standard errors of its tokens a step
    realized_spread: float = 1.0  # squared tokens of spread a step has before evidence
    ban_steps: int = 12  # steps a losing option is left out the first time; doubled per ban
    max_ban: int = 192
    confirming_run: int = 8  # a banned lookup whose proposal holds this long is let back
    calibration_decay: float = 0.9  # per chosen step: the last ten or so count
    calibration_pseudo: float = 3.0  # tokens of evidence that predictions were right, before any
    carry_over: float = 0.2  # share of the drafters' evidence a new answer starts with
    # -- trials of the draft model ---------------------------------------------------------
    explore_every: int = 24  # steps between trials of a drafter that is not being chosen
    max_explore_every: int = 96  # ... doubled after each trial whose first token failed, up to this
    prefill_batch: int = 4  # a draft decode of more tokens than this is a catch-up, not drafting
    early_trials: int = 3  # draft-model steps tried early where its best case could pay
    settle_steps: int = 5  # steps before the draft model reads a new prompt (but early trials)
    optimistic: float = 0.9  # per-token acceptance of the draft model's best case
    trial_doubt: float = 1.0  # standard errors above its measured acceptance, once it drafted
    return_steps: int = 4  # model steps that share the catch-up of a return to the draft model
    trial_odds: float = 2.0  # a trial must promise this multiple of its switch cost
    trial_gamma: int = 4  # tokens a trial drafts
    trial_risk_tokens: int = 16  # a trial risks risk_share of the answer's plain time over at least this
    # -- skipping the pricing where nothing pays -------------------------------------------
    idle_ratio: float = 0.85  # no drafting option within this share of plain decoding's rate
    max_idle: int = 8  # most steps skipped in a row
    waking_run: int = 2  # tokens in a row a looked-at proposal gets right to end the skipping
    waking_match: int = 8  # ... or the n-gram lookup's match length, asked at every skipped step
    # -- what a long draft may risk --------------------------------------------------------
    # A step may lose at worst the answer's gain over plain decoding so far plus this share
    # of its plain time: no answer of risk_tokens or more ends below 1 / (1 + risk_share)
    risk_share: float = 0.03
    risk_tokens: int = 16  # ... counted over at least this many tokens (a shorter answer's floor)
    # A lookup's draft whose miss would leave no room for even a one-token draft after it
    # (the answer then decodes plainly until its allowance grows back: some 26 tokens on a
    # steep CPU) must hold its first token at better than this chance.
    all_in_odds: float = 0.6
    # -- several answers in one decode ------------------------------------------------------
    # Until a decode of several passes with a draft in it was measured, a draft at once is
    # at most this long, and only in a decode of plain steps: what its tokens add to a
    # shared decode is not the one-sequence curve's (costs.shared), and a first guess
    # priced by that curve could be dear.
    shared_trial_gamma: int = 2
    # -- the return to plain decoding (GPUs) -----------------------------------------------
    return_significant: float = 0.1  # priced above this share of a single-token pass
    return_ema: float = 0.3
    # -- what steps are counted at -----------------------------------------------------------
    # A step is counted at the price its answer started with, unless what the pair learned
    # since puts that price off by more than this factor (one pass's noise on these
    # machines, some 12 %, moves what is learned by 4 %)
    price_margin: float = 1.25
    price_gross: float = 3.0  # ... or the step's own clock is off its price by more than this
    # An answer starts at the prices the last one started at while they fit what the pair
    # learned since (``price_margin``), and a step's Python while it stays within this share
    # of a plain step of what was learned (a third of what the allowance grows by a token)
    price_python: float = 0.01


DEFAULT = Tuning()


@cache
def measured_acceptance(path: Path = HOLDS_FILE) -> dict[str, tuple[float, ...]]:
    """Per lookup drafter, its measured per-token acceptance by length bucket."""
    with path.open("rb") as f:
        data = tomllib.load(f)
    return {name: tuple(float(v) for v in row) for name, row in data.items()}

"""Pricing: what each way of taking the next step is expected to yield, as pure functions.

* plain decoding (γ = 0): 1 token for one single-token target pass;
* each lookup drafter: its proposal (free to compute) with γ chosen so that
  E[tokens] / (T(γ+1) + overhead) is largest, E from the measured acceptance of that
  drafter's drafts with the same match length;
* the draft model: catch-up decode + (γ−1) draft decodes + T(γ+1).

Where several answers run at once, a step's pass is decoded with theirs (``Sharing``): what
it adds to that decode is priced, not what it would cost alone, and an option is worth the
tokens per second it adds (``step_rates``). On a CPU, where a plain step adds little to a
decode of several, plain steps decoded together already get most of what drafting would,
and a draft pays only where it is nearly sure; on a GPU, once answers draft together,
their drafts cost the decode almost nothing.

A draft risks only what the answer can afford: what it has gained over plain decoding so
far plus a small share of its plain decoding time. Its worst case, its first draft
failing, yields the one token a plain step would at the price of its whole step; that
must fit, however unlikely the estimates make it. On a steep CPU, where a failed 16-token
draft costs several plain steps, an answer drafts long only once its shorter drafts have
paid for the bet; on a GPU the bound rarely binds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.decoding.auto.tuning import Tuning
from edgespec.decoding.costs import CostModel
from edgespec.decoding.costs.shared import SharedDecodes
from edgespec.decoding.policy import LINE_BREAK, StepView


@dataclass(frozen=True)
class Choice:
    drafter: str
    gamma: int
    rate: float  # expected tokens per second
    expected: float  # expected tokens from the step
    seconds: float  # expected seconds of the step


@dataclass(frozen=True)
class Sharing:
    """The other answers' passes a step's pass is expected to be decoded with (those its
    last pass was decoded with): how many (each yields a token at least), the seconds
    their tokens cost decoded together, and the step's plain price there and alone."""

    answers: int
    tokens: int
    seconds: float
    plain_s: float  # what a plain step adds to the decode, its Python included
    alone_plain_s: float  # a plain step alone: the scale the step's rates are given in
    decodes: SharedDecodes  # what decodes of several passes were measured at


_UNMEASURED = SharedDecodes()  # (never told of a decode: prices every decode by the curve)


def sharing(
    costs: CostModel, answers: int, tokens: int, decodes: SharedDecodes | None = None
) -> Sharing | None:
    """How a step decoded with ``answers`` other passes of ``tokens`` tokens is priced:
    the decode with its pass against the decode without it, as ``decodes`` measured them
    (else as one sequence's passes of as many tokens); None for a step decoded alone."""
    if answers <= 0 or tokens <= 0:
        return None
    decodes = _UNMEASURED if decodes is None else decodes
    base = decodes.seconds(answers, tokens, costs.target)
    plain = decodes.seconds(answers + 1, tokens + 1, costs.target)
    added = max(plain - base, 0.0) + costs.plain_overhead
    return Sharing(answers, tokens, base, added, plain_seconds(costs), decodes)


def verify_seconds(costs: CostModel, gammas: np.ndarray, shared: Sharing | None = None) -> np.ndarray:
    """Seconds to verify each γ in ``gammas``: the target pass over γ+1 tokens (or what
    it adds to the decode it is shared in) and the drafting step's Python."""
    if shared is None:
        added = costs.target.estimates(gammas + 1)
    else:
        with_it = shared.decodes.seconds_row(shared.answers + 1, shared.tokens + gammas + 1, costs.target)
        added = with_it - shared.seconds
    return np.maximum(added, 0.0) + costs.overhead


def plain_seconds(costs: CostModel, shared: Sharing | None = None) -> float:
    """A plain step: one single-token pass (or what it adds to the decode it is shared
    in) and a plain step's own Python (a drafting step's lookups and pricing cost several
    times more: priced alike, plain decoding looked slower than it is wherever a step is
    short, on a GPU)."""
    if shared is not None:
        return shared.plain_s
    return costs.target.estimate(1) + costs.plain_overhead


def step_rates(expected: np.ndarray, seconds: np.ndarray, shared: Sharing | None = None) -> np.ndarray:
    """The tokens per second a step yielding ``expected`` tokens in ``seconds`` is worth.
    Shared, where every other answer in the decode steps plainly, a draft lengthens all
    their rounds while they still need as many, so it must pay at the margin: its tokens
    per second added against those of the plain step it replaces (on a CPU a plain step
    adds little to a decode of several). Where some other answer drafts, the round is long
    already and the answers drafting together shorten it for all: the option is worth the
    whole decode's gain over the decode with a plain step of this answer's, counted per
    answer in the decode. Either way put on the scale of a plain step alone: plain
    decoding is worth the same, and a lookup needs the same margin over it
    (``Tuning.min_gain``)."""
    if shared is None:
        return expected / seconds
    if shared.tokens > shared.answers:  # some other answer drafts in this decode
        n, base = shared.answers, shared.seconds
        gain = (expected + n) / (seconds + base) * (shared.plain_s + base) / (1.0 + n) - 1.0
        return np.maximum(1.0 + (1 + n) * gain, 0.0) / shared.alone_plain_s
    return expected * shared.plain_s / seconds / shared.alone_plain_s


def risk_budget(
    tuning: Tuning, saved_s: float, answer_tokens: int, plain_s: float, floor_tokens: int | None = None
) -> float:
    """The most a step may lose against plain decoding where its first draft fails: what
    the answer has gained over plain decoding (``saved_s``, negative when behind), plus a
    share of its plain decoding time (counted over at least ``floor_tokens``, by default
    ``risk_tokens``)."""
    floor = tuning.risk_tokens if floor_tokens is None else floor_tokens
    return saved_s + tuning.risk_share * plain_s * max(answer_tokens, floor)


def best_gamma(
    drafter: str,
    accept: np.ndarray,
    verify_row: np.ndarray,
    fixed_cost: float,
    per_draft: float,
    *,
    calibration: float = 1.0,
    fixed_gamma: int | None = None,
    risk: float | None = None,
    plain_s: float = 0.0,
    shared: Sharing | None = None,
) -> Choice:
    """The best γ for a drafter whose i-th draft is accepted with chance accept[i], at
    ``fixed_cost`` + ``per_draft`` × (γ − 1) seconds of drafting, with ``verify_row[γ-1]``
    the seconds to verify γ drafts. With ``risk``, only γ whose worst case fits in it are
    priced (unless the user fixed γ): a step whose first draft fails yields the one token
    a plain step of ``plain_s`` seconds would, so it loses what it costs beyond that.
    ``shared``: the decode the step is expected to share. Runs for every option at every
    planned step: the arrays are the length of the proposal."""
    longest = len(accept) if fixed_gamma is None else min(fixed_gamma, len(accept))
    if fixed_gamma is None and risk is not None:
        longest = min(longest, affordable(verify_row[:longest], fixed_cost, per_draft, plain_s, risk))
    if longest < 1:
        return Choice(drafter, 0, 0.0, 1.0, 1.0)
    # expected_tokens(accept)[γ] - 1, without building the γ = 0 entry
    extra = np.cumsum(np.cumprod(accept[:longest]))
    if fixed_gamma is None:
        seconds = verify_row[:longest]
    else:
        extra, seconds = extra[longest - 1 : longest], verify_row[longest - 1 : longest]
    if fixed_cost:
        seconds = seconds + fixed_cost
    if per_draft:  # γ − 1 draft decodes after the first
        seconds = seconds + per_draft * np.arange(longest - len(seconds), longest)
    expected = 1.0 + calibration * extra
    rates = step_rates(expected, seconds, shared)
    i = int(rates.argmax())
    gamma = i + 1 if fixed_gamma is None else longest
    return Choice(drafter, gamma, float(rates[i]), float(expected[i]), float(seconds[i]))


def affordable(
    verify_row: np.ndarray, fixed_cost: float, per_draft: float, plain_s: float, risk: float
) -> int:
    """The longest γ (0 for none) whose worst case, its first draft failing, loses at most
    ``risk`` seconds against a plain step of ``plain_s``; the worst case grows with γ."""
    worst = verify_row + fixed_cost - plain_s
    if per_draft:
        worst = worst + per_draft * np.arange(len(verify_row))
    too_dear = worst > risk
    return int(too_dear.argmax()) if too_dear.any() else len(verify_row)


def crossings(view: StepView, proposal: list[int]) -> np.ndarray | None:
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


def trial_seconds(
    tuning: Tuning, costs: CostModel, catch_up_s: float, switch_s: float, shared: Sharing | None = None
) -> float:
    """Seconds of a trial's step of the draft model, its switch (a prompt prefill) aside
    (at once: what its pass adds to the shared decode)."""
    gamma = tuning.trial_gamma
    if shared is None:
        table = costs.target.table()
        verify_s = float(table[min(gamma + 1, len(table) - 1)]) + costs.overhead
    else:
        verify_s = float(verify_seconds(costs, np.array([gamma]), shared)[0])
    step_s = verify_s + catch_up_s - switch_s
    return step_s + costs.draft.estimate(1) * (gamma - 1)


def trial_rate(
    tuning: Tuning,
    costs: CostModel,
    best_case: float,
    catch_up_s: float,
    switch_s: float,
    shared: Sharing | None = None,
) -> float:
    """Tokens per second of a trial's step of the draft model at acceptance ``best_case``
    per token (its switch cost aside), on the scale ``step_rates`` gives at once."""
    gamma = tuning.trial_gamma
    step_s = trial_seconds(tuning, costs, catch_up_s, switch_s, shared)
    # expected_tokens(np.full(gamma, best_case))[-1], in scalars: this runs at every plan
    expected, p = 0.0, 1.0
    for _ in range(gamma):
        p *= best_case
        expected += p
    if shared is not None:
        return float(step_rates(np.array([1.0 + expected]), np.array([max(step_s, 1e-9)]), shared)[0])
    return (1.0 + expected) / max(step_s, 1e-9)

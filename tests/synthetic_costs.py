"""The adaptive controller on synthetic costs: measured machines' cost curves injected
through the cost model's interface (no sleeps, no models), and the step views the engine
would hand it, built from real lookup drafters."""

from __future__ import annotations

import dataclasses

from edgespec.decoding.auto import DEFAULT, AcceptanceStats, AdaptivePolicy, PairState, Tuning
from edgespec.decoding.costs import CostCurve, CostModel
from edgespec.decoding.drafters import LookupDrafter, NgramDrafter
from edgespec.decoding.policy import Plan, StepView
from edgespec.decoding.sampling import SamplingParams

GREEDY = SamplingParams()
# An answer long enough that the bound on what it may lose never binds (its floor counted
# over a million tokens): what these tests pin down is every other mechanism. The bound
# has its own tests, which pass ``DEFAULT``.
LONG_ANSWER = dataclasses.replace(DEFAULT, risk_tokens=10**6)

CPU_TARGET = {1: 58, 2: 102, 4: 202, 5: 220, 8: 429, 9: 484, 16: 628, 17: 759}  # a 2-core AVX2 EPYC, measured
F16_TARGET = {1: 143, 2: 150, 5: 182, 9: 250, 17: 400}  # the F16 stand-in: nearly flat
FLAT_TARGET = {1: 40, 2: 40.5, 5: 41, 9: 42, 17: 44}  # a GPU: verifying 16 costs as much as 1
H200_TARGET = {1: 1.8, 2: 5.0, 5: 4.2, 9: 5.3, 17: 5.8}  # ms, each size after single tokens
NOVEL = [101, 102, 103, 104, 105, 106, 107, 108]  # no repeats: nothing for n-grams


def costs(
    target_ms: dict[int, float], draft_ms: float, k_max: int = 17, curve: type = CostCurve
) -> CostModel:
    model = CostModel(target=curve(k_max), draft=curve(k_max), overhead=0.0)
    for k, ms in target_ms.items():
        model.target.set(k, ms / 1000)
    model.draft.set(1, draft_ms / 1000)
    return model


def f16_costs() -> CostModel:
    """The F16 stand-in's shape, with the draft's largest batch measured as a profile does:
    17 tokens in one decode cost about 4 single ones, so reading a prompt is cheap per token."""
    model = costs(F16_TARGET, draft_ms=37)
    model.draft.set(17, 4 * 0.037)
    return model


class FrozenCurve(CostCurve):
    """A cost curve that never learns: a profile that is wrong and stays wrong, so that
    only the controller's own check of what its steps realized can save it."""

    def observe(self, k: int, seconds: float, *, repeated: bool = False) -> None:
        pass


def frozen(target_ms: dict[int, float], draft_ms: float) -> CostModel:
    return costs(target_ms, draft_ms, curve=FrozenCurve)


def acceptance_stats(
    model: float | None = None, model_steps: int = 0, tuning: Tuning = DEFAULT
) -> AcceptanceStats:
    """Acceptance statistics of a pair whose draft model's acceptance before any evidence
    is ``model`` (the default prior when None) and which has drafted ``model_steps`` steps:
    what earlier answers left behind. Only the statistics get that prior; the policy keeps
    its pair's tuning (where the prior also sets the pace that shares a prompt prefill)."""
    if model is not None:
        tuning = dataclasses.replace(tuning, model_prior=model)
    acceptance = AcceptanceStats(tuning)
    acceptance.model_steps = model_steps
    return acceptance


def policy(
    cost_model: CostModel,
    drafters: tuple[str, ...],
    *,
    gamma_cap: int | None = 16,
    fixed_gamma: int | None = None,
    stats: AcceptanceStats | None = None,
    tuning: Tuning = LONG_ANSWER,
) -> AdaptivePolicy:
    """An adaptive policy over a pair with these costs (and, if given, the statistics of
    earlier answers), with its answer begun as the engine begins it."""
    adaptive = AdaptivePolicy(PairState(cost_model, tuning, stats), drafters, gamma_cap, fixed_gamma)
    adaptive.begin()
    return adaptive


def view(
    context: list[int],
    budget: int = 16,
    lookups: dict[str, LookupDrafter] | None = None,
    catch_up: int = 1,
    remaining: int = 256,
    boundaries=None,
) -> StepView:
    """The view the engine hands a policy: ``lookups`` propose from ``context`` (an n-gram
    drafter unless given), and the draft model is ``catch_up`` tokens behind it."""
    drafters = lookups if lookups is not None else {"ngram": NgramDrafter()}
    return StepView(
        context,
        budget,
        GREEDY,
        remaining,
        boundaries,
        proposal=lambda name, n: drafters[name].proposal(context, n),
        catch_up=lambda name: catch_up if name == "model" else 0,
    )


def plan(
    adaptive: AdaptivePolicy,
    context: list[int],
    budget: int = 16,
    lookups: dict[str, LookupDrafter] | None = None,
    catch_up: int = 1,
    remaining: int = 256,
) -> Plan:
    return adaptive.plan(view(context, budget, lookups, catch_up, remaining))


def model_price(adaptive: AdaptivePolicy, step_view: StepView) -> float:
    """Seconds the controller expects the draft model's next step to take."""
    return next(c.seconds for c in adaptive.choices(step_view).options if c.drafter == "model")


def banned(adaptive: AdaptivePolicy, option: str) -> bool:
    return adaptive.answer.bans.banned(option, adaptive.answer.steps)

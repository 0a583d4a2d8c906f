"""The one list of drafters (edgespec.decoding.drafters.registry), the one check of a
user's (drafter, γ) and the one place that turns it into a policy
(edgespec.decoding.choice)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import edgespec.decoding
from edgespec.decoding.auto import AdaptivePolicy, PairState
from edgespec.decoding.choice import MAX_GAMMA, check_choice, make_policy
from edgespec.decoding.costs import CostModel
from edgespec.decoding.drafters import (
    AUTO,
    CHOICE_HELP,
    CHOICES,
    DECODING_DRAFTERS,
    FIXED_CHOICES,
    LOOKUP_DRAFTERS,
    NONE,
    REGISTRY,
    LookupDrafter,
    registry,
)
from edgespec.decoding.policy import FixedPolicy
from edgespec.errors import RequestError

HEX_COLOUR = re.compile(r"#[0-9a-fA-F]{6}")


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_drafter_has_a_colour_a_one_line_help_a_kind_and_a_choice(name):
    spec = REGISTRY[name]
    assert spec.name == name
    assert HEX_COLOUR.fullmatch(spec.colour), spec.colour
    assert spec.description.strip() and "\n" not in spec.description
    assert CHOICE_HELP[name] == spec.description
    assert spec.priced_by in ("proposal", "draft decodes")
    assert name in CHOICES and name in FIXED_CHOICES
    assert (name in LOOKUP_DRAFTERS) == (spec.priced_by == "proposal") == spec.free
    assert (name in DECODING_DRAFTERS) == (spec.priced_by == "draft decodes")


def test_the_choices_are_auto_none_and_every_drafter_each_with_help():
    assert (AUTO, *REGISTRY, NONE) == CHOICES
    assert set(CHOICE_HELP) == set(CHOICES)
    assert all(CHOICE_HELP[c].strip() and "\n" not in CHOICE_HELP[c] for c in CHOICES)
    assert len({spec.colour.lower() for spec in REGISTRY.values()}) == len(REGISTRY)  # told apart


def _named_drafters(path: Path) -> list[tuple[int, str]]:
    """String constants naming a drafter in a module, docstrings aside."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in REGISTRY and id(node) not in docstrings
    ]


def test_the_controller_reads_declarations_not_drafter_names():
    """How a drafter is priced, tried or probed is its registry entry's to say: no module
    of the controller or the choice names one (a second decoding drafter, an EAGLE head,
    would otherwise take edits all over)."""
    decoding = Path(edgespec.decoding.__file__).parent
    modules = [*sorted((decoding / "auto").glob("*.py")), decoding / "policy.py", decoding / "choice.py"]
    named = {path.name: found for path in modules if (found := _named_drafters(path))}
    assert not named
    assert _named_drafters(decoding / "drafters" / "registry.py")  # the check finds names


@pytest.mark.needs_models
def test_a_pair_builds_the_lookup_drafters_and_the_draft_model_only_with_a_draft(pair):
    assert registry.available(False) == LOOKUP_DRAFTERS
    assert registry.available(True) == tuple(REGISTRY)
    alone = registry.build(registry.available(False), pair.target, None, has_grammar=True)
    assert tuple(alone) == LOOKUP_DRAFTERS
    assert all(isinstance(d, LookupDrafter) and d.name == name for name, d in alone.items())
    both = registry.build(registry.available(True), pair.target, pair.draft, has_grammar=False)
    assert tuple(both) == tuple(n for n in REGISTRY if not REGISTRY[n].needs_grammar)
    assert all(d.name == name for name, d in both.items())


def test_the_engine_asks_drafters_only_through_their_interface_and_their_specs():
    """No class checks on drafters in the loop: what a drafter needs its spec declares."""
    from pathlib import Path

    import edgespec.decoding.engine as engine
    import edgespec.decoding.generation as generation

    for module in (engine, generation):
        source = Path(module.__file__).read_text()
        assert "isinstance(" not in source and "getattr(" not in source, module.__name__


# -- check_choice ---------------------------------------------------------------------------


def refusal(drafter: object, gamma: object, *, has_draft: bool = True) -> RequestError:
    with pytest.raises(RequestError) as caught:
        check_choice(drafter, gamma, has_draft=has_draft)
    assert "\n" not in str(caught.value)  # one line
    return caught.value


def test_an_unknown_drafter_is_refused_naming_the_choices():
    error = refusal("medusa", AUTO)
    assert error.param == "drafter" and "medusa" in str(error)
    assert all(choice in str(error) for choice in CHOICES)
    assert refusal(None, AUTO).param == "drafter"


def test_the_draft_model_is_refused_without_a_draft():
    error = refusal("model", 4, has_draft=False)
    assert error.param == "drafter" and "draft model" in str(error)
    assert check_choice("model", 4, has_draft=True) == ("model", 4)
    assert check_choice(AUTO, AUTO, has_draft=False) == (AUTO, AUTO)  # auto does without


@pytest.mark.parametrize("gamma", [-1, MAX_GAMMA + 1, "many", True, 2.5])
def test_a_gamma_out_of_range_or_not_a_whole_number_is_refused(gamma):
    error = refusal("ngram", gamma)
    assert error.param == "gamma"


def test_gamma_above_the_largest_verified_batch_names_it():
    assert MAX_GAMMA == 64
    assert "64" in str(refusal("ngram", 65))
    assert "64" in str(refusal("ngram", -1))


def test_auto_and_whole_numbers_as_text_are_accepted():
    assert check_choice(AUTO, AUTO, has_draft=False) == (AUTO, AUTO)
    assert check_choice("ngram", "16", has_draft=False) == ("ngram", 16)
    assert check_choice(NONE, 0, has_draft=False) == (NONE, 0)
    assert check_choice("copy", MAX_GAMMA, has_draft=False) == ("copy", MAX_GAMMA)


# -- make_policy ----------------------------------------------------------------------------


class PairStates:
    """A pair_state callable that counts its calls (it may measure a cost profile)."""

    def __init__(self) -> None:
        self.calls = 0
        self.state = PairState(CostModel.empty(MAX_GAMMA + 1))

    def __call__(self) -> PairState:
        self.calls += 1
        return self.state


LOADED = (*LOOKUP_DRAFTERS, "model")


@pytest.mark.parametrize(("drafter", "gamma"), [("ngram", 4), ("model", 2), (NONE, 0), ("copy", 8)])
def test_fixed_settings_give_a_fixed_policy_without_the_pair_state(drafter, gamma):
    states = PairStates()
    policy = make_policy(drafter, gamma, loaded=LOADED, max_gamma=MAX_GAMMA, pair_state=states)
    assert isinstance(policy, FixedPolicy)
    assert (policy.drafter, policy.gamma) == (drafter, gamma)
    assert states.calls == 0


@pytest.mark.parametrize(
    ("drafter", "gamma", "allowed", "fixed"),
    [
        (AUTO, AUTO, LOADED, None),
        (AUTO, 3, LOADED, 3),
        ("ngram", AUTO, ("ngram",), None),
    ],
)
def test_auto_gives_the_adaptive_policy_over_the_pairs_state(drafter, gamma, allowed, fixed):
    states = PairStates()
    policy = make_policy(drafter, gamma, loaded=LOADED, max_gamma=MAX_GAMMA, pair_state=states)
    assert isinstance(policy, AdaptivePolicy)
    assert states.calls == 1 and policy.pair is states.state
    assert policy.allowed == allowed and policy.fixed_gamma == fixed and policy.gamma_cap == MAX_GAMMA


@pytest.mark.parametrize("gamma", [AUTO, 0, 5])
def test_no_drafter_is_target_only_whatever_gamma(gamma):
    """Target only has nothing to price: no cost profile is asked for."""
    states = PairStates()
    policy = make_policy(NONE, gamma, loaded=LOADED, max_gamma=MAX_GAMMA, pair_state=states)
    assert isinstance(policy, FixedPolicy) and (policy.drafter, policy.gamma) == (NONE, 0)
    assert states.calls == 0


def test_auto_chooses_among_the_loaded_drafters_in_registry_order():
    policy = make_policy(AUTO, AUTO, loaded=("model", "ngram"), max_gamma=16, pair_state=PairStates())
    assert isinstance(policy, AdaptivePolicy) and policy.allowed == ("ngram", "model")


@pytest.mark.parametrize(
    ("drafter", "gamma", "loaded"),
    [("model", AUTO, LOOKUP_DRAFTERS), (AUTO, 65, LOADED), ("ngram", "8", LOADED), ("medusa", 2, LOADED)],
)
def test_make_policy_trusts_a_checked_choice_and_asserts_it(drafter, gamma, loaded):
    """The request builder refuses a user's bad choice (check_choice, once); one that reaches
    make_policy unchecked is a programming error, and never reaches the pair state."""
    states = PairStates()
    with pytest.raises(AssertionError, match="checked choice"):
        make_policy(drafter, gamma, loaded=loaded, max_gamma=MAX_GAMMA, pair_state=states)
    assert states.calls == 0

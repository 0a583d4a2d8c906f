"""The one list of drafters. Every other place (the engine, the policies, the CLI, server
and app options, the UI's colours, the benchmark) derives from ``REGISTRY``, so a new
drafter cannot be forgotten by one of them: adding a method is adding a file in this folder
and one entry here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgespec.decoding.drafters.base import Drafter
from edgespec.decoding.drafters.copy import CopyDrafter
from edgespec.decoding.drafters.grammar import GrammarDrafter
from edgespec.decoding.drafters.model import ModelDrafter
from edgespec.decoding.drafters.ngram import NgramDrafter
from edgespec.decoding.drafters.reflow import ReflowDrafter
from edgespec.decoding.drafters.suffix import SuffixDrafter, SuffixIndex

if TYPE_CHECKING:
    from edgespec.runtime.model import Model

NONE, AUTO = "none", "auto"  # no drafting (target only), and the controller's choice
NONE_COLOUR = "#9ca3af"  # target tokens with no draft behind them


@dataclass(frozen=True)
class PairShared:
    """What the drafters of a loaded pair share across its answers: the engine owns one
    and hands it to every answer's factories."""

    suffixes: SuffixIndex = field(default_factory=SuffixIndex)  # every conversation's recent tokens


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter, and what it needs and offers: the engine reads these declarations, never
    the drafter's class."""

    name: str
    colour: str  # in the app's step chart and provenance view
    description: str  # one line, for --help and the app
    # Builds one answer's drafter for a loaded pair: (target, draft model or None, what
    # the pair's drafters share across answers).
    factory: Callable[[Model, Model | None, PairShared], Drafter]
    needs_model: bool = False  # drafts with the draft model: only where one is loaded
    needs_grammar: bool = False  # proposes only for an answer that follows a grammar
    takes_prediction: bool = False  # copies from the request's predicted output
    # Proposes for free (a lookup, no model call), so the engine may ask it for a
    # proposal at every step and hand that to the policy as data.
    free: bool = True
    # What the controller prices its step by: a free proposal (``PROPOSAL``, judged at
    # every step against what the answer commits), or the draft model's decodes
    # (``DRAFT_DECODES``: a catch-up, then one decode per drafted token; its acceptance is
    # learned only by drafting, so the controller tries it now and then and steers its γ
    # by its confidence as it drafts).
    priced_by: str = "proposal"
    # An index probe cheap enough to ask while the controller rests (nothing paid lately):
    # a long match wakes it (an answer that starts copying its source).
    probed_while_idle: bool = False

    def available(self, has_draft: bool) -> bool:
        """Can a pair with (or without) a draft model have this drafter?"""
        return has_draft or not self.needs_model


REGISTRY: dict[str, DrafterSpec] = {
    spec.name: spec
    for spec in (
        DrafterSpec(
            "ngram",
            "#9333ea",
            "copies what followed the answer's last few tokens earlier in the context",
            lambda target, draft, shared: NgramDrafter(),
            takes_prediction=True,
            probed_while_idle=True,
        ),
        DrafterSpec(
            "reflow",
            "#db2777",
            "the same lookup on text blind to line wrapping (reflowed paragraphs)",
            lambda target, draft, shared: ReflowDrafter(target),
        ),
        DrafterSpec(
            "copy",
            "#f97316",
            "follows a source the answer is rewriting, across its edits (and a predicted output)",
            lambda target, draft, shared: CopyDrafter(),
            takes_prediction=True,
        ),
        DrafterSpec(
            "suffix",
            "#ca8a04",
            "copies what followed the answer's last tokens in the pair's earlier conversations",
            lambda target, draft, shared: SuffixDrafter(shared.suffixes),
        ),
        DrafterSpec(
            "grammar",
            "#854d0e",
            "what the answer's grammar forces (JSON keys and punctuation), and values copied between",
            lambda target, draft, shared: GrammarDrafter(target),
            needs_grammar=True,
        ),
        DrafterSpec(
            "model",
            "#0f766e",
            "the small draft model of the target's vocabulary, drafting token by token",
            lambda target, draft, shared: ModelDrafter(draft, target),  # type: ignore[arg-type]
            needs_model=True,
            free=False,
            priced_by="draft decodes",
        ),
    )
}

PROPOSAL, DRAFT_DECODES = "proposal", "draft decodes"  # the prices a drafter's step can have
LOOKUP_DRAFTERS = tuple(name for name, spec in REGISTRY.items() if spec.priced_by == PROPOSAL)
# Priced by the draft model's decodes. The controller keeps one set of acceptance
# statistics for such a drafter (``PairStats.model``): a pair offers at most one.
DECODING_DRAFTERS = tuple(name for name, spec in REGISTRY.items() if spec.priced_by == DRAFT_DECODES)
assert len(DECODING_DRAFTERS) <= 1, "the controller's statistics price one decoding drafter"
assert all(spec.priced_by in (PROPOSAL, DRAFT_DECODES) for spec in REGISTRY.values())
FIXED_CHOICES = (*REGISTRY, NONE)  # what --drafter may name besides auto
CHOICES = (AUTO, *FIXED_CHOICES)
CHOICE_HELP = {
    AUTO: "the controller picks drafter and γ per step from measured costs (default)",
    NONE: "no drafting: the target decodes alone (the baseline)",
    **{name: spec.description for name, spec in REGISTRY.items()},
}


def available(has_draft: bool) -> tuple[str, ...]:
    """The drafters a pair with (or without) a draft model can have, in registry order."""
    return tuple(name for name, spec in REGISTRY.items() if spec.available(has_draft))


def build(
    names: tuple[str, ...],
    target: Model,
    draft: Model | None,
    *,
    has_grammar: bool,
    shared: PairShared | None = None,
) -> dict[str, Drafter]:
    """One answer's drafters among ``names``: those the answer can use (a grammar's only
    where it has one), by name, in registry order, over what the pair's drafters share
    (without ``shared``, nothing: the answer alone, as in a test)."""
    shared = shared if shared is not None else PairShared()
    return {
        name: REGISTRY[name].factory(target, draft, shared)
        for name in names
        if not REGISTRY[name].needs_grammar or has_grammar
    }

"""The one list of drafters. Every other place (the engine, the policies, the CLI, server
and app options, the UI's colours, the benchmark) derives from ``REGISTRY``, so a new
drafter cannot be forgotten by one of them: adding a method is adding a file in this folder
and one entry here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgespec.decoding.drafters.base import Drafter
from edgespec.decoding.drafters.copy import CopyDrafter
from edgespec.decoding.drafters.grammar import GrammarDrafter
from edgespec.decoding.drafters.model import ModelDrafter
from edgespec.decoding.drafters.ngram import NgramDrafter
from edgespec.decoding.drafters.reflow import ReflowDrafter

if TYPE_CHECKING:
    from edgespec.runtime.model import Model

LOOKUP, MODEL = "lookup", "model"  # kinds: free copies out of the context, or a draft model
NONE, AUTO = "none", "auto"  # no drafting (target only), and the controller's choice
NONE_COLOUR = "#9ca3af"  # target tokens with no draft behind them


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    kind: str  # LOOKUP or MODEL
    colour: str  # in the app's step chart and provenance view
    description: str  # one line, for --help and the app
    # Builds the drafter for a loaded pair: (target, draft model or None) -> drafter, or
    # None where the pair cannot have it (the draft model with no draft loaded).
    factory: Callable[[Model, Model | None], Drafter | None]


REGISTRY: dict[str, DrafterSpec] = {
    spec.name: spec
    for spec in (
        DrafterSpec(
            "ngram",
            LOOKUP,
            "#9333ea",
            "copies what followed the answer's last few tokens earlier in the context",
            lambda target, draft: NgramDrafter(),
        ),
        DrafterSpec(
            "reflow",
            LOOKUP,
            "#db2777",
            "the same lookup on text blind to line wrapping (reflowed paragraphs)",
            lambda target, draft: ReflowDrafter(target),
        ),
        DrafterSpec(
            "copy",
            LOOKUP,
            "#ea580c",
            "follows a source the answer is rewriting, across its edits (and a predicted output)",
            lambda target, draft: CopyDrafter(),
        ),
        DrafterSpec(
            "grammar",
            LOOKUP,
            "#059669",
            "what the answer's grammar forces (JSON keys and punctuation), and values copied between",
            lambda target, draft: GrammarDrafter(target),
        ),
        DrafterSpec(
            "model",
            MODEL,
            "#2563eb",
            "the small draft model of the target's vocabulary, drafting token by token",
            lambda target, draft: ModelDrafter(draft, target.n_vocab) if draft is not None else None,
        ),
    )
}

LOOKUP_DRAFTERS = tuple(name for name, spec in REGISTRY.items() if spec.kind == LOOKUP)
FIXED_CHOICES = (*REGISTRY, NONE)  # what --drafter may name besides auto
CHOICES = (AUTO, *FIXED_CHOICES)
CHOICE_HELP = {
    AUTO: "the controller picks drafter and γ per step from measured costs (default)",
    NONE: "no drafting: the target decodes alone (the baseline)",
    **{name: spec.description for name, spec in REGISTRY.items()},
}


def build(target: Model, draft: Model | None) -> dict[str, Drafter]:
    """Every drafter the pair can have, by name, in registry order."""
    drafters = {}
    for name, spec in REGISTRY.items():
        drafter = spec.factory(target, draft)
        if drafter is not None:
            drafters[name] = drafter
    return drafters

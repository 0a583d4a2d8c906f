"""Drafters: anything that proposes the next few tokens for the target to verify, one
file per method (listing this folder lists them). ``base`` holds the interface every
drafter implements; ``registry`` the one list of them (``REGISTRY``)."""

from edgespec.decoding.drafters.base import AnswerSetup, Draft, Drafter, DraftRequest, LookupDrafter, Proposal
from edgespec.decoding.drafters.copy import CopyDrafter
from edgespec.decoding.drafters.grammar import ForcedText, GrammarDrafter, GrammarGuide
from edgespec.decoding.drafters.model import ModelDrafter
from edgespec.decoding.drafters.ngram import NgramDrafter
from edgespec.decoding.drafters.reflow import ReflowDrafter
from edgespec.decoding.drafters.registry import (
    AUTO,
    CHOICE_HELP,
    CHOICES,
    DECODING_DRAFTERS,
    FIXED_CHOICES,
    LOOKUP_DRAFTERS,
    NONE,
    NONE_COLOUR,
    REGISTRY,
    DrafterSpec,
    PairShared,
)
from edgespec.decoding.drafters.suffix import SuffixDrafter, SuffixIndex

__all__ = [
    "AUTO",
    "CHOICES",
    "CHOICE_HELP",
    "DECODING_DRAFTERS",
    "FIXED_CHOICES",
    "LOOKUP_DRAFTERS",
    "NONE",
    "NONE_COLOUR",
    "REGISTRY",
    "AnswerSetup",
    "CopyDrafter",
    "Draft",
    "DraftRequest",
    "Drafter",
    "DrafterSpec",
    "ForcedText",
    "GrammarDrafter",
    "GrammarGuide",
    "LookupDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "PairShared",
    "Proposal",
    "ReflowDrafter",
    "SuffixDrafter",
    "SuffixIndex",
]

"""Drafters: anything that proposes the next few tokens for the target to verify, one
file per method (listing this folder lists them). ``base`` holds the interface every
drafter implements; adding a method is adding a file and naming it in ``DRAFTERS``."""

from edgespec.decoding.drafters.base import Draft, Drafter, DraftRequest, LookupDrafter
from edgespec.decoding.drafters.copy import CopyDrafter
from edgespec.decoding.drafters.model import ModelDrafter
from edgespec.decoding.drafters.ngram import NgramDrafter
from edgespec.decoding.drafters.reflow import ReflowDrafter

__all__ = [
    "CopyDrafter",
    "Draft",
    "DraftRequest",
    "Drafter",
    "LookupDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "ReflowDrafter",
]

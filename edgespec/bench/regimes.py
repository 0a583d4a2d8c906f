"""Benchmark regimes: which (target, draft) pair a benchmark loads.

* ``cpu``: the default pair as shipped (Q4_K_M). On a small CPU a pass over several tokens
  costs several times one, so drafting rarely pays except for free lookups.
* ``f16``: the default draft plus the default target re-quantized to F16. An F16 model on
  a CPU is bound by memory bandwidth, so verifying several tokens costs about as much as
  one: a stand-in for GPUs and Apple Silicon, where speculative decoding's classic
  speed-ups come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.models import catalog
from edgespec.models.resolve import resolve
from edgespec.runtime.quantize import quantize

REGIMES = {
    "cpu": "the default pair as shipped (quantized target)",
    "f16": "the default target re-quantized to F16 (verification nearly flat in tokens), default draft",
}


@dataclass(frozen=True)
class Pair:
    target: str  # a catalog name or a GGUF path, as EdgeSpec takes it
    draft: str


def pair_for(regime: str, target: str = "default", draft: str = "default", *, quiet: bool = False) -> Pair:
    """The models to load for ``regime``; in ``f16`` the target (given or default) is
    converted on first use and cached."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}")
    if regime == "cpu":
        return Pair(target, draft)
    source = resolve(catalog.default_name("target") if target == "default" else target, quiet=quiet)
    return Pair(str(quantize(source.path, "f16", quiet=quiet)), draft)

"""What speculation costs on this machine, measured: the cost model and its profile,
split by concern:

* ``curve``: ``CostCurve`` (seconds per decode by batch size, learned online) and
  ``implausible`` (a measured curve that cannot be right): pure arithmetic;
* ``costmodel``: ``CostModel`` (the target's and the draft's curves, the Python time per
  step), saved to and loaded from its profile;
* ``profile``: the profile on disk: reading (it is written with ``host.write_atomically``),
  what it is keyed by, and the speed the profiles measured here imply for a model never
  loaded (``measured_speed``);
* ``measure``: timing the models on this machine, whether other processes disturb it, and
  ``load_or_measure``, which decides between the profile on disk and a new measurement.
"""

from __future__ import annotations

from edgespec.decoding.costs.costmodel import PROVISIONAL, CostModel
from edgespec.decoding.costs.curve import CHEAP_UP_TO, CostCurve, cheap_sizes, implausible
from edgespec.decoding.costs.measure import (
    OtherLoad,
    draft_warmup_sizes,
    load_or_measure,
    machine_busy,
    target_warmup_sizes,
    warm_up,
)
from edgespec.decoding.costs.profile import (
    PROFILE_VERSION,
    describe_model,
    file_identity,
    measured_speed,
    profile_facts,
    profile_facts_for,
    profile_path,
    profile_path_for,
    read_profile,
)

__all__ = [
    "CHEAP_UP_TO",
    "PROFILE_VERSION",
    "PROVISIONAL",
    "CostCurve",
    "CostModel",
    "OtherLoad",
    "cheap_sizes",
    "describe_model",
    "draft_warmup_sizes",
    "file_identity",
    "implausible",
    "load_or_measure",
    "machine_busy",
    "measured_speed",
    "profile_facts",
    "profile_facts_for",
    "profile_path",
    "profile_path_for",
    "read_profile",
    "target_warmup_sizes",
    "warm_up",
]

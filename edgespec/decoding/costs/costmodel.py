"""The cost model: the target's and the draft's cost curves and the Python time per step,
and how it is saved to and loaded from its profile on disk."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.decoding.costs.curve import EMA, CostCurve, implausible
from edgespec.decoding.costs.profile import PROFILE_VERSION, read_profile
from edgespec.host import write_atomically

PROVISIONAL = "measured while the machine was busy or disturbed"  # why a profile is re-measured


@dataclass
class CostModel:
    """What speculation costs on this machine, measured, never assumed.

    * ``target``: seconds of one target pass by the tokens it verifies (k = γ + 1). On a
      CPU the curve is steep (k tokens cost several times one token); on a GPU it is
      nearly flat.
    * ``draft``: seconds of one draft-model decode by its batch size (1 while drafting;
      more when the draft's cache catches up with the committed text).
    * ``overhead``, ``plain_overhead``: seconds of Python work outside llama.cpp per
      drafting step and per plain step, learned apart: a drafting step's lookups and
      pricing cost several times a plain step's, and beside a fast GPU's pass that
      difference is a sizeable part of a step."""

    target: CostCurve
    draft: CostCurve
    overhead: float = 0.002
    plain_overhead: float = 0.002
    profile_path: Path | None = None
    measured_at: float = field(default_factory=time.time)
    provisional: bool = False  # measured on a busy machine, or disturbed twice: re-measured at the next load
    facts: dict[str, str] = field(default_factory=dict)  # what the profile is keyed by
    # Pairs of sizes (fewer, more tokens) where the target's curve falls, found at the same
    # depth by two measurements in a row (``curve.same_dips``): this machine's own, not a
    # disturbance, so the curve is not implausible for them.
    dips: tuple[tuple[int, int], ...] = ()

    @classmethod
    def empty(cls, k_max: int) -> CostModel:
        return cls(target=CostCurve(k_max), draft=CostCurve(k_max))

    def observe_overhead(self, seconds: float, *, plain: bool = False) -> None:
        if seconds < 0:
            return
        if plain:
            self.plain_overhead = (1 - EMA) * self.plain_overhead + EMA * seconds
        else:
            self.overhead = (1 - EMA) * self.overhead + EMA * seconds

    # -- persistence --------------------------------------------------------------------

    def save(self, *, merge: bool = True) -> None:
        """Write the measured points atomically, keeping (with ``merge``) those of the
        profile on disk that this model does not cover (an engine allowing a larger γ
        measured them). Two processes saving at once each replace the file whole: the last
        one wins, and the file is never half written."""
        if self.profile_path is None:
            return
        data = (read_profile(self.profile_path) if merge else None) or {}
        if data.get("version") != PROFILE_VERSION:
            data = {}
        target, draft = dict(data.get("target", {})), dict(data.get("draft", {}))
        target.update(self.target.to_json())
        draft.update(self.draft.to_json())
        record = {
            "version": PROFILE_VERSION,
            "facts": self.facts,
            "measured_at": self.measured_at,
            "provisional": self.provisional,
            "stale": False,
            "dips": [list(pair) for pair in self.dips],
            "target": target,
            "draft": draft,
            "overhead": self.overhead,
            "plain_overhead": self.plain_overhead,
        }
        write_atomically(self.profile_path, json.dumps(record, indent=1))

    def load(self) -> str | None:
        """Load the profile on disk; the reason it cannot be used, or None when it was
        loaded (a missing file is "missing")."""
        if self.profile_path is None or not self.profile_path.is_file():
            return "missing"
        data = read_profile(self.profile_path)
        if data is None or data.get("version") != PROFILE_VERSION:
            return "unreadable or from an older version"
        try:
            target = {int(k): float(v) for k, v in data["target"].items()}
            self.target.load_json(data["target"])
            self.draft.load_json(data["draft"])
            self.overhead = float(data.get("overhead", self.overhead))
            self.plain_overhead = float(data.get("plain_overhead", self.overhead))
            self.measured_at = float(data.get("measured_at", 0.0))
            self.dips = tuple((int(a), int(b)) for a, b in data.get("dips", []))
        except (ValueError, KeyError, TypeError, AttributeError):
            return "corrupt"
        if data.get("stale"):
            return "marked stale: costs seen while generating disagreed with it"
        if data.get("provisional"):
            return PROVISIONAL
        reason = implausible(target, self.dips)
        if reason:
            return f"implausible ({reason})"
        self.target.freeze_baseline()
        return None

    def mark_stale(self) -> None:
        """Costs seen online disagree with the profile: the next load re-measures it."""
        if self.profile_path is None:
            return
        data = read_profile(self.profile_path)
        if data is not None and not data.get("stale"):
            data["stale"] = True
            write_atomically(self.profile_path, json.dumps(data, indent=1))

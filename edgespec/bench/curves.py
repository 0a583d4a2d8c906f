"""The replay's machine cost curves (``bench/data/curves.toml``): what a target pass over
k tokens and a draft decode cost on a machine we do not have, and the controller's cost
model as a profile measured there would give it (``edgespec.bench.replay``)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from edgespec.decoding.costs import CostModel
from edgespec.errors import EdgespecError

# -- cost curves ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """What a machine charges: a target pass over k tokens is ``target_s × target(k)``; a
    draft decode over k tokens is ``target_s × draft_ratio × draft(k)``. Shapes are given
    at a few sizes and interpolated (extrapolated along the last segment beyond them)."""

    name: str
    about: str
    target_s: float
    target: dict[int, float]
    draft_ratio: float
    draft: dict[int, float]
    python_s: float = 0.0005  # per step, whatever the option: the controller's own time
    # On a GPU a target pass costs more when the passes before it had another size (README,
    # GPUs): the extra (× target_s) of a multi-token pass after one of another size, by
    # size, and of the first and the second single-token pass after a multi-token one. A
    # curve without them prices every pass by its size alone, as a CPU does.
    reshape: dict[int, float] = field(default_factory=dict)
    back_to_one: tuple[float, float] = (0.0, 0.0)
    # Where a decode of several sequences' passes costs more than one sequence's pass of
    # as many tokens (a 2-core EPYC): each token beyond one per pass costs at least this
    # many times ``target_s``. 0: a decode is priced by its tokens alone.
    shared_token: float = 0.0

    def decode_seconds(self, sequences: int, tokens: int) -> float:
        """A target decode of ``sequences`` passes holding ``tokens`` tokens."""
        alone = self.target_seconds(tokens)
        if sequences < 2 or not self.shared_token:
            return alone
        spread = self.target_seconds(sequences) + (tokens - sequences) * self.shared_token * self.target_s
        return max(alone, spread)

    def target_seconds(self, k: int) -> float:
        return self.target_s * _interpolate(self.target, k)

    def step_seconds(self, k: int) -> float:
        """A step over ``k`` tokens with no draft model: its target pass and its own time."""
        return self.target_seconds(k) + self.python_s

    def history_seconds(self, k: int, last: int, before_last: int) -> float:
        """What a target pass over ``k`` tokens costs beyond ``target_seconds(k)`` after
        passes of ``last`` and ``before_last`` tokens."""
        if not self.reshape:
            return 0.0
        if k >= 2:
            return self.target_s * _interpolate(self.reshape, k) if last != k else 0.0
        if last >= 2:
            return self.target_s * self.back_to_one[0]
        if before_last >= 2:
            return self.target_s * self.back_to_one[1]
        return 0.0

    def draft_seconds(self, k: int) -> float:
        return self.target_s * self.draft_ratio * _interpolate(self.draft, k)


def _interpolate(points: dict[int, float], k: int) -> float:
    ks = sorted(points)
    values = [points[size] for size in ks]
    if k <= ks[-1]:
        return float(np.interp(k, ks, values))
    slope = (values[-1] - values[-2]) / (ks[-1] - ks[-2])
    return values[-1] + slope * (k - ks[-1])


CURVES_FILE = Path(__file__).with_name("data") / "curves.toml"


def _figures(where: str, values: dict) -> dict:
    """A curve table's figures as ``Curve`` holds them (TOML keys are strings)."""
    try:
        out = dict(values)
        for name in ("target", "draft", "reshape"):
            if name in out:
                out[name] = {int(k): float(v) for k, v in out[name].items()}
        for name in ("target_s", "draft_ratio", "python_s", "shared_token"):
            if name in out:
                out[name] = float(out[name])
        if "back_to_one" in out:
            first, second = out["back_to_one"]
            out["back_to_one"] = (float(first), float(second))
    except (AttributeError, TypeError, ValueError) as e:
        raise EdgespecError(f"{where}: a figure is not a number where one belongs ({e})") from None
    return out


def load_curves(path: Path = CURVES_FILE) -> dict[str, Curve]:
    """The cost curves of ``path``, by name in the file's order: one table each with
    ``Curve``'s fields, a ``provenance`` (where the figures come from; not kept), and
    optionally ``based_on``, an earlier curve whose figures it keeps where it gives none."""
    try:
        tables = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise EdgespecError(f"{path}: cannot read the cost curves ({e})") from None
    known = {f.name for f in fields(Curve)} - {"name"}
    required = ("about", "target_s", "target", "draft_ratio", "draft")
    curves: dict[str, Curve] = {}
    for name, table in tables.items():
        where = f"{path}: curve {name!r}"
        if not isinstance(table, dict):
            raise EdgespecError(f"{where}: not a table")
        values = {k: v for k, v in table.items() if k not in ("provenance", "based_on")}
        unknown = sorted(set(values) - known)
        if unknown:
            raise EdgespecError(f"{where}: unknown field {unknown[0]!r}")
        values = _figures(where, values)
        base = table.get("based_on")
        if base is not None:
            if base not in curves:
                raise EdgespecError(f"{where}: based on {base!r}, which no table before it defines")
            values = {k: getattr(curves[base], k) for k in known} | values
        missing = [k for k in required if k not in values]
        if missing:
            raise EdgespecError(f"{where}: missing field {missing[0]!r}")
        curves[name] = Curve(name, **values)
    return curves


CURVES = load_curves()


def curve_from_costs(costs: CostModel, name: str = "here") -> Curve:
    """The curve of a measured cost profile (this machine's, for ``--curve here``): a replay
    on it can be set beside ``edgespec bench`` on the same machine, to see what the replay
    leaves out (the controller's Python time, the machine's noise)."""
    target, draft = costs.target, costs.draft
    if not (target.measured(1) and draft.measured(1)):
        raise EdgespecError("the cost profile has no single-token costs to replay")
    one, draft_one = target.estimate(1), draft.estimate(1)
    return Curve(
        name,
        f"this machine's measured profile: T(1) {1000 * one:.0f} ms, a draft token {draft_one / one:.2f}x",
        one,
        {k: target.estimate(k) / one for k in range(1, target.k_max + 1) if target.measured(k)},
        draft_one / one,
        {k: draft.estimate(k) / draft_one for k in range(1, draft.k_max + 1) if draft.measured(k)} | {1: 1.0},
        python_s=costs.overhead,
    )


def cost_model(curve: Curve, k_max: int) -> CostModel:
    """The controller's cost model as a profile measured on ``curve``'s machine would be."""
    costs = CostModel.empty(k_max)
    for k in range(1, k_max + 1):
        # (a profile times each size after two single-token passes: edgespec.decoding.costs)
        costs.target.set(k, curve.target_seconds(k) + curve.history_seconds(k, 1, 1))
        costs.draft.set(k, curve.draft_seconds(k))
    costs.target.freeze_baseline()
    costs.draft.freeze_baseline()
    costs.overhead = costs.plain_overhead = curve.python_s
    return costs

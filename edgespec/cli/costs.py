"""``edgespec costs show | measure``: the cost profiles the controller prices steps with.

``show`` lists every profile in the cache, marks the one the given pair would use on this
machine, and prints its curve; it loads no model. ``measure`` loads the pair and measures
its profile again, replacing what was there.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys

from edgespec.api import DEFAULT_MAX_GAMMA, EdgeSpec, RuntimeOptions
from edgespec.cli.generate import rpc_options
from edgespec.cli.rpc_flags import add_rpc_flags
from edgespec.decoding.costs import (
    CHEAP_UP_TO,
    CostCurve,
    cheap_sizes,
    describe_model,
    implausible,
    load_or_measure,
    profile_facts_for,
    profile_path_for,
    read_profile,
)
from edgespec.errors import EdgespecError
from edgespec.models import catalog, store
from edgespec.models.resolve import resolve
from edgespec.runtime import rpc

_SHOWN_SIZES = (1, 2, 3, 4, 5, 8, 9, 16, 17, 24, 32, 33, 48, 64, 65)


def add_parser(subparsers) -> None:
    costs = subparsers.add_parser("costs", help="show or re-measure what decoding costs on this machine")
    actions = costs.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("show", "every cost profile, and the one in use"), ("measure", "measure it again")):
        action = actions.add_parser(name, help=text)
        action.add_argument("--target", default="default", help="catalog name or GGUF path")
        action.add_argument("--draft", default="default", help="catalog name, GGUF path, or 'none'")
        action.add_argument("--n-gpu-layers", type=int, default=-1)
        action.add_argument("--n-gpu-layers-draft", type=int, default=-1)
        action.add_argument("--threads", type=int, default=None)
        add_rpc_flags(action)
    costs.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return show(args) if args.action == "show" else measure(args)


def _names(args: argparse.Namespace) -> tuple[str, str | None]:
    target = catalog.default_name("target") if args.target == "default" else args.target
    draft = None if args.draft in ("", "none") else args.draft
    if draft == "default":
        draft = catalog.default_name("draft")
    return target, draft


def show(args: argparse.Namespace) -> int:
    target_arg, draft_arg = _names(args)
    target = resolve(target_arg, download=False)
    draft = resolve(draft_arg, download=False) if draft_arg else None
    about = (
        describe_model(target.name, target.path, args.n_gpu_layers, args.threads),
        describe_model(draft.name, draft.path, args.n_gpu_layers_draft, args.threads) if draft else None,
    )
    layout = _layout(args)  # no worker is reached: show loads nothing
    facts = profile_facts_for(*about, layout)
    names = (target.name, draft.name if draft else None)
    in_use = profile_path_for(facts, *names)
    folder = store.home() / "costs"
    profiles = sorted(folder.glob("*.json")) if folder.is_dir() else []
    print(f"cost profiles in {folder}:")
    for path in profiles:
        print(f"  {'*' if path == in_use else ' '} {path.name}  {_status(path)}")
    if not profiles:
        print("  (none yet)")
    where = f"split ({layout})" if layout else "on this machine"
    print(f"\nfor {target.name} + {draft.name if draft else 'no draft'} {where} ({facts['cpu']}):")
    print(f"  {in_use.name}")
    data = read_profile(in_use) if in_use.is_file() else None
    if data is None:
        print("  not measured yet: it is measured on first use, or now with `edgespec costs measure`")
        return 0
    print(f"  {_status(in_use)}")
    alone = read_profile(profile_path_for(profile_facts_for(*about), *names)) if layout else None
    _print_curves(data, alone, split=bool(layout))
    draft_costs = data.get("draft") or {}
    one = _curve(data).estimate(1)
    if "1" in draft_costs and not math.isnan(one):
        per_token = float(draft_costs["1"])
        share = per_token / one
        print(f"  draft model: {1000 * per_token:.1f} ms per token (×{share:.2f} of a target token)")
    # Not measured with the passes: what a step's Python costs depends on the drafters and
    # the text, so each run learns it from its own steps, starting from this guess.
    guess = 1000 * float(data.get("overhead", 0.0))
    print(f"  Python per step: learned while generating (each run starts from {guess:.2f} ms)")
    return 0


def _layout(args: argparse.Namespace) -> str:
    """The device layout ``--rpc`` and ``--tensor-split`` name, as a profile is keyed by it."""
    if args.tensor_split is not None and not args.rpc:
        raise EdgespecError("--tensor-split splits the target over workers: give them with --rpc")
    split = rpc.parse_split(args.tensor_split) if args.tensor_split is not None else ()
    return rpc.layout_key(rpc.parse_endpoints(args.rpc), split) if args.rpc else ""


def _curve(data: dict) -> CostCurve:
    curve = CostCurve(max(DEFAULT_MAX_GAMMA + 1, *(int(k) for k in data.get("target", {}) or {"1": 0})))
    curve.load_json(data.get("target", {}))
    return curve


def _print_curves(data: dict, alone: dict | None, *, split: bool) -> None:
    """The target's pass by size; beside it, for a split target, the same target on this
    machine alone (where that was measured)."""
    curve = _curve(data)
    one = curve.estimate(1)
    measured = {k: curve.estimate(k) for k in range(1, curve.k_max + 1) if curve.measured(k)}
    cheap = cheap_sizes(measured)
    local = _curve(alone) if alone is not None else None
    print("  target pass by tokens verified (ms, and × one token; cheap: no mix of other sizes beats it)")
    if alone is not None:
        print("          split               on this machine alone")
    for k in sorted(set(_SHOWN_SIZES) | set(cheap)):
        if curve.measured(k) and not math.isnan(one):
            mark = "  cheap" if k in cheap else ""
            row = f"    {k:3d}: {1000 * curve.estimate(k):8.1f}  ×{curve.estimate(k) / one:5.2f}"
            if local is not None and local.measured(k) and local.measured(1):
                row += f"    {1000 * local.estimate(k):8.1f}  ×{local.estimate(k) / local.estimate(1):5.2f}"
            print(row + mark)
    if len(cheap) > 1:
        sizes = ", ".join(map(str, cheap))
        print(f"  cheap sizes below {CHEAP_UP_TO}: {sizes} tokens (long drafts pay best verified at these)")
    if split and alone is None:
        print("  on this machine alone: not measured yet (`edgespec costs measure` without --rpc)")


def _status(path) -> str:
    data = read_profile(path)
    if data is None:
        return "corrupt: it will be measured again at next use"
    when = float(data.get("measured_at") or path.stat().st_mtime)
    stamp = datetime.datetime.fromtimestamp(when).strftime("%Y-%m-%d %H:%M")
    flags = [f"measured {stamp}"]
    if data.get("provisional"):
        flags.append("provisional (measured while the machine was busy, or disturbed twice)")
    if data.get("stale"):
        flags.append("stale (costs seen since disagree; re-measured at next use)")
    target = data.get("target") or {}
    try:
        points = {int(k): float(v) for k, v in target.items()}
        kept = tuple((int(a), int(b)) for a, b in data.get("dips") or [])
        reason = implausible(points, kept)
    except (TypeError, ValueError):
        reason, kept = "unreadable points", ()
    if reason:
        flags.append(f"implausible: {reason}")
    else:  # a dip two measurements in a row found: the machine's own
        falls = [
            f"{b} tokens at {points[b] / points[a]:.2f}× of {a}" for a, b in kept if {a, b} <= set(points)
        ]
        if falls:
            flags.append(f"measured twice alike, so kept: {', '.join(falls)}")
    facts = data.get("facts") or {}
    if facts.get("layout"):
        flags.append(f"split: {facts['layout']}")
    if facts.get("cpu"):
        flags.append(facts["cpu"] + (f" ({facts['isa']})" if facts.get("isa") else ""))
    return ", ".join(flags)


def measure(args: argparse.Namespace) -> int:
    if args.threads is not None and args.threads < 1:
        raise EdgespecError(f"threads must be >= 1 (got {args.threads})")
    target_arg, draft_arg = _names(args)
    endpoints, split = rpc_options(args)
    lm = EdgeSpec(
        target_arg,
        draft_arg,
        RuntimeOptions(
            n_gpu_layers=args.n_gpu_layers,
            n_gpu_layers_draft=args.n_gpu_layers_draft,
            threads=args.threads,
            rpc=endpoints,
            tensor_split=split,
        ),
    )
    try:
        costs = load_or_measure(
            lm.target,
            lm.draft,
            lm.engine.max_gamma + 1,
            force=True,
            notify=lambda note: print(note, file=sys.stderr),
        )
    finally:
        lm.close()
    print(f"measured: {costs.profile_path}")
    args.action = "show"
    return show(args)

"""``edgespec bench``: speculative configurations against target-only, on the prompt corpus.

The corpus has a dev half (tune on it) and a test half (report from it; the default).
Runs are interleaved per prompt and repeat (every configuration in turn, the order turning
by one from round to round so that none always runs first), one line each
on stderr as it finishes; then per category the decode-phase and end-to-end ratios to
target-only (geometric mean over prompts, worst prompt, spread over repeats), τ, and the
share of steps per drafter; then the bars the project holds itself to.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from edgespec.api import DEFAULT_MAX_GAMMA, EdgeSpec, RuntimeOptions
from edgespec.bench import sessions
from edgespec.bench.corpus import CATEGORIES, SPLITS, select
from edgespec.bench.regimes import REGIMES, pair_for
from edgespec.bench.runner import (
    ALL_CONFIGS,
    BASELINE,
    DEFAULT_LABELS,
    SAMPLING,
    Cell,
    Config,
    ExternalRun,
    Report,
    Run,
    geomean,
    machine,
    require_external,
    run_benchmark,
    with_baselines,
)
from edgespec.cli.generate import rpc_options
from edgespec.cli.rpc_flags import add_rpc_flags
from edgespec.decoding.auto import describe
from edgespec.errors import EdgespecError

BARS_FILE = Path(__file__).parents[1] / "bench" / "data" / "bars.toml"


@dataclass(frozen=True)
class Bars:
    """What the benchmark holds the project to, on decode-phase ratios: one field per key of
    ``bench/data/bars.toml``, which says what each one means and why."""

    auto: float
    auto_per_prompt: float
    min_tokens_per_prompt: int
    f16_share_of_best_fixed: float
    peak_memory: float
    auto_by_category: dict[str, float]
    f16_auto_by_category: dict[str, float]
    config_by_category: dict[str, dict[str, float]]


def load_bars(path: Path = BARS_FILE) -> Bars:
    """The bars of ``path``; a key missing, unknown or of the wrong type, or a category or
    configuration that does not exist, is a one-line error naming the file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise EdgespecError(f"{path}: cannot read the bars ({e})") from None
    names = [f.name for f in fields(Bars)]
    for key in data:
        if key not in names:
            raise EdgespecError(f"{path}: unknown bar {key!r} (known: {', '.join(names)})")
    for key in names:
        if key not in data:
            raise EdgespecError(f"{path}: missing bar {key!r}")

    def floors(key: str, table: dict) -> dict[str, float]:
        return {category: float(table[category]) for category in known_categories(path, key, table)}

    try:
        for label in data["config_by_category"]:
            if label not in ALL_CONFIGS:
                raise EdgespecError(f"{path}: config_by_category: unknown configuration {label!r}")
        return Bars(
            auto=float(data["auto"]),
            auto_per_prompt=float(data["auto_per_prompt"]),
            min_tokens_per_prompt=int(data["min_tokens_per_prompt"]),
            f16_share_of_best_fixed=float(data["f16_share_of_best_fixed"]),
            peak_memory=float(data["peak_memory"]),
            auto_by_category=floors("auto_by_category", data["auto_by_category"]),
            f16_auto_by_category=floors("f16_auto_by_category", data["f16_auto_by_category"]),
            config_by_category={
                label: floors(f"config_by_category.{label}", table)
                for label, table in data["config_by_category"].items()
            },
        )
    except (AttributeError, TypeError, ValueError) as e:
        raise EdgespecError(f"{path}: a bar has the wrong type ({e})") from None


def known_categories(path: Path, key: str, given: Iterable[str]) -> list[str]:
    """``given``, or one line naming the file and key where a category does not exist."""
    for category in given:
        if category not in CATEGORIES:
            raise EdgespecError(f"{path}: {key}: unknown category {category!r}")
    return list(given)


BARS = load_bars()
# Where the instruments that moved out of the package run now (from a checkout).
MOVED = {
    "app": "python -m lab.app_cost",
    "llamacpp": "python -m lab.llamacpp bench",
    "llamacpp_build": "python -m lab.llamacpp build",
}


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmark drafters against target-only decoding")
    bench.add_argument("--regime", choices=list(REGIMES), default="cpu",
                       help="cpu: the pair as shipped; f16: the target re-quantized to F16, a stand-in "
                            "for GPUs (converted once, cached)")  # fmt: skip
    bench.add_argument("--target", default="default", help="catalog name or GGUF path")
    bench.add_argument("--draft", default="default", help="catalog name or GGUF path")
    bench.add_argument("--split", choices=SPLITS, default="test",
                       help="corpus half: dev (tune on it), test (report from it; default), all")  # fmt: skip
    bench.add_argument("--categories", nargs="+", default=None, metavar="CAT",
                       help=f"prompt categories (default: all of {', '.join(CATEGORIES)})")  # fmt: skip
    bench.add_argument("--prompts", nargs="+", default=None, metavar="ID",
                       help="run only these corpus prompts (ids as printed), any split")  # fmt: skip
    bench.add_argument("--configs", nargs="+", default=None, metavar="LABEL",
                       help=f"configurations (default: {', '.join(DEFAULT_LABELS)}; "
                            f"known: {', '.join(ALL_CONFIGS)})")  # fmt: skip
    bench.add_argument("--sampling", action="store_true",
                       help=f"also run the sampling set at T={SAMPLING[0].temperature}")  # fmt: skip
    bench.add_argument("--seed", type=int, default=1, help="seed of the first repeat's sampling runs")
    bench.add_argument("--repeats", type=int, default=1, help="runs of each configuration per prompt")
    bench.add_argument("--max-tokens", type=int, default=None,
                       help="tokens per run (default 128; with --sessions 64)")  # fmt: skip
    bench.add_argument("--ctx", type=int, default=4096)
    bench.add_argument("--threads", type=int, default=None)
    bench.add_argument("--n-gpu-layers", type=int, default=-1)
    bench.add_argument("--n-gpu-layers-draft", type=int, default=-1)
    add_rpc_flags(bench)
    bench.add_argument("--json", metavar="FILE", help="also write every run and the summary as JSON")
    sessions.add_arguments(bench)
    for flag in MOVED:  # accepted only to say where the instrument went
        bench.add_argument(f"--{flag.replace('_', '-')}", nargs="*", default=None, help=argparse.SUPPRESS)
    bench.add_argument("--parallel", type=int, default=None, metavar="N",
                       help="run the several-answers benchmark instead: N prompts answered one "
                            "after another and all at once on one pair, total tokens/s side by side "
                            "(--max-tokens defaults to 96 here)")  # fmt: skip
    bench.add_argument("--parallel-drafters", nargs="+", default=["none", "auto"], metavar="DRAFTER",
                       help="the drafters --parallel compares (default: none auto)")  # fmt: skip
    bench.set_defaults(handler=run)


def configs_from(args: argparse.Namespace, known: dict[str, Config] = ALL_CONFIGS) -> list[Config]:
    labels = args.configs or DEFAULT_LABELS
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise EdgespecError(f"unknown configuration {unknown[0]!r} (known: {', '.join(known)})")
    configs = [known[label] for label in labels]
    if args.sampling:
        configs += [c for c in SAMPLING if c not in configs]
    return with_baselines(configs)


def check_args(args: argparse.Namespace) -> None:
    """Reject bad values before loading gigabytes of model."""
    if args.max_tokens < 2:
        raise EdgespecError(f"bench needs --max-tokens of at least 2 (got {args.max_tokens})")
    if args.repeats < 1:
        raise EdgespecError(f"bench needs --repeats of at least 1 (got {args.repeats})")
    if args.ctx < 16:
        raise EdgespecError(f"context length must be at least 16 tokens (got {args.ctx})")


# The bars a caller adds for one category (a lab instrument's, over its own configurations).
MoreBars = Callable[[str, dict[str, Cell]], list[tuple[bool, str]]]


def run(args: argparse.Namespace) -> int:
    for flag, command in MOVED.items():
        if getattr(args, flag) is not None:
            raise EdgespecError(f"--{flag.replace('_', '-')} moved out of the package: from a checkout of "
                                f"edgespec, run {command}")  # fmt: skip
    if args.rpc and (args.sessions is not None or args.parallel is not None):
        raise EdgespecError(
            "--rpc splits the corpus benchmark's target; --sessions and --parallel run on one machine"
        )
    if args.sessions is not None:  # whole sessions against servers: bench/sessions.py
        return sessions.run_from_args(args)
    if args.parallel is not None:  # several answers at once: bench/parallel.py
        from edgespec.bench import parallel

        return parallel.run_from_args(args)
    return run_corpus(args)


def run_corpus(
    args: argparse.Namespace,
    *,
    known: dict[str, Config] = ALL_CONFIGS,
    external: ExternalRun | None = None,
    more_bars: MoreBars | None = None,
) -> int:
    """The corpus benchmark over ``args.configs`` (labels of ``known``); ``external`` answers
    the configurations marked external, and ``more_bars`` adds bars over them."""
    args.max_tokens = 128 if args.max_tokens is None else args.max_tokens
    check_args(args)
    prompts = select(args.split, args.categories, args.prompts)
    if not prompts:
        raise EdgespecError("no corpus prompt matches these --prompts and --categories")
    configs = configs_from(args, known)
    require_external(configs, external)
    lm = load_pair(args, configs)
    print(f"edgespec bench: regime {args.regime}, split {args.split}, {len(prompts)} prompts × "
          f"{len(configs)} configurations × {args.repeats} repeats, {args.max_tokens} tokens")  # fmt: skip
    state = lm.controller_state()  # measured (or loaded) here, before the header and every run
    print(f"machine: {machine()}")
    split = f" ({lm.target.placement.describe()})" if lm.target.placement is not None else ""
    print(f"target {lm.target.name}{split}, draft {lm.draft.name if lm.draft else 'none'}")
    print(f"measured costs: {describe(state.costs)}", flush=True)
    report = run_benchmark(
        lm,
        prompts,
        configs,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        seed=args.seed,
        on_run=print_run,
        external=external,
    )
    bars = print_report(report, regime=args.regime, more_bars=more_bars)
    if args.json:
        write_json(args.json, args, lm, report, bars)
    return 0


def load_pair(args: argparse.Namespace, configs: list[Config]) -> EdgeSpec:
    """The regime's pair; the draft model only where a configuration can use it."""
    pair = pair_for(args.regime, args.target, args.draft)
    needs_draft = any(c.drafter in ("model", "auto") for c in configs)
    endpoints, split = rpc_options(args)
    return EdgeSpec(
        pair.target,
        pair.draft if needs_draft else None,
        RuntimeOptions(
            n_ctx=args.ctx,
            threads=args.threads,
            n_gpu_layers=args.n_gpu_layers,
            n_gpu_layers_draft=args.n_gpu_layers_draft,
            rpc=endpoints,
            tensor_split=split,
            # As in `generate`: auto may draft a long copy in one verification.
            max_gamma=max([DEFAULT_MAX_GAMMA] + [c.gamma for c in configs if isinstance(c.gamma, int)]),
        ),
    )


def write_json(path: str, args: argparse.Namespace, lm: EdgeSpec, report: Report, bars: list[Bar]) -> None:
    """``--json``: the run's settings, its report and its bars, in one file."""
    record = {
        "regime": args.regime,
        "split": args.split,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "target": lm.target.name,
        "draft": lm.draft.name if lm.draft else None,
        "placement": lm.target.placement.facts() if lm.target.placement is not None else None,
        **report.as_dict(),
        "bars": [{"pass": ok, "text": text} for ok, text in bars],
    }
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1, ensure_ascii=False)


def print_run(run: Run) -> None:
    steps = " ".join(f"{k}:{v}" for k, v in sorted(run.steps.items()))
    print(f"  {run.prompt:<26} #{run.repeat} {run.config:<22} decode {run.decode_tps:6.2f} tok/s  "
          f"e2e {run.e2e_tps:6.2f}  τ {run.tau:5.2f}  acc {run.acceptance:4.0%}  {run.tokens:4d} tok  "
          f"steps {steps}", file=sys.stderr, flush=True)  # fmt: skip


def _fmt(x: float) -> str:
    return "   –" if math.isnan(x) else f"{x:4.2f}"


def print_report(
    report: Report, *, regime: str = "cpu", more_bars: MoreBars | None = None
) -> list[tuple[bool, str]]:
    summary = report.summary()
    print(f"\nmachine: {report.machine}\nmeasured costs: {report.costs}")
    print("ratios to target-only at the same temperature: geometric mean over prompts (spread over repeats), "
          "worst prompt")  # fmt: skip
    for category, cells in summary.items():
        print(f"\n== {category} ({max(c.prompts for c in cells.values())} prompts) ==")
        print(f"{'configuration':<22} {'decode':>7} {'×target':>8} {'spread':>11} {'worst':>30} "
              f"{'e2e ×':>6} {'worst':>30} {'τ':>5}  steps")  # fmt: skip
        for label, cell in cells.items():
            steps = " ".join(f"{k} {v:.0%}" for k, v in cell.steps.items())
            is_base = label in (BASELINE.label, SAMPLING[0].label)  # its ratios are 1 by definition
            worst = "" if is_base else f"{cell.decode_worst[0]} {_fmt(cell.decode_worst[1])}"
            e2e_worst = "" if is_base else f"{cell.e2e_worst[0]} {_fmt(cell.e2e_worst[1])}"
            spread = "" if is_base else f"{_fmt(cell.decode_spread[0])}–{_fmt(cell.decode_spread[1])}"
            print(
                f"{label:<22} {cell.decode_tps:7.2f} {_fmt(cell.decode_ratio):>8} {spread:>11} "
                f"{worst:>30} {_fmt(cell.e2e_ratio):>6} {e2e_worst:>30} {cell.tau:5.2f}  {steps}"
            )
    noise = noise_line(report)
    if noise:
        print(f"\n{noise}")
    return print_bars(report, summary, regime=regime, more_bars=more_bars)


_SAME_WORK = " — no drafting step: the same work as target-only, this run's noise"


def _undrafted(report: Report) -> dict[str, list[float]]:
    auto = next((c for c in report.configs if c.label == "auto"), None)
    return report.undrafted_ratios(auto) if auto is not None else {}


def noise_line(report: Report) -> str:
    """How far apart the same work measured in this run: the answers where auto took no
    drafting step did what target-only did."""
    ratios = [r for values in _undrafted(report).values() for r in values]
    if len(ratios) < 2:
        return ""
    return (
        f"this run's noise: on {len(ratios)} answers auto took no drafting step (the same work as "
        f"target-only); their decode ratios were {min(ratios):.2f}–{max(ratios):.2f} "
        f"(geometric mean {geomean(ratios):.3f})"
    )


Bar = tuple[bool, str]


def near(ratio: float, bar: float) -> str:
    """A ratio to two decimals, or three where two would print the bar it misses (×0.97
    failing a bar of 0.97 reads as a mistake)."""
    text = f"{ratio:.2f}"
    if text == f"{bar:.2f}" and ratio < bar:
        return f"{math.floor(ratio * 1000) / 1000:.3f}"  # rounded down: 0.9696 is 0.969
    return text


def _min_tokens(report: Report, prompt: str, config: str) -> int:
    return min((r.tokens for r in report.runs if r.prompt == prompt and r.config == config), default=0)


def bars(
    report: Report,
    summary: dict[str, dict[str, Cell]],
    *,
    regime: str = "cpu",
    held_to: Bars = BARS,
    more_bars: MoreBars | None = None,
) -> list[Bar]:
    """The bars of ``held_to`` (the shipped ones by default) that this report can be read
    against, and ``more_bars``' per category, each passed or failed, all on decode-phase
    ratios."""
    b = held_to
    configs = {c.label: c for c in report.configs}
    out: list[Bar] = []
    undrafted = _undrafted(report)  # (the same for every category: read once)
    for category, cells in summary.items():
        cell = cells.get("auto")
        if cell is None:
            continue
        out += _auto_bars(report, category, cell, b, undrafted)
        if regime == "f16":
            out += _f16_bars(category, cells, b, configs)
        if more_bars is not None:
            out += more_bars(category, cells)
    out += _config_bars(summary, b)
    out += _memory_bars(report, b)
    return out


def _bar(ok: bool, text: str) -> Bar:
    return (bool(ok), text)


def _auto_bars(
    report: Report, category: str, cell: Cell, b: Bars, undrafted: dict[str, list[float]]
) -> list[Bar]:
    """Auto against target-only in one category: its geometric mean, every long enough
    prompt, and the category's own floor."""
    out: list[Bar] = []
    r = cell.decode_ratio
    out.append(_bar(r >= b.auto, f"{category}: auto ×{near(r, b.auto)} of target-only (geometric mean; "
                                 f"bar ≥ {b.auto:.2f})"))  # fmt: skip
    long_prompts = {
        p: v for p, v in cell.per_prompt.items() if _min_tokens(report, p, "auto") >= b.min_tokens_per_prompt
    }
    low = {p: v for p, v in long_prompts.items() if v < b.auto_per_prompt}
    for prompt, ratio in low.items():
        runs = len(report.prompt_ratios(prompt, ALL_CONFIGS["auto"], "decode_tps"))
        why = _SAME_WORK if len(undrafted.get(prompt, [])) == runs else ""
        shown = near(ratio, b.auto_per_prompt)
        out.append(_bar(False, f"{prompt}: auto ×{shown} of target-only (bar ≥ {b.auto_per_prompt:.2f} "
                               f"on every prompt){why}"))  # fmt: skip
    if long_prompts and not low:
        worst = min(long_prompts, key=lambda p: long_prompts[p])
        n, worst_text = len(long_prompts), f"worst {worst} ×{long_prompts[worst]:.2f}"
        out.append(
            _bar(
                True,
                f"{category}: auto ≥ {b.auto_per_prompt:.2f}× on all {n} prompts of ≥ "
                f"{b.min_tokens_per_prompt} tokens ({worst_text})",
            )
        )
    floor = b.auto_by_category.get(category)
    if floor is not None:
        out.append(
            _bar(r >= floor, f"{category}: auto ×{near(r, floor)} (geometric mean; bar ≥ {floor:.2f})")
        )
    return out


def _f16_bars(category: str, cells: dict[str, Cell], b: Bars, configs: dict[str, Config]) -> list[Bar]:
    """With an F16 draft: auto against the best fixed configuration, and the category's
    F16 floor."""
    out: list[Bar] = []
    r = cells["auto"].decode_ratio
    # Target-only is a fixed configuration too: where every fixed draft loses (the draft
    # model on chat, on a CPU whose F16 curve is not flat), the best fixed choice is not to
    # draft, and auto is held to that.
    fixed = {
        label: c.decode_ratio
        for label, c in cells.items()
        if configs[label].fixed and configs[label].temperature == 0 and not configs[label].external
    }
    if fixed:
        best = max(fixed, key=lambda label: fixed[label])
        share = b.f16_share_of_best_fixed
        out.append(
            _bar(
                r >= share * fixed[best],
                f"{category}: auto ×{r:.2f} within {round(100 * (1 - share))} % of the best fixed "
                f"configuration ({best} ×{fixed[best]:.2f})",
            )
        )
    floor = b.f16_auto_by_category.get(category)
    if floor is not None:
        out.append(_bar(r >= floor, f"{category} (f16): auto ×{near(r, floor)} (bar ≥ {floor:.2f})"))
    return out


def _config_bars(summary: dict[str, dict[str, Cell]], b: Bars) -> list[Bar]:
    """Fixed configurations' own floors against target-only, per category."""
    out: list[Bar] = []
    for label, floors in b.config_by_category.items():
        for category, floor in floors.items():
            cell = summary.get(category, {}).get(label)
            if cell is not None:
                r = cell.decode_ratio
                text = f"{category}: {label} ×{near(r, floor)} of target-only (bar ≥ {floor:.2f})"
                out.append(_bar(r >= floor, text))
    return out


def _memory_bars(report: Report, b: Bars) -> list[Bar]:
    """Peak memory against the model files and KV caches (where the report measured it)."""
    if not report.memory_budget:
        return []
    ratio = report.peak_rss / report.memory_budget
    return [
        _bar(
            ratio <= b.peak_memory,
            f"peak memory {report.peak_rss / 1e9:.2f} GB = {ratio:.2f} × (model files + KV caches "
            f"{report.memory_budget / 1e9:.2f} GB) (bar ≤ {b.peak_memory:.2f})",
        )
    ]


def print_bars(
    report: Report,
    summary: dict[str, dict[str, Cell]],
    *,
    regime: str = "cpu",
    more_bars: MoreBars | None = None,
) -> list[Bar]:
    found = bars(report, summary, regime=regime, more_bars=more_bars)
    print("\n== bars (decode-phase ratios) ==")
    for ok, text in found:
        print(f"[{'pass' if ok else 'FAIL'}] {text}")
    return found

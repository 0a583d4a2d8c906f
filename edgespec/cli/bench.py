"""``edgespec bench``: speculative configurations against target-only, side by side.

Prints one line per run as it finishes, then per category: generation tokens/s, ratio to
target-only measured in the same run, τ, acceptance and the time split; then the bars
the project holds itself to, each with the measured value.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.bench.prompts import PROMPTS
from edgespec.bench.runner import BASELINE, GREEDY, SAMPLING, Report, Run, run_benchmark
from edgespec.decoding.controller import describe
from edgespec.errors import EdgespecError


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmark drafters against target-only decoding")
    bench.add_argument("--target", default="default")
    bench.add_argument("--draft", default="default")
    bench.add_argument("--categories", nargs="+", choices=list(PROMPTS), default=list(PROMPTS), metavar="CAT",
                       help=f"prompt categories (default: all of {', '.join(PROMPTS)})")  # fmt: skip
    bench.add_argument("--max-tokens", type=int, default=192, help="tokens per run (default 192)")
    bench.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds for sampling runs")
    bench.add_argument("--repeats", type=int, default=3, help="runs of each greedy configuration")
    bench.add_argument("--no-sampling", action="store_true", help="skip the temperature 0.7 runs")
    bench.add_argument("--greedy-only-configs", nargs="+", default=None, metavar="LABEL",
                       help="run only these greedy configurations (labels as printed)")  # fmt: skip
    bench.add_argument("--ctx", type=int, default=4096)
    bench.add_argument("--threads", type=int, default=None)
    bench.add_argument("--n-gpu-layers", type=int, default=-1)
    bench.add_argument("--n-gpu-layers-draft", type=int, default=-1)
    bench.add_argument("--json", metavar="FILE", help="also write every run as JSON")
    bench.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.max_tokens < 2:
        raise EdgespecError("bench needs --max-tokens of at least 2")
    if args.repeats < 1:
        raise EdgespecError("bench needs --repeats of at least 1")
    lm = EdgeSpec(
        args.target,
        args.draft,
        RuntimeOptions(
            n_ctx=args.ctx,
            threads=args.threads,
            n_gpu_layers=args.n_gpu_layers,
            n_gpu_layers_draft=args.n_gpu_layers_draft,
            max_gamma=32,
        ),
    )
    state = lm.controller_state()  # warm-up happens here, outside every measurement
    greedy = GREEDY
    if args.greedy_only_configs:
        greedy = [c for c in GREEDY if c.label in args.greedy_only_configs or c is BASELINE]
    configs = greedy + ([] if args.no_sampling else SAMPLING)
    print(f"target {lm.target.name}, draft {lm.draft.name if lm.draft else 'none'}; "
          f"measured costs: {describe(state.costs)}", flush=True)  # fmt: skip
    report = run_benchmark(
        lm,
        args.categories,
        configs,
        max_tokens=args.max_tokens,
        seeds=args.seeds,
        repeats=args.repeats,
        on_run=_print_run,
    )
    report.costs = describe(state.costs)
    print_report(report, args.categories, greedy, [] if args.no_sampling else SAMPLING)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report.as_dict(), fh, indent=1)
    return 0


def _print_run(run: Run) -> None:
    seed = f" seed {run.seed}" if run.seed is not None else ""
    print(f"  {run.category:<18} {run.config:<24}{seed:<8} {run.gen_tps:6.2f} tok/s  τ {run.tau:5.2f}  "
          f"acc {run.acceptance:4.0%}", file=sys.stderr, flush=True)  # fmt: skip


def _ratio(report: Report, category: str, label: str, baseline: str) -> float:
    return report.median(category, label, "gen_tps") / report.median(category, baseline, "gen_tps")


def print_report(report: Report, categories: list[str], greedy, sampling) -> None:
    header = (f"{'configuration':<24} {'tok/s':>7} {'×target':>8} {'τ':>6} {'accept':>7} "
              f"{'prefill':>8} {'draft':>7} {'verify':>7} {'other':>7} {'py%':>5}")  # fmt: skip
    for category in categories:
        print(f"\n== {category} ==")
        print(header)
        for configs in (greedy, sampling):
            if not configs:
                continue
            base = configs[0].label
            for config in configs:
                runs = [r for r in report.runs if r.category == category and r.config == config.label]
                if not runs:
                    continue
                split = {k: statistics.fmean(r.time_s[k] for r in runs) for k in runs[0].time_s}
                print(f"{config.label:<24} {report.median(category, config.label, 'gen_tps'):7.2f} "
                      f"{_ratio(report, category, config.label, base):8.2f} "
                      f"{report.median(category, config.label, 'tau'):6.2f} "
                      f"{report.median(category, config.label, 'acceptance'):7.0%} "
                      f"{split['prefill']:8.2f} {split['draft']:7.2f} {split['verify']:7.2f} "
                      f"{split['other']:7.3f} "
                      f"{100 * report.median(category, config.label, 'python_share'):5.1f}")  # fmt: skip
    print("\n== overall (geometric mean of per-category ratios to target-only) ==")
    for configs in (greedy, sampling):
        for config in configs[1:]:
            ratios = [_ratio(report, c, config.label, configs[0].label) for c in categories]
            ratios = [r for r in ratios if r > 0 and not math.isnan(r)]
            if ratios:
                print(f"{config.label:<24} ×{math.exp(statistics.fmean(map(math.log, ratios))):.2f}")
    print_bars(report, categories, greedy, sampling)


def print_bars(report: Report, categories: list[str], greedy, sampling) -> None:
    print("\n== bars ==")

    def bar(ok: bool, text: str) -> None:
        print(f"[{'pass' if ok else 'FAIL'}] {text}")

    labels = {c.label for c in greedy}
    if "auto" in labels:
        for category in categories:
            r = _ratio(report, category, "auto", BASELINE.label)
            fixed = {c.label: _ratio(report, category, c.label, BASELINE.label) for c in greedy if c.fixed}
            best_label = max(fixed, key=fixed.get)
            bar(r >= 0.97, f"{category}: auto ×{r:.2f} of target-only (bar ≥ 0.97)")
            if category in ("code editing", "summarization"):
                bar(r >= 1.3, f"{category}: auto ×{r:.2f} (bar ≥ 1.30)")
            bar(r >= 0.9 * fixed[best_label],
                f"{category}: auto within 10 % of the best fixed configuration "
                f"({best_label} ×{fixed[best_label]:.2f}; auto ×{r:.2f})")  # fmt: skip
    if "model γ=4" in labels and "code writing" in categories:
        r = _ratio(report, "code writing", "model γ=4", BASELINE.label)
        bar(r >= 0.85, f"code writing: model γ=4 greedy ×{r:.2f} of target-only (bar ≥ 0.85)")
    shares = [report.median(c, cfg.label, "python_share") for c in categories for cfg in greedy + sampling]
    shares = [s for s in shares if not math.isnan(s)]
    if shares:
        worst = max(shares)
        bar(worst <= 0.03, f"Python work outside llama.cpp: at most {100 * worst:.1f} % of step time "
                           "(median per configuration; bar ≤ 3 %)")  # fmt: skip
    if sampling:
        token = [r.tau for r in report.runs if r.config == "model γ=4 token T=0.7"]
        block = [r.tau for r in report.runs if r.config == "model γ=4 block T=0.7"]
        if token and block:
            t, b = statistics.fmean(token), statistics.fmean(block)
            bar(b > t, f"block verification τ {b:.3f} vs token verification τ {t:.3f} at T=0.7 (bar: above)")
    ratio = report.peak_rss / report.memory_budget
    bar(ratio <= 1.15, f"peak memory {report.peak_rss / 1e9:.2f} GB = {ratio:.2f} × (model files + KV caches "
                       f"{report.memory_budget / 1e9:.2f} GB) (bar ≤ 1.15)")  # fmt: skip

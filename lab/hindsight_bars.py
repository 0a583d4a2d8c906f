"""Issue 97's replayed bars on every curve, from the recorded corpus the suite replays
(``tests/fixtures/replay-corpus.json.gz``): ``auto``'s share of the best single fixed
configuration per answer (copy-heavy categories, geometric mean, each half), its worst
answer of 16 tokens or more against plain decoding, and four answers at once with
``auto`` against ``--drafter none`` at once (aggregate, each half).

    python -m lab.hindsight_bars [--curve epyc-f25 cpu ...] [--no-parallel]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

from edgespec.api import EdgeSpec
from edgespec.bench.llamacpp_replay import LABEL as LLAMACPP
from edgespec.bench.recording import Recording, read_set
from edgespec.bench.replay import CURVES, FIXED_GRID, add_best_fixed, add_llamacpp, replay
from edgespec.bench.replay_parallel import ParallelReplay, compare, groups
from edgespec.decoding.auto import DEFAULT, Tuning

FIXTURE = Path(__file__).parent.parent / "tests" / "fixtures" / "replay-corpus.json.gz"
COPY_HEAVY = ("edit-", "sum-", "rag-", "complete-")


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def alone(
    lm: EdgeSpec, recordings: list[Recording], curve: str, tuning: Tuning = DEFAULT
) -> tuple[float, float, float, str]:
    """(auto's share of best fixed, auto / none geomean, worst auto / none, its id) over the
    copy-heavy recordings, replayed as one session."""
    heavy = [rec for rec in recordings if rec.id.startswith(COPY_HEAVY)]
    results = replay(heavy, lm.target, lm.draft, CURVES[curve], ["target only", "auto", *FIXED_GRID], tuning)
    add_best_fixed(results)
    shares = [results[r.id]["auto"].decode_tps / results[r.id]["best fixed"].decode_tps for r in heavy]
    plain = {r.id: results[r.id]["auto"].decode_tps / results[r.id]["target only"].decode_tps for r in heavy}
    long_ones = [r.id for r in heavy if len(r.answer) - 1 >= 16]
    worst = min(long_ones, key=plain.__getitem__)
    return geomean(shares), geomean(list(plain.values())), plain[worst], worst


def against_llamacpp(lm: EdgeSpec, recordings: list[Recording], curve: str) -> dict[str, float]:
    """``auto`` ÷ llama.cpp's prompt-lookup loop replayed on the same answers, by copy-heavy
    category (geometric mean over its answers)."""
    heavy = [rec for rec in recordings if rec.id.startswith(COPY_HEAVY)]
    results = replay(heavy, lm.target, lm.draft, CURVES[curve], ["target only", "auto"])
    add_llamacpp(heavy, CURVES[curve], results)
    by: dict[str, list[float]] = {}
    for rec in heavy:
        runs = results[rec.id]
        by.setdefault(rec.category, []).append(runs["auto"].decode_tps / runs[LLAMACPP].decode_tps)
    return {category: geomean(values) for category, values in by.items()}


def at_once(lm: EdgeSpec, recordings: list[Recording], curve: str, answers: int = 4) -> tuple[float, float]:
    """(auto / none at once in aggregate, the worst group's) over groups of ``answers``."""
    replay_ = ParallelReplay(lm.target, lm.draft, CURVES[curve], answers)
    tokens = {"auto": 0, "target only": 0}
    seconds = {"auto": 0.0, "target only": 0.0}
    worst = math.inf
    for group in groups(recordings, answers):
        runs = compare(replay_, group)
        for label in tokens:
            tokens[label] += runs[label]["at once"].tokens
            seconds[label] += runs[label]["at once"].seconds
        worst = min(worst, runs["auto"]["at once"].rate / runs["target only"]["at once"].rate)
    rate = {label: tokens[label] / seconds[label] for label in tokens}
    return rate["auto"] / rate["target only"], worst


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.hindsight_bars", description=__doc__)
    parser.add_argument("--curve", nargs="+", default=list(CURVES))
    parser.add_argument("--no-parallel", action="store_true")
    parser.add_argument("--no-alone", action="store_true")
    parser.add_argument("--risk-share", type=float, help="the bound's share; 1e6 lifts it")
    parser.add_argument("--llamacpp", action="store_true", help="auto against llama.cpp's loop, by category")
    args = parser.parse_args()
    lm = EdgeSpec(quiet=True)
    tuning = DEFAULT if args.risk_share is None else dataclasses.replace(DEFAULT, risk_share=args.risk_share)
    _, by_split = read_set(FIXTURE)
    for curve in args.curve:
        started = time.monotonic()
        line = [f"{curve:15}"]
        for split, recordings in by_split.items():
            if not args.no_alone:
                share, plain, worst, worst_id = alone(lm, recordings, curve, tuning)
                line.append(
                    f"{split}: share {share:.3f}, auto/none {plain:.2f}, worst {worst:.3f} {worst_id}"
                )
            if args.llamacpp:
                ratios = against_llamacpp(lm, recordings, curve)
                line.append(f"{split} vs llama.cpp: " + ", ".join(f"{c} {r:.2f}" for c, r in ratios.items()))
            if not args.no_parallel:
                aggregate, worst_group = at_once(lm, recordings, curve)
                line.append(f"at once {aggregate:.3f} (worst group {worst_group:.3f})")
        print(" | ".join(line), f"[{time.monotonic() - started:.0f} s]", flush=True)


if __name__ == "__main__":
    main()

"""The best token tree per answer, in hindsight: what verifying several proposals at once could add.

The ceiling (``bench.ceiling``) knows at every step how far each proposal will hold. A
controller cannot know that; what it could do instead is verify several proposals in one
target pass (a token tree: the lookups' proposals and the draft model's guesses side by
side, sharing their common prefixes) and keep whichever holds longest. This prices every
fixed tree of a grid (which lookups, how many tokens each, how many draft-model tokens)
over a recorded answer and keeps, per answer, the fastest, picked in hindsight; beside it
the fastest single-proposal configuration of the same grid.

The draft model is charged only up to one token past its first wrong guess, as if it had
stopped there, and a tree's pass is priced at its size alone, so the tree's figure errs
high. If it still stays far below the ceiling, what separates a controller from the
ceiling is knowing where proposals break, and no tree buys that.

    python -m edgespec.bench.best_tree --curve xeon gpu --split test
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import product

from edgespec.bench.ceiling import fastest_seconds, held_runs, lookup_proposals, lookup_runs, model_runs
from edgespec.bench.recording import Recording, recorded_corpus
from edgespec.bench.replay import CURVES, Curve, replay
from edgespec.bench.runner import geomean
from edgespec.errors import run_reporting_errors

LOOKUP_TOKENS = (0, 4, 8, 16, 32)  # each lookup's proposal, cut to this many tokens
MODEL_TOKENS = (0, 2, 4, 8)  # the draft model's guesses, at most this many
LABELS = ("auto", "best single", "best tree", "ceiling")
COPY_HEAVY = ["code editing", "code completion", "summarization", "rag"]


@dataclass(frozen=True)
class Tree:
    """One fixed configuration: the lookups whose proposals it verifies (None: all), their
    length, and the draft model's."""

    lookups: frozenset[str] | None
    lookup_tokens: int
    model_tokens: int

    @property
    def single(self) -> bool:
        """One proposal per step (or none): what a controller without trees can verify."""
        one_lookup = self.lookups is not None and len(self.lookups) == 1
        return self.lookup_tokens == 0 or (one_lookup and self.model_tokens == 0)


def tree_size(proposals: Iterable[list[int]]) -> int:
    """Tokens in the tree of ``proposals``: a prefix two of them share is verified once."""
    return len({tuple(p[:j]) for p in proposals for j in range(1, len(p) + 1)})


def trees(lookup_names: Iterable[str]) -> list[Tree]:
    """The grid: every lookup alone and all of them together, at every length, with and
    without the draft model."""
    sets: list[frozenset[str] | None] = [None, *(frozenset([n]) for n in sorted(lookup_names))]
    return [Tree(s, g, m) for s, g, m in product(sets, LOOKUP_TOKENS, MODEL_TOKENS) if g or s is None]


def tree_seconds(
    tree: Tree,
    along: list[dict[str, list[int]]],
    answer: list[int],
    model: list[int],
    step_s: Callable[[int], float],
    draft_token_s: float,
) -> float:
    """Seconds to decode answer positions 1..n-1 verifying ``tree`` at every step: one pass
    over the last token and the tree, committing the longest branch that holds and one
    more token."""
    position, seconds = 1, 0.0
    while position < len(answer):
        chosen = [
            p[: tree.lookup_tokens]
            for name, p in along[position].items()
            if p and tree.lookup_tokens and (tree.lookups is None or name in tree.lookups)
        ]
        held = max((held_runs(p, answer, position) for p in chosen), default=0)
        guessed = min(tree.model_tokens, model[position] + 1)
        held = max(held, min(guessed, model[position]))
        seconds += step_s(1 + tree_size(chosen) + guessed) + guessed * draft_token_s
        position += min(held, len(answer) - 1 - position) + 1
    return seconds


def best_ratios(
    along: list[dict[str, list[int]]],
    answer: list[int],
    model: list[int],
    step_s: Callable[[int], float],
    draft_token_s: float,
) -> tuple[float, float]:
    """The answer's decode-phase speed over plain decoding's under the fastest
    single-proposal configuration of the grid and under the fastest tree, each picked for
    this answer in hindsight (1.0 for an answer of one token)."""
    if len(answer) < 2:
        return 1.0, 1.0
    plain = (len(answer) - 1) * step_s(1)
    names = {name for by_name in along for name in by_name}
    single, tree = 0.0, 0.0
    for candidate in trees(names):
        ratio = plain / tree_seconds(candidate, along, answer, model, step_s, draft_token_s)
        tree = max(tree, ratio)
        if candidate.single:
            single = max(single, ratio)
    return single, tree


def compare(lm, recordings: list[Recording], curve: Curve) -> dict[str, dict[str, float]]:
    """Per category (and "all"): geometric means of auto's replayed ratio, the best single
    configuration's, the best tree's and the ceiling's."""
    replayed = replay(recordings, lm.target, lm.draft, curve, ("target only", "auto"))
    rows: dict[str, dict[str, list[float]]] = {rec.category: {} for rec in recordings} | {"all": {}}
    longest = lm.target.options.max_outputs - 1  # (the ceiling's; each tree cuts its own)
    for rec in recordings:
        # an answer that ended has one more step to take, the one that makes its end (as
        # the replay and the ceiling count it)
        sequence = rec.answer + ([lm.target.eos] if rec.ended else [])
        along = lookup_proposals(lm.target, rec.prompt, sequence, longest)
        runs = model_runs(rec.guesses, sequence)
        single, tree = best_ratios(along, sequence, runs, curve.step_seconds, curve.draft_seconds(1))
        plain = (len(sequence) - 1) * curve.step_seconds(1)
        fastest = fastest_seconds(
            lookup_runs(along, sequence), runs, curve.step_seconds, curve.draft_seconds(1), longest
        )
        ceiling = plain / fastest if len(sequence) > 1 else 1.0
        ran = replayed[rec.id]
        auto = ran["auto"].decode_tps / ran["target only"].decode_tps
        for key in (rec.category, "all"):
            for label, value in zip(LABELS, (auto, single, tree, ceiling), strict=True):
                rows[key].setdefault(label, []).append(value)
    return {key: {label: geomean(v) for label, v in row.items()} for key, row in rows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgespec.bench.best_tree",
        description="auto beside the best single configuration and the best token tree per answer "
        "(both picked in hindsight) and the ceiling, replayed on cost curves",
    )
    parser.add_argument("--curve", nargs="+", default=["xeon", "gpu"], choices=sorted(CURVES))
    parser.add_argument("--split", default="test", choices=("dev", "test", "all"))
    parser.add_argument("--categories", nargs="+", default=COPY_HEAVY, metavar="CAT")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)

    def run() -> int:
        lm, recordings = recorded_corpus(args.split, args.categories, args.max_tokens)
        for name in args.curve:
            print(
                f"\n'{name}' curve, {args.split} half, {args.max_tokens} tokens: "
                "geometric means over plain decoding"
            )
            print(f"{'category':18s} {'auto':>6s} {'best single':>12s} {'best tree':>10s} {'ceiling':>8s}"
                  f" {'tree/ceiling':>13s} {'auto/tree':>10s}")  # fmt: skip
            for key, row in compare(lm, recordings, CURVES[name]).items():
                figures = " ".join(f"{row[label]:{w}.2f}" for label, w in (
                    ("auto", 6), ("best single", 12), ("best tree", 10), ("ceiling", 8)))  # fmt: skip
                share = f"{row['best tree'] / row['ceiling']:13.2f} {row['auto'] / row['best tree']:10.2f}"
                print(f"{key:18s} {figures} {share}")
        return 0

    return run_reporting_errors(run)


if __name__ == "__main__":
    sys.exit(main())

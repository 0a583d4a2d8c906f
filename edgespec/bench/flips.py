"""How often greedy text changes with how a prompt was read: near-ties flipped by batch
splits, measured per 1,000 tokens.

    .venv/bin/python -m edgespec.bench.flips [--split test] [--categories agent structured]
        [--max-tokens 64] [--json FILE]

llama.cpp's CPU kernels are not batch-invariant: the same position's logits differ in the
last bits with the size of the batch it was computed in, so where the two best tokens are
nearly tied, greedy decoding can take the other branch. Each prompt is answered greedily
four ways, all against the target alone read cold:

* ``none, cold``: the reference (a fresh sequence, the prompt read in 128-token batches);
* ``auto, cold``: speculation: the target verifies drafts in batches of γ+1;
* ``none, cached``: the prompt's state kept from an earlier answer, its last token decoded
  alone (what a returning conversation or a restored cache state gives);
* ``auto, cached``: both.

A flip is an answer whose tokens differ from the reference's; the rate is flips per 1,000
tokens compared. At each flip the target's logits there (read cold) are shown: the gap
between the reference's token and the other answer's, so a near-tie is told from a bug.
Every run is in this one process, on the same loaded pair, interleaved per prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.bench.corpus import CATEGORIES, SPLITS, CorpusPrompt, prompt_tokens, select, settings_extras
from edgespec.bench.runner import machine
from edgespec.errors import run_reporting_errors

WAYS = (("none", False), ("auto", False), ("none", True), ("auto", True))
REFERENCE = WAYS[0]


@dataclass
class Tally:
    answers: int = 0
    flips: int = 0
    tokens: int = 0  # tokens compared with the reference (up to the first difference)
    gaps: list[float] = field(default_factory=list)  # the logit gap at each flip

    @property
    def per_1000(self) -> float:
        return 1000 * self.flips / self.tokens if self.tokens else 0.0


def label(way: tuple[str, bool]) -> str:
    return f"{way[0]}, {'cached' if way[1] else 'cold'}"


def answer(lm: EdgeSpec, tokens: list[int], prompt: CorpusPrompt, way: tuple[str, bool], n: int) -> list[int]:
    drafter, cached = way
    lm.start_afresh()  # no earlier answer of this prompt for `suffix` to copy
    extras = settings_extras(prompt)
    if cached:  # an earlier answer leaves the prompt in the caches
        lm.generate(tokens, drafter="none", max_tokens=1, **extras)
    return list(lm.generate(tokens, drafter=drafter, max_tokens=n, **extras).token_ids)


def gap_at(lm: EdgeSpec, tokens: list[int], reference: list[int], other: list[int], at: int) -> float:
    """The target's logit of the reference's token minus the other answer's, at the first
    position where they differ (``at``, 1-based), read from a cold prefill."""
    sequence = lm.target.sequence(0)
    sequence.reset()
    row = sequence.decode([*tokens, *reference[: at - 1]], 1)[0]
    return float(row[reference[at - 1]] - row[other[at - 1]])


def compare(reference: list[int], other: list[int]) -> tuple[bool, int]:
    """(differs, tokens compared): compared up to and including the first difference."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return True, i + 1
    same = min(len(reference), len(other))
    return len(reference) != len(other), same


def run(lm: EdgeSpec, prompts: list[CorpusPrompt], max_tokens: int) -> dict[str, Tally]:
    tallies = {label(way): Tally() for way in WAYS[1:]}
    for prompt in prompts:
        tokens = prompt_tokens(lm, prompt)
        reference = answer(lm, tokens, prompt, REFERENCE, max_tokens)
        for way in WAYS[1:]:
            other = answer(lm, tokens, prompt, way, max_tokens)
            differs, compared = compare(reference, other)
            tally = tallies[label(way)]
            tally.answers += 1
            tally.flips += differs
            tally.tokens += compared
            mark = "same"
            if differs and compared <= min(len(reference), len(other)):
                gap = gap_at(lm, tokens, reference, other, compared)
                tally.gaps.append(round(gap, 4))
                mark = f"FLIP at token {compared} (logit gap {gap:.3f})"
            elif differs:
                mark = f"FLIP: one answer ends at token {compared}"
            print(f"  {prompt.id:<28} {label(way):<14} {mark}", file=sys.stderr, flush=True)
    return tallies


def report(tallies: dict[str, Tally]) -> None:
    print(f"{'against none, cold':<18} {'answers':>8} {'flips':>6} {'tokens':>7} {'per 1,000':>10}  widest")
    for name, t in tallies.items():
        widest = f"{max(map(abs, t.gaps)):.3f}" if t.gaps else "-"
        print(f"{name:<18} {t.answers:>8} {t.flips:>6} {t.tokens:>7} {t.per_1000:>10.2f}  {widest}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=SPLITS, default="test")
    parser.add_argument("--categories", nargs="+", default=["agent", "structured"], choices=CATEGORIES)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    def measure() -> None:
        prompts = select(args.split, args.categories)
        lm = EdgeSpec(options=RuntimeOptions(n_ctx=4096), quiet=True)
        lm.controller_state()
        print(f"machine: {machine()}; {len(prompts)} prompts ({args.split}: {', '.join(args.categories)}), "
              f"{args.max_tokens} tokens, greedy")  # fmt: skip
        tallies = run(lm, prompts, args.max_tokens)
        report(tallies)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump({name: asdict(t) for name, t in tallies.items()}, fh, indent=1)

    return run_reporting_errors(measure)


if __name__ == "__main__":
    sys.exit(main())

"""How far lookup proposals hold, by the length of the match behind them.

For every position of every recorded answer, each lookup drafter is asked for its proposal
as the engine would ask it, and the proposal is judged against the recorded answer: how
many of its tokens the answer goes on to write. Grouped by the drafter's match length (the
tokens of the answer, ending here, that equal its source), this gives the chance that the
next k proposed tokens all hold. It is what the controller's length buckets learn online,
measured once over the dev half, so that a long draft is priced with it.

    python -m edgespec.bench.holds --split dev --categories "code editing" summarization rag
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass, field

from edgespec.bench.recording import Recording
from edgespec.decoding.auto.tuning import DEFAULT
from edgespec.decoding.drafters import AnswerSetup
from edgespec.decoding.engine import Engine
from edgespec.decoding.generation import StepProposals
from edgespec.errors import run_reporting_errors
from edgespec.runtime.model import Model
from edgespec.runtime.tokens import common_prefix

SPANS = (1, 4, 8, 16, 32, 48)  # the k of "the next k tokens hold"


@dataclass
class Holds:
    """Per drafter and match-length bucket: proposals judged, and for each k in ``SPANS``
    how many of those that could hold k tokens (proposal and answer long enough) did."""

    edges: tuple[int, ...] = DEFAULT.length_edges
    seen: dict[tuple[str, int], dict[int, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )
    held: dict[tuple[str, int], dict[int, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )
    tokens: dict[tuple[str, int], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    def bucket(self, match_len: int) -> int:
        return max(i for i, edge in enumerate(self.edges) if edge <= max(match_len, 1))

    def add(self, drafter: str, match_len: int, proposal: list[int], answer_left: int, run: int) -> None:
        key = (drafter, self.bucket(match_len))
        for k in SPANS:
            if len(proposal) >= k and answer_left >= k:
                self.seen[key][k] += 1
                self.held[key][k] += run >= k
        # per-token acceptance: each proposed token judged, given those before it held
        judged = min(run + 1, len(proposal), answer_left)
        self.tokens[key][0] += min(run, judged)
        self.tokens[key][1] += judged

    def table(self) -> str:
        head = f"{'drafter':20s} {'match':>6s} {'proposals':>9s} {'per token':>9s}" + "".join(
            f"{'≥' + str(k):>8s}" for k in SPANS
        )
        lines = [head]
        for drafter, b in sorted(self.seen):
            seen, held = self.seen[(drafter, b)], self.held[(drafter, b)]
            hits, judged = self.tokens[(drafter, b)]
            hi = self.edges[b + 1] - 1 if b + 1 < len(self.edges) else None
            match = f"{self.edges[b]}" + ("+" if hi is None else "" if hi == self.edges[b] else f"-{hi}")
            cells = "".join(f"{held[k] / seen[k]:8.2f}" if seen[k] else f"{'':8s}" for k in SPANS)
            lines.append(f"{drafter:20s} {match:>6s} {seen[1]:9d} {hits / max(judged, 1):9.2f}{cells}")
        return "\n".join(lines)


def measure(
    target: Model,
    recordings: list[Recording],
    predictions: dict[str, list[int]] | None = None,
    longest: int = 64,
) -> Holds:
    """Every lookup's proposal at every position of every recording, judged; with
    ``predictions`` (by recording id) the lookups also copy from those Predicted Outputs,
    and their proposals that do are counted apart (as "ngram←prediction")."""
    holds = Holds()
    for rec in recordings:
        # (no grammar: the grammar's drafter proposes only under a schema, judged apart)
        setup = AnswerSetup(rec.prompt, (predictions or {}).get(rec.id, []))
        drafters = Engine(target).free_drafters(setup)
        answer = rec.answer
        for i in range(1, len(answer)):
            proposals = StepProposals(drafters, rec.prompt + answer[:i])
            for name in drafters:
                p = proposals.get(name, min(longest, len(answer) - i))
                if p.tokens:
                    tokens = list(p.tokens)
                    source = f"{name}←prediction" if p.from_prediction else name
                    holds.add(source, p.evidence, tokens, len(answer) - i, common_prefix(tokens, answer[i:]))
    return holds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgespec.bench.holds", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--split", default="dev", choices=("dev", "test", "all"))
    parser.add_argument("--categories", nargs="+", metavar="CAT")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument(
        "--predicted", action="store_true", help="send each prompt's code as its Predicted Output"
    )
    args = parser.parse_args(argv)
    from edgespec.bench.recording import recorded_corpus
    from edgespec.bench.replay import prediction_of

    def run() -> int:
        lm, recordings = recorded_corpus(args.split, args.categories, args.max_tokens)
        predictions = (
            {rec.id: prediction_of(rec, lm.target) for rec in recordings} if args.predicted else None
        )
        holds = measure(lm.target, recordings, predictions)
        print(f"{len(recordings)} answers ({args.split} half, {args.max_tokens} tokens): the share of "
              "proposals whose next k tokens all hold, by match length")  # fmt: skip
        print(holds.table())
        return 0

    return run_reporting_errors(run)


if __name__ == "__main__":
    sys.exit(main())

"""Several answers at once against the same answers one after another, on one pair.

    edgespec bench --parallel 4 [--parallel-drafters none auto] [--repeats 2] [--split test] [--regime f16]

The pair is loaded as ``serve --parallel N`` loads it (N sequences, one engine thread);
N prompts of the chosen split (one per category in turn, so the answers differ in length
and kind) are answered one after another and then all at once, interleaved with each side
first in turn. Greedy. Twice per drafter: with the prompts already in their slots (a
returning conversation: what is compared is the decoding) and from empty caches (each
prompt read whole, which both sides pay alike: one answer's prompt is read alone). Each side
starts with the ``suffix`` index empty, as a new process does: both sides answer the same
prompts, and the second would otherwise copy the first's answers. It
reports the total tokens per second of each side and their ratio; at once, the answer
slowed most against its own pace in turn, as a share of the answers' mean (none starved);
and the share of passes decoded with other answers' passes.

It also estimates a ceiling: the same target passes the answers took in turn, decoded at
once in lockstep rounds (a round: the next pass of every answer that has one, one
decode), priced on the pair's cost curve as measured before the run, the rest of the
time (prompts, drafting, Python) as it was in turn. On a CPU whose cost grows with a
pass's tokens, an answer that already verifies long drafts alone has little left to gain
at once. The curve prices one sequence's pass of k tokens; a round of k sequences' single
tokens may cost less, so it is an estimate, not a bound (docs/sessions.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from edgespec.bench.corpus import CATEGORIES, CorpusPrompt, prompt_tokens, select
from edgespec.decoding.events import Done, Step
from edgespec.errors import EdgespecError


@dataclass
class Side:
    """One way of answering the N prompts, per repeat."""

    rates: list[float] = field(default_factory=list)  # total tokens/s
    answers: list[list[float]] = field(default_factory=list)  # each answer's own tokens/s
    shared: list[float] = field(default_factory=list)  # passes shared with other answers / all
    # In turn: what the same passes in lockstep rounds could make of the rate (see above).
    ceilings: list[float] = field(default_factory=list)


@dataclass
class Comparison:
    drafter: str
    cached: bool  # the prompts were in their slots already
    serial: Side = field(default_factory=Side)
    together: Side = field(default_factory=Side)

    def ratios(self) -> list[float]:
        return [t / s for t, s in zip(self.together.rates, self.serial.rates, strict=True)]

    def shares_of_ceiling(self) -> list[float]:
        return [r / c for r, c in zip(self.ratios(), self.serial.ceilings, strict=True)]

    def least_served(self) -> float:
        """At once, the answer slowed most against its own rate in turn, as a share of
        the mean of all answers' (1: all slowed alike)."""
        worst = 1.0
        for together, serial in zip(self.together.answers, self.serial.answers, strict=True):
            paces = [t / s for t, s in zip(together, serial, strict=True)]
            worst = min(worst, min(paces) / statistics.mean(paces))
        return worst


def spread_prompts(split: str, count: int) -> list[CorpusPrompt]:
    """``count`` prompts of ``split``, one per category in turn, corpus order within each."""
    by_category = {c: [p for p in select(split, [c]) if not p.json_schema] for c in CATEGORIES}
    chosen: list[CorpusPrompt] = []
    depth = 0
    while len(chosen) < count:
        row = [prompts[depth] for prompts in by_category.values() if depth < len(prompts)]
        if not row:
            raise EdgespecError(f"the {split} split has fewer than {count} prompts")
        chosen += row[: count - len(chosen)]
        depth += 1
    return chosen


@dataclass
class Answered:
    done: Done
    passes: list[int]  # the tokens of each target pass of its steps


def answer(lm, tokens: list[int], drafter: str, max_tokens: int) -> Answered:
    from edgespec.api import settings_from

    request = lm.request(tokens, settings_from(max_tokens=max_tokens), drafter=drafter)
    events = list(lm.submit(request).events())
    passes = [event.gamma + 1 for event in events if isinstance(event, Step)]
    return Answered(next(e for e in events if isinstance(e, Done)), passes)


def lockstep_ceiling(passes: list[list[int]], wall_s: float, price: Callable[[int], float]) -> float:
    """How much faster than ``wall_s`` (the answers one after another, each pass its own
    decode: ``passes[answer]``, tokens per pass) the same passes could go in lockstep
    rounds, each round one decode, priced by ``price`` (seconds of a pass of k tokens);
    the time outside the passes as it was."""
    alone = sum(price(k) for sizes in passes for k in sizes)
    depth = max(map(len, passes), default=0)
    rounds = sum(price(sum(sizes[r] for sizes in passes if r < len(sizes))) for r in range(depth))
    return wall_s / max(wall_s - alone + rounds, 1e-9)


def one_side(lm, prompts: list[list[int]], drafter: str, max_tokens: int, together: bool) -> list[Answered]:
    if not together:
        return [answer(lm, tokens, drafter, max_tokens) for tokens in prompts]
    done: list[Answered | None] = [None] * len(prompts)

    def run(i: int) -> None:
        done[i] = answer(lm, prompts[i], drafter, max_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(d is None for d in done):
        raise EdgespecError("an answer at once did not finish")
    return done  # type: ignore[return-value]


def record(side: Side, answered: list[Answered], wall_s: float, price: Callable[[int], float] | None) -> None:
    """``price`` (in turn): the ceiling is judged too."""
    answers = [a.done for a in answered]
    side.rates.append(sum(d.stats.tokens for d in answers) / wall_s)
    if price is not None:
        side.ceilings.append(lockstep_ceiling([a.passes for a in answered], wall_s, price))
    side.answers.append([d.stats.tokens / max(d.stats.wall_s, 1e-9) for d in answers])
    passes = sum(d.stats.target_passes for d in answers)
    side.shared.append(sum(d.stats.shared_passes for d in answers) / passes if passes else 0.0)


def measure(args: argparse.Namespace) -> list[Comparison]:
    from edgespec.api import EdgeSpec, RuntimeOptions
    from edgespec.bench.regimes import pair_for

    count = args.parallel
    options = RuntimeOptions(n_ctx=args.ctx, parallel=count, engine_thread=True, threads=args.threads)
    pair = pair_for(args.regime, args.target, args.draft)  # f16: converted once, cached
    lm = EdgeSpec(pair.target, pair.draft, options=options, quiet=True)
    try:
        # The curve as measured before any answer: the controller goes on learning it, and
        # every repeat's ceiling is priced alike.
        price = copy.deepcopy(lm.controller_state().costs.target).estimate
        prompts = [prompt_tokens(lm, p) for p in spread_prompts(args.split, count)]
        comparisons = [Comparison(d, cached) for cached in (True, False) for d in args.parallel_drafters]
        answer(lm, prompts[0], "none", 4)  # warm-up
        for repeat in range(args.repeats):
            for comparison in comparisons:
                sides = [(False, comparison.serial), (True, comparison.together)]
                for together, side in sides if repeat % 2 == 0 else reversed(sides):
                    lm.start_afresh()  # and no earlier answer for `suffix` to copy
                    if comparison.cached:  # each prompt left in a slot, read again but for a token
                        one_side(lm, prompts, "none", 1, together=True)
                    start = time.perf_counter()
                    answers = one_side(lm, prompts, comparison.drafter, args.max_tokens, together)
                    record(side, answers, time.perf_counter() - start, None if together else price)
                    print(f"  {comparison.drafter:<6} {'cached' if comparison.cached else 'cold':<6} "
                          f"{'at once' if together else 'in turn':<8} {side.rates[-1]:6.1f} tokens/s",
                          flush=True)  # fmt: skip
        return comparisons
    finally:
        lm.close()


def report(comparisons: list[Comparison], count: int) -> str:
    lines = [
        f"| drafter | prompts | {count} in turn, tokens/s | {count} at once, tokens/s | ratio per repeat "
        "| lockstep estimate per repeat | share of it | least served | passes shared |",
        "|---|---|--:|--:|---|---|--:|--:|--:|",
    ]
    for c in comparisons:
        ratios = ", ".join(f"{r:.2f}" for r in c.ratios())
        ceilings = ", ".join(f"{r:.2f}" for r in c.serial.ceilings)
        serial, together = statistics.median(c.serial.rates), statistics.median(c.together.rates)
        lines.append(
            f"| {c.drafter} | {'cached' if c.cached else 'cold'} | {serial:.1f} | {together:.1f} | {ratios} "
            f"| {ceilings} | {statistics.median(c.shares_of_ceiling()):.0%} | {c.least_served():.2f} "
            f"| {statistics.mean(c.together.shared):.0%} |"
        )
    return "\n".join(lines)


def run_from_args(args: argparse.Namespace) -> int:
    if args.parallel < 2:
        raise EdgespecError(f"--parallel needs at least 2 answers (got {args.parallel})")
    args.max_tokens = 96 if args.max_tokens is None else args.max_tokens
    comparisons = measure(args)
    print(report(comparisons, args.parallel))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            rows = [
                {**asdict(c), "ratios": c.ratios(), "of_ceiling": c.shares_of_ceiling()} for c in comparisons
            ]
            json.dump(rows, out, indent=1)
    return 0

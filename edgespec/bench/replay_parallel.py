"""Several recorded answers at once, replayed on a cost curve: what ``auto`` makes of a
shared pass on machines we do not have.

The replay (``bench.replay``) runs one recorded answer through the real engine and
controller with models that return the recorded tokens and a virtual clock. Here N of them
run at once, as ``serve --parallel N`` runs them: the real engine thread takes their steps
in rounds and decodes their target passes (and their draft decodes) as one decode, which
the clock charges as one pass of the curve over all their tokens, plus the Python of each
step in it. Each answer's prompt is in its slot already (a returning conversation), so
what is compared is the decoding. Each configuration answers the same N prompts at once
and one after another, with the pair's statistics fresh.

    python -m edgespec.bench.replay_parallel --curve epyc-f26 --split test --answers 4

On a curve where a token costs nearly as much in a shared pass as alone, plain steps at
once already get most of what drafting would; ``auto`` at once must still be no slower than
``--drafter none`` at once (``tests/test_replay_parallel.py``).
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from edgespec.bench.curves import CURVES_FILE, Curve, cost_model, load_curves
from edgespec.bench.recording import Recording, recorded_corpus
from edgespec.bench.replay import ReplayedDraft, ReplayedModel, VirtualClock, policy_for
from edgespec.decoding.auto import DEFAULT, PairState, Tuning
from edgespec.decoding.engine import Engine
from edgespec.decoding.events import Done
from edgespec.decoding.request import Request
from edgespec.decoding.runner import END
from edgespec.errors import EdgespecError, run_reporting_errors
from edgespec.runtime.model import Model


class SharedReplay:
    """A replayed model of ``count`` sequences, each a ``ReplayedModel`` playing its own
    recording; a decode over several of them is one pass of the curve over all their
    tokens, and the Python of each step in it."""

    def __init__(
        self, sequences: list[ReplayedModel], clock: VirtualClock, seconds: Callable[[int, int], float]
    ):
        self.sequences = sequences
        self.n_seq = len(sequences)
        self.prompt_cache = None
        self._clock = clock
        self._seconds = seconds

    def __getattr__(self, name: str):  # vocabulary, options, rollback, piece, ...
        return getattr(self.sequences[0], name)

    def sequence(self, seq: int) -> ReplayedModel:
        return self.sequences[seq]

    def empty_all(self) -> None:
        for sequence in self.sequences:
            sequence.reset()

    def decode_passes(self, passes: list[tuple[int, list[int]]], *, last: bool = False) -> list[np.ndarray]:
        tokens = sum(len(wanted) for _, wanted in passes)
        python_s = self.sequences[0]._python_s
        self._clock.now += self._seconds(len(passes), tokens) + python_s * len(passes)
        return [self.sequences[seq].rows(wanted, 1 if last else len(wanted)) for seq, wanted in passes]


@dataclass(frozen=True)
class Run:
    """N answers of one configuration: their tokens, and the clock's seconds from the
    first step to the last answer's end."""

    tokens: int
    seconds: float
    exact: bool

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class ParallelReplay:
    """One replayed pair of ``answers`` sequences on ``curve``."""

    def __init__(
        self,
        target: Model,
        draft: Model,
        curve: Curve,
        answers: int,
        tuning: Tuning = DEFAULT,
        *,
        observe_shared: bool = True,
    ):
        """``observe_shared``: the pair learns what its shared decodes cost, as a loaded pair
        does (off: every shared step priced by one sequence's curve, to see what it is worth)."""
        self.clock = VirtualClock()
        self.curve, self.tuning = curve, tuning
        self.observe_shared = observe_shared
        self.target = SharedReplay(
            [ReplayedModel(target, self.clock, curve.target_seconds, curve.python_s) for _ in range(answers)],
            self.clock,
            curve.decode_seconds,
        )
        self.draft = SharedReplay(
            [ReplayedDraft(draft, self.clock, curve.draft_seconds) for _ in range(answers)],
            self.clock,
            lambda _sequences, tokens: curve.draft_seconds(tokens),
        )

    def run(self, recordings: list[Recording], label: str, *, at_once: bool) -> Run:
        """The recordings' answers with ``label``'s policy (one pair state for all, as in a
        server), all at once or one after another."""
        engine = Engine(self.target, self.draft, clock=self.clock, threaded=True)  # type: ignore[arg-type]
        state = PairState(cost_model(self.curve, engine.max_gamma + 1), self.tuning)
        if self.observe_shared:
            engine.turn.observe_shared = state.learn_shared_decode
        try:
            start = self.clock.now
            if at_once:
                done = self._together(engine, state, recordings, label)
            else:
                done = [self._together(engine, state, [rec], label)[0] for rec in recordings]
            seconds = self.clock.now - start
        finally:
            engine.turn.close()
        exact = all(
            list(d.token_ids) == rec.answer[: len(d.token_ids)]
            for d, rec in zip(done, recordings, strict=True)
        )
        return Run(sum(len(d.token_ids) for d in done), seconds, exact)

    def _together(
        self, engine: Engine, state: PairState, recordings: list[Recording], label: str
    ) -> list[Done]:
        done: list[Done | BaseException | None] = [None] * len(recordings)
        ended = [threading.Event() for _ in recordings]

        def deliver(i: int, events: list[object]) -> None:
            for event in events:
                if isinstance(event, Done | BaseException):
                    done[i] = event
            if events and events[-1] is END:
                ended[i].set()

        answers = []
        for i, rec in enumerate(recordings):
            # The prompt is in its slot already: the answer reads only its last token.
            for model in (self.target, self.draft):
                model.sequence(i).play(rec)
                model.sequence(i).tokens = list(rec.prompt[:-1])
            settings = rec.settings(max(len(rec.answer), 1))
            policy = policy_for(label, state, engine)
            answers.append(
                engine.start(Request(tuple(rec.prompt), settings), policy, deliver=partial(deliver, i))
            )

        # The loop waits between rounds until every answer is queued, in order, so that
        # the rounds, and what the pair state learns in them, are the same in every run
        # (a replay decides by the curve, never by the threads' timing). Each takes the
        # slot whose sequence holds its prompt.
        held, go = threading.Event(), threading.Event()
        gate = threading.Thread(target=engine.turn.run, args=(lambda: held.set() or go.wait(),), daemon=True)
        gate.start()
        held.wait()
        for answer in answers:
            answer.enqueue()
        go.set()
        gate.join()
        for event in ended:
            event.wait()
        for result in done:
            if isinstance(result, BaseException):
                raise result
        return [d for d in done if isinstance(d, Done)]


def compare(
    replay: ParallelReplay, recordings: list[Recording], labels: tuple[str, ...] = ("target only", "auto")
) -> dict[str, dict[str, Run]]:
    """{label: {"at once": Run, "in turn": Run}} over the same recordings."""
    return {
        label: {
            "at once": replay.run(recordings, label, at_once=True),
            "in turn": replay.run(recordings, label, at_once=False),
        }
        for label in labels
    }


def groups(recordings: list[Recording], size: int) -> list[list[Recording]]:
    """The recordings in groups of ``size``, each group spread over the categories (one
    recording from each of ``size`` categories in turn), the rest left out."""
    by_category: dict[str, list[Recording]] = {}
    for rec in recordings:
        by_category.setdefault(rec.category, []).append(rec)
    queues = list(by_category.values())
    spread: list[Recording] = []
    while any(queues):
        for queue in queues:
            if queue:
                spread.append(queue.pop(0))
    return [spread[i : i + size] for i in range(0, len(spread) - size + 1, size)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgespec.bench.replay_parallel", description=__doc__)
    parser.add_argument("--curve", default="epyc-f26", help=f"a curve of {CURVES_FILE.name}")
    parser.add_argument("--split", default="test", choices=("dev", "test", "all"))
    parser.add_argument("--answers", type=int, default=4, help="answers at once")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per recorded answer")
    args = parser.parse_args(argv)

    def run() -> int:
        curves = load_curves()
        if args.curve not in curves:
            raise EdgespecError(f"unknown curve {args.curve!r} (known: {', '.join(curves)})")
        if args.answers < 2:
            raise EdgespecError("--answers must be 2 or more")
        lm, recordings = recorded_corpus(args.split, None, args.max_tokens)
        assert lm.draft is not None
        replay = ParallelReplay(lm.target, lm.draft, curves[args.curve], args.answers)
        print(f"{args.curve}: {args.answers} answers at once, {args.split} half (a consequence of the curve)")
        for group in groups(recordings, args.answers):
            runs = compare(replay, group)
            none, auto = runs["target only"], runs["auto"]
            print(
                f"  {', '.join(r.id for r in group)}: auto/none at once "
                f"{auto['at once'].rate / none['at once'].rate:.2f}, auto at once/in turn "
                f"{auto['at once'].rate / auto['in turn'].rate:.2f}, none at once/in turn "
                f"{none['at once'].rate / none['in turn'].rate:.2f}"
            )
        return 0

    return run_reporting_errors(run)


if __name__ == "__main__":
    raise SystemExit(main())

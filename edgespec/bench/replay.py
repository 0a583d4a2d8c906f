"""Replay: the controller's decisions on a cost curve this machine does not have.

Speed-ups depend on what a target pass over k tokens costs against one token, and on what
a draft token costs. Our users' machines (Apple Silicon, GPUs) verify 8–16 tokens for about
the price of one; the CPUs we develop on charge several times more. Every controller
decision must hold in both, and a benchmark can only measure the machine it runs on.

So a replay records, once and for real (llama.cpp, the shipped GGUFs), what decides every
step: the target's greedy answer to each prompt, and the draft model's greedy guess and
confidence at every position of it (one teacher-forced pass). It then runs the real
engine, the real drafters and the real controller again over that answer, with models
that return the recorded tokens and a virtual clock that charges each decode what a cost
curve says. Decisions, drafts, acceptance and exactness are the real code's; only the
seconds are the curve's. What it prints is a consequence of a curve, not a measurement,
and says so.

Greedy only: under sampling the target's answer depends on the draws. The draft's tokens
after its first wrong one are not recorded (the target rejects them anyway); it is given a
token that the target would reject there, and the confidence the recorded pass had.

    python -m edgespec.bench.replay --curve gpu --split dev
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from edgespec.api import EdgeSpec
from edgespec.bench import llamacpp_replay
from edgespec.bench.ceiling import ceiling_ratios
from edgespec.bench.corpus import BY_ID, CATEGORIES, predicted_output
from edgespec.bench.curves import CURVES, Curve, cost_model, curve_from_costs
from edgespec.bench.recording import Recording, recorded_corpus
from edgespec.bench.runner import geomean
from edgespec.decoding.auto import DEFAULT, PairState, Tuning
from edgespec.decoding.choice import make_policy
from edgespec.decoding.engine import Engine
from edgespec.decoding.events import Done, Step
from edgespec.decoding.policy import FixedPolicy, Policy
from edgespec.errors import EdgespecError, run_reporting_errors
from edgespec.host import write_atomically
from edgespec.runtime.model import Model
from edgespec.runtime.tokens import common_prefix

# -- the replayed models -------------------------------------------------------------------


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ReplayedModel:
    """What the engine and drafters use of ``runtime.model.Model`` and its one sequence: a
    token list that rolls back, and ``decode``, which charges the clock the curve's price
    and returns rows whose greedy token is the recorded one. Vocabulary questions go to
    the real model."""

    rollback = "truncate"
    n_seq = 1

    def __init__(
        self,
        real: Model,
        clock: VirtualClock,
        seconds: Callable[[int], float],
        python_s: float = 0.0,
        history_seconds: Callable[[int, int, int], float] | None = None,
    ):
        self.real = real
        self.n_vocab = real.n_vocab
        self.n_ctx = real.n_ctx
        self.options = real.options
        self.tokens: list[int] = []
        self._clock = clock
        self._seconds = seconds
        self._python_s = python_s
        self._history_seconds = history_seconds
        self._sizes = (0, 0)  # tokens of the last two passes (the last first)
        self._sequence: list[int] = []
        self._prompt_len = 0
        self._ended = False
        # A prompt is priced as one pass of the curve: it is decoded in one call.
        self.prefill_chunk = 1 << 30

    def __getattr__(self, name: str):  # piece, is_eog, is_control, tokenize, ...
        return getattr(self.real, name)

    def play(self, recording: Recording) -> None:
        self._sequence = recording.prompt + recording.answer
        self._prompt_len = len(recording.prompt)
        self._ended = recording.ended
        self.tokens = []

    # rollback, as the real model does it
    def mark(self) -> None:
        pass

    def keep(self, n: int) -> None:
        del self.tokens[n:]

    truncate = keep

    def reset(self) -> None:
        self.tokens = []

    def sync(self, tokens: list[int], *, start: bool = False, most: int | None = None) -> int:
        limit = len(tokens) - 1 if most is None else min(len(tokens) - 1, most)
        common = common_prefix(self.tokens, tokens, limit=limit)
        self.keep(common)
        return common

    def sequence(self, seq: int) -> ReplayedModel:
        return self  # a replay is one answer, in one sequence

    def decode_passes(self, passes: list[tuple[int, list[int]]], *, last: bool = False) -> list[np.ndarray]:
        """The pair's loop asks for its one answer's passes as the real model's are asked."""
        return [self.decode(tokens, 1 if last else len(tokens)) for _, tokens in passes]

    def decode(
        self,
        tokens: list[int],
        n_outputs: int = 1,
        *,
        cancel: threading.Event | None = None,
        arrival: threading.Event | None = None,
    ) -> np.ndarray:
        # (neither stops it: a replay is one answer, none arrives beside it)
        self._clock.now += self._seconds(len(tokens)) + self._python_s
        if self._history_seconds is not None:
            self._clock.now += self._history_seconds(len(tokens), *self._sizes)
        self._sizes = (len(tokens), self._sizes[0])
        return self.rows(tokens, n_outputs)

    def rows(self, tokens: list[int], n_outputs: int) -> np.ndarray:
        """``tokens`` appended, and the rows of the last ``n_outputs``: a decode the
        caller has charged the clock for."""
        if not tokens or not 0 <= n_outputs <= min(len(tokens), self.options.max_outputs):
            raise ValueError(f"decode of {len(tokens)} tokens with {n_outputs} outputs")
        self.tokens.extend(tokens)
        rows = np.zeros((n_outputs, self.n_vocab), dtype=np.float32)
        first = len(self.tokens) - n_outputs
        for r in range(n_outputs):
            position = first + r + 1  # the row predicts the token at this position
            token, logit = self._next(position)
            rows[r, token] = logit
        return rows

    def _true(self, position: int) -> int:
        if position < len(self._sequence):
            return self._sequence[position]
        return self.real.eos if self._ended else self.real.bos

    def _next(self, position: int) -> tuple[int, float]:
        return self._true(position), 30.0  # the target: certain of its recorded answer


class ReplayedDraft(ReplayedModel):
    """The draft: its recorded guess while its context is the recorded text, a token the
    target rejects once it has left it; with the recorded confidence."""

    def play(self, recording: Recording) -> None:
        super().play(recording)
        self._guesses = recording.guesses
        self._confidences = recording.confidences

    def _next(self, position: int) -> tuple[int, float]:
        q = min(max(position - self._prompt_len, 0), len(self._guesses) - 1)
        guess, confidence = self._guesses[q], min(self._confidences[q], 0.999999)
        on_track = common_prefix(self.tokens, self._sequence, limit=position) == min(
            position, len(self._sequence)
        )
        true = self._true(position)
        if not on_track and guess == true:
            guess = (true + 1) % self.n_vocab
        # a logit whose softmax over the vocabulary gives the recorded confidence
        logit = math.log(confidence * (self.n_vocab - 1) / (1.0 - confidence))
        return guess, logit


# -- replaying -----------------------------------------------------------------------------

CONFIGS = ("target only", "auto", "model γ=2", "model γ=4", "model γ=8")
PREDICTED = " predicted"  # a label's suffix: the prompt's code is sent as the Predicted Output


def policy_for(label: str, state: PairState, engine: Engine) -> Policy:
    label = label.removesuffix(PREDICTED)
    if label == "target only":
        return FixedPolicy("none", 0)
    if label == "auto":
        return make_policy(
            "auto",
            "auto",
            loaded=engine.drafters,
            max_gamma=engine.max_gamma,
            pair_state=lambda: state,
        )
    drafter, _, gamma = label.partition(" γ=")
    if not gamma.isdigit():
        raise EdgespecError(f"unknown configuration {label!r} (known: {', '.join(CONFIGS)}, or 'ngram γ=16')")
    return FixedPolicy(drafter, int(gamma))


@dataclass
class Replayed:
    """One configuration's run over one recording."""

    decode_tps: float
    steps: Counter = field(default_factory=Counter)
    exact: bool = True
    # Every step as (drafter, γ drafted, accepted, γ planned): what ``--trace`` writes, so
    # that a change meant to keep the controller's decisions can be checked step by step.
    trace: list[tuple[str, int, int, int]] = field(default_factory=list)


def replay(
    recordings: list[Recording],
    target: Model,
    draft: Model,
    curve: Curve,
    configs: Iterable[str] = CONFIGS,
    tuning: Tuning = DEFAULT,
    profile: Curve | None = None,
) -> dict[str, dict[str, Replayed]]:
    """Every configuration over every recording, in order (auto's statistics carry from
    one prompt to the next, as in a session): {prompt id: {config: Replayed}}. ``profile``:
    the curve the controller's profile was measured on, where it is not ``curve``."""
    clock = VirtualClock()
    replayed_target = ReplayedModel(
        target, clock, curve.target_seconds, curve.python_s, curve.history_seconds
    )
    replayed_draft = ReplayedDraft(draft, clock, curve.draft_seconds)
    engine = Engine(replayed_target, replayed_draft, clock=clock)  # type: ignore[arg-type]
    state = PairState(cost_model(profile or curve, engine.max_gamma + 1), tuning)
    results: dict[str, dict[str, Replayed]] = defaultdict(dict)
    for rec in recordings:
        for label in configs:
            replayed_target.play(rec)
            replayed_draft.play(rec)
            settings = rec.settings(max(len(rec.answer), 1))
            if label.endswith(PREDICTED):
                settings = replace(settings, prediction=tuple(prediction_of(rec, target)))
            played = Replayed(0.0)
            done = None
            for event in engine.stream(list(rec.prompt), settings, policy_for(label, state, engine)):
                if isinstance(event, Step):
                    played.steps[event.drafter] += 1
                    played.trace.append((event.drafter, event.gamma, event.accepted, event.planned_gamma))
                elif isinstance(event, Done):
                    done = event
            assert done is not None
            played.exact = list(done.token_ids) == rec.answer[: len(done.token_ids)]
            played.decode_tps = done.stats.decode_tokens_per_second
            results[rec.id][label] = played
    return results


def prediction_of(rec: Recording, target: Model) -> list[int]:
    """The Predicted Output an editor would send with the recording's prompt, tokenized."""
    prompt = BY_ID.get(rec.id)
    text = predicted_output(prompt) if prompt is not None else None
    return target.tokenize(text, add_special=False) if text else []


CEILING, LOOKUP_CEILING = "ceiling", "ceiling lookups"
BEST_FIXED = "best fixed"
# The fixed configurations "best fixed" picks among: auto's drafters that any answer can
# have, at the sizes where a fixed γ is commonly set.
FIXED_GRID = tuple(f"{d} γ={g}" for d in ("copy", "ngram", "reflow", "model") for g in (2, 4, 8, 16, 32))


def add_best_fixed(results: dict[str, dict[str, Replayed]], grid: Iterable[str] = FIXED_GRID) -> str:
    """Adds to ``results`` the configuration "best fixed": each answer at the speed of the
    fastest of plain decoding and the ``grid``'s fixed configurations on it, picked in
    hindsight per answer. A yardstick a controller without foresight of the drafts could
    reach if it knew the one configuration to use for the whole answer; the ceiling also
    knows where every draft breaks."""
    for runs in results.values():
        runs[BEST_FIXED] = Replayed(max(runs[label].decode_tps for label in ("target only", *grid)))
    return BEST_FIXED


def add_llamacpp(recordings: list[Recording], curve: Curve, results: dict[str, dict[str, Replayed]]) -> str:
    """Adds to ``results`` llama.cpp's prompt-lookup loop (bench.llamacpp_replay) on
    ``curve``, each pass priced as plain decoding's is; returns its label."""
    for rec in recordings:
        plain = results[rec.id]["target only"].decode_tps
        ratio = llamacpp_replay.speedup(rec.prompt, rec.answer, curve.step_seconds, curve.history_seconds)
        results[rec.id][llamacpp_replay.LABEL] = Replayed(plain * ratio)
    return llamacpp_replay.LABEL


def add_ceiling(
    recordings: list[Recording],
    target: Model,
    curve: Curve,
    results: dict[str, dict[str, Replayed]],
    predicted: bool = False,
) -> list[str]:
    """Adds to ``results`` the configuration "ceiling": each answer at the speed of the
    fastest schedule in hindsight over auto's drafters on ``curve`` (bench.ceiling), and
    "ceiling lookups", the same without the draft model: what knowing where every copy
    breaks is worth, apart from knowing where the draft model's guesses fail. With
    ``predicted``, both again with the lookups also copying from the Predicted Output
    (labels ending in " predicted"). Returns the labels added, in order."""
    suffixes = ["", PREDICTED] if predicted else [""]
    for rec in recordings:
        plain = results[rec.id]["target only"]
        for suffix in suffixes:
            everything, lookups = ceiling_ratios(
                target,
                rec.prompt,
                rec.answer,
                rec.guesses,
                curve.step_seconds,
                curve.draft_seconds(1),
                target.options.max_outputs - 1,
                target.eos if rec.ended else None,
                rec.settings(1).grammar,
                prediction_of(rec, target) if suffix else None,
            )
            results[rec.id][CEILING + suffix] = Replayed(plain.decode_tps * everything)
            results[rec.id][LOOKUP_CEILING + suffix] = Replayed(plain.decode_tps * lookups)
    return [base + suffix for suffix in suffixes for base in (CEILING, LOOKUP_CEILING)]


def summarize(
    recordings: list[Recording], results: dict[str, dict[str, Replayed]], configs: list[str]
) -> str:
    """Per category and configuration: the geometric mean of the decode-phase ratio to
    target-only, the worst prompt, and auto's share of steps per drafter."""
    shown = [label for label in configs if label != "target only"]
    widths = {label: max(16, len(label) + 2) for label in shown}
    lines = [f"{'category':16s}" + "".join(f"{label:>{widths[label]}s}" for label in shown)]
    by_category: dict[str, list[str]] = defaultdict(list)
    for rec in recordings:
        by_category[rec.category].append(rec.id)
    every: dict[str, list[float]] = defaultdict(list)
    for category in [c for c in CATEGORIES if c in by_category]:
        line = f"{category:16s}"
        for label in configs:
            if label == "target only":
                continue
            ratios = [
                results[i][label].decode_tps / results[i]["target only"].decode_tps
                for i in by_category[category]
            ]
            every[label] += ratios
            line += f"{geomean(ratios):{widths[label] - 7}.2f} ({min(ratios):.2f})"
        if "auto" in configs:
            steps = sum((results[i]["auto"].steps for i in by_category[category]), Counter())
            total = sum(steps.values()) or 1
            line += "   auto: " + " ".join(f"{k} {100 * v / total:.0f}%" for k, v in steps.most_common())
        lines.append(line)
    lines.append(
        f"{'all':16s}"
        + "".join(f"{geomean(every[c]):{widths[c] - 7}.2f} ({min(every[c]):.2f})" for c in shown)
    )
    inexact = [f"{i} {label}" for i, runs in results.items() for label, run in runs.items() if not run.exact]
    if inexact:
        lines.append("NOT EXACT: " + ", ".join(inexact))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    """The command line: which curves, prompts and configurations to replay, and what beside."""
    parser = argparse.ArgumentParser(
        prog="python -m edgespec.bench.replay",
        description="Replay the corpus through the real controller on a cost curve (virtual clock). "
        "Ratios are what the curve implies, not measurements.",
    )
    parser.add_argument(
        "--curve",
        nargs="+",
        default=["gpu"],
        choices=[*sorted(CURVES), "here"],
        help="cost curves to replay on; 'here' is this machine's measured profile",
    )
    parser.add_argument("--split", default="dev", choices=("dev", "test", "all"))
    parser.add_argument("--categories", nargs="+", metavar="CAT")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), metavar="LABEL")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also print the ceiling: every step chosen in hindsight among the same drafters "
        "(and among the lookups alone, 'ceiling lookups')",
    )
    parser.add_argument(
        "--best-fixed",
        action="store_true",
        help="also replay every fixed configuration of a grid (copy, ngram, reflow, model at "
        "γ = 2…32) and print, per answer, the fastest of them: 'best fixed'",
    )
    parser.add_argument(
        "--llamacpp",
        action="store_true",
        help=f"also replay llama.cpp's prompt lookup loop on each answer: '{llamacpp_replay.LABEL}'",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        metavar="FILE",
        help="write every replayed step (drafter, γ, accepted, planned γ) as JSON: two traces "
        "compared show whether a change kept the controller's decisions",
    )
    return parser


def _replay_on_curve(
    name: str, args: argparse.Namespace, lm: EdgeSpec, recordings: list[Recording]
) -> dict[str, dict[str, list]]:
    """Replays the configurations asked for on the curve ``name`` and prints its table;
    returns every replayed step, {prompt id: {config: trace}}, for ``--trace``."""
    curve = curve_from_costs(lm.controller_state().costs) if name == "here" else CURVES[name]
    grid = [c for c in FIXED_GRID if c not in args.configs] if args.best_fixed else []
    results = replay(recordings, lm.target, lm.draft, curve, [*args.configs, *grid])
    # Taken before the yardsticks below join ``results``: they have no steps of their own.
    traces = {rec: {c: r.trace for c, r in by.items()} for rec, by in results.items()}
    configs = list(args.configs)
    if args.best_fixed:
        configs.append(add_best_fixed(results))
    if args.llamacpp:
        configs.append(add_llamacpp(recordings, curve, results))
    if args.ceiling:
        predicted = any(label.endswith(PREDICTED) for label in configs)
        configs += add_ceiling(recordings, lm.target, curve, results, predicted)
    print(
        f"\nreplayed on the '{name}' curve ({curve.about}); {args.split} half, {args.max_tokens} "
        "tokens: decode-phase ratio to target-only, worst prompt in brackets"
    )
    print(summarize(recordings, results, configs))
    return traces


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if "target only" not in args.configs:
        args.configs.insert(0, "target only")

    def run() -> int:
        lm, recordings = recorded_corpus(args.split, args.categories, args.max_tokens)
        traces = {name: _replay_on_curve(name, args, lm, recordings) for name in args.curve}
        if args.trace is not None:
            write_atomically(args.trace, json.dumps(traces, sort_keys=True))
            print(f"\nevery step written to {args.trace}")
        return 0

    return run_reporting_errors(run)


if __name__ == "__main__":
    sys.exit(main())

"""The decoding loop: prompt tokens in, a stream of events out.

One step: a drafter proposes up to γ tokens, the target scores the last committed token
plus every draft in ONE batched decode (γ+1 logits rows), the acceptance rule keeps the
longest valid prefix and adds one token of the target's own (a correction, or a bonus
when every draft was accepted), and both caches are rolled back to the committed text.
γ = 0 is plain target decoding through the very same code, which is what baselines use.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from difflib import SequenceMatcher

import numpy as np

from edgespec.decoding import acceptance
from edgespec.decoding.constrained import Constraint
from edgespec.decoding.drafters import (
    LOOKUP_DRAFTERS,
    Draft,
    Drafter,
    DraftRequest,
    GrammarDrafter,
    GrammarGuide,
    ModelDrafter,
    registry,
)
from edgespec.decoding.events import BONUS, DRAFT, PLAIN, TARGET, Done, Event, Stats, Step, Token
from edgespec.decoding.grammar import GrammarSpec
from edgespec.decoding.penalties import Penalties, Window, transform_row, transform_rows
from edgespec.decoding.policy import LINE_BREAK, UNIT_END, FixedPolicy, Plan, Policy, StepOutcome, StepView
from edgespec.decoding.sampling import SamplingParams, probabilities, sample
from edgespec.decoding.textstream import TextStream
from edgespec.errors import EdgespecError
from edgespec.runtime.model import DecodeAborted, Model

VERIFY_MODES = ("token", "block")
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass
class GenerationSettings:
    """Everything one generation is asked to do.

    ``lenience`` may be changed by another thread while the generation runs (the UI's
    slider); the loop reads it at every step. λ = 1 is exact; any other value changes the
    output distribution (λ < 1 accepts more drafts)."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    lenience: float = 1.0
    verify: str = "token"  # "token" or "block" (sampling only; greedy compares argmaxes)
    # The answer the client expects (OpenAI's Predicted Outputs), as target token ids: a
    # source the copy drafters propose from. It never changes what the answer is.
    prediction: tuple[int, ...] = ()
    # Penalties and biases on the target's distribution (and the draft model's, alike).
    penalties: Penalties = field(default_factory=Penalties)
    # Log-probabilities on every Token: None for none, else how many of the most likely
    # tokens to report beside the chosen one (0-20).
    logprobs: int | None = None
    # A grammar every token must follow (a JSON schema's, or GBNF): see decoding.constrained.
    grammar: GrammarSpec | None = None

    def validate(self) -> None:
        self.sampling.validate()
        self.penalties.validate()
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise EdgespecError(f"top logprobs must be from 0 to {MAX_TOP_LOGPROBS} (got {self.logprobs})")
        if self.max_tokens < 1:
            raise EdgespecError(f"max tokens must be at least 1 (got {self.max_tokens})")
        if not 0 < self.lenience <= 1:
            raise EdgespecError(f"lenience must be in (0, 1] (got {self.lenience:g})")
        if self.verify not in VERIFY_MODES:
            raise EdgespecError(f"verify must be 'token' or 'block' (got {self.verify!r})")


def prediction_tokens_used(prediction: tuple[int, ...] | list[int], answer: list[int]) -> int:
    """How many tokens of the predicted output appear in the answer, in order (OpenAI's
    accepted prediction tokens): the matched blocks of an alignment of the two. Counted on
    the answer itself, whichever drafter proposed what, so the figure means the same
    whatever the controller chose."""
    matcher = SequenceMatcher(None, list(prediction), answer, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks())


class Engine:
    """Speculative decoding over a target model and optional drafters."""

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.target = target
        # Every duration the engine and its drafters report (and the controller learns
        # from) is read off this clock: a replay on a cost curve this machine does not
        # have (edgespec.bench.replay) hands in a virtual one.
        self.clock = clock
        self.drafters: dict[str, Drafter] = registry.build(target, draft)
        for drafter in self.drafters.values():
            drafter.clock = clock
        self.cancel = threading.Event()
        self._boundary_of: dict[int, int] = {}

    def _boundaries(self, tokens: list[int]) -> list[int]:
        """For each token: does it end a sentence or a line, and does it break the line?
        (Cached: asked at every step for every proposed token, so a known token costs a
        dictionary lookup.)"""
        known = self._boundary_of
        kinds = list(map(known.get, tokens))
        if None in kinds:
            for i, token in enumerate(tokens):
                if kinds[i] is None:
                    text = self.target.piece(token)
                    if b"\n" in text:
                        kinds[i] = LINE_BREAK
                    elif text.rstrip(b" ").endswith((b".", b"!", b"?", b":", b";")):
                        kinds[i] = UNIT_END
                    else:
                        kinds[i] = 0
                    known[token] = kinds[i]
        return kinds  # type: ignore[return-value]  # (no None is left)

    @property
    def max_gamma(self) -> int:
        return self.target.options.max_outputs - 1

    def stream(
        self, prompt: list[int], settings: GenerationSettings, policy: Policy | None = None
    ) -> Iterator[Event]:
        """Generate from ``prompt`` (token ids), yielding Token, Step and finally Done."""
        settings.validate()
        target = self.target
        if not prompt:
            raise EdgespecError("the prompt is empty")
        if len(prompt) >= target.n_ctx:
            raise EdgespecError(
                f"the prompt is {len(prompt)} tokens but the context holds {target.n_ctx}; "
                "shorten it or raise --ctx"
            )
        policy = policy or FixedPolicy("none", 0)
        policy.check(self.drafters.keys(), self.max_gamma)
        policy.begin()
        self.cancel.clear()
        rng = np.random.default_rng(settings.seed)
        params = settings.sampling
        text = TextStream(target.piece, settings.stop)
        stats = Stats(prompt_tokens=len(prompt), prediction_tokens=len(settings.prediction))
        for drafter in self.drafters.values():
            drafter.begin(list(prompt), list(settings.prediction))
        generated: list[int] = []
        started = self.clock()

        # Prefill the target and emit its first token at once: time to first token never
        # includes the draft's prefill.
        stats.reused_tokens = target.sync(prompt)
        try:
            logits = target.decode(prompt[stats.reused_tokens :], 1)
        except DecodeAborted:
            stats.wall_s = self.clock() - started
            yield Done(text="", tail="", stop_reason="cancelled", stats=stats)
            return
        stats.prefill_s = self.clock() - started
        if settings.penalties.active:
            logits = transform_rows(logits, settings.penalties, prompt, [])
        constraint = Constraint(target, settings.grammar) if settings.grammar is not None else None
        grammar_drafter = self.drafters.get("grammar")
        if isinstance(grammar_drafter, GrammarDrafter):
            grammar_drafter.attach(constraint)
        if constraint is not None:
            first = constraint.choose(logits[0], params, rng)
            constraint.commit([first])
        elif params.greedy:
            first = int(np.argmax(logits[0]))
        else:
            first = sample(probabilities(logits[0], params), rng)
        stop_reason = ""
        committed = list(prompt)
        scores = self._logprobs(logits, [first], settings.logprobs)
        for event in self._emit([first], [PLAIN], committed, generated, text, settings, scores):
            if isinstance(event, str):
                stop_reason = event
            else:
                stats.ttft_s = self.clock() - started
                yield event
        if not stop_reason and isinstance(self.drafters.get("model"), ModelDrafter) and policy.prefill_draft:
            stats.prefill_s += self.drafters["model"].prefill(committed)

        while not stop_reason:
            if self.cancel.is_set():
                stop_reason = "cancelled"
                break
            room = target.n_ctx - len(committed)
            if room < 0:
                stop_reason = "context_full"
                break
            budget = min(room, settings.max_tokens - len(generated) - 1, self.max_gamma)
            step_started = self.clock()
            remaining = settings.max_tokens - len(generated)
            gathered: dict[str, tuple[list[int], int, int]] = {}
            view = StepView(
                committed,
                max(budget, 0),
                params,
                remaining,
                self._boundaries,
                lookup=self._lookup_once(committed, gathered),
                draft_catch_up=self._catch_up_of(committed),
                from_prediction=self._from_prediction,
            )
            plan = policy.plan(view)
            try:
                step_tokens, sources, step, draft, scores = self._step(
                    committed, plan, settings, rng, gathered, constraint
                )
            except DecodeAborted:
                stop_reason = "cancelled"
                break
            python_s = self.clock() - step_started - step.draft_s - step.verify_s
            policy.observe(
                StepOutcome(
                    drafter=step.drafter,
                    gamma=step.gamma,
                    accepted=step.accepted,
                    draft=draft,
                    verify_s=step.verify_s,
                    overhead_s=python_s,
                    new_tokens=step_tokens,
                )
            )
            stats.target_passes += 1
            stats.drafted += step.gamma
            stats.accepted += step.accepted
            stats.draft_s += step.draft_s
            stats.verify_s += step.verify_s
            yield step
            for event in self._emit(step_tokens, sources, committed, generated, text, settings, scores):
                if isinstance(event, str):
                    stop_reason = event
                else:
                    yield event

        stats.tokens = len(generated)
        if settings.prediction:
            stats.prediction_accepted = prediction_tokens_used(settings.prediction, generated)
        tail = text.finish()
        stats.wall_s = self.clock() - started
        yield Done(text=text.text, tail=tail, token_ids=generated, stop_reason=stop_reason, stats=stats)

    def _lookup_once(
        self, committed: list[int], gathered: dict[str, tuple[list[int], int, int]]
    ) -> Callable[[str, int], tuple[list[int], int]]:
        """A step's lookup proposals, each computed at most once (and kept in ``gathered``
        for the step to draft from), only for a policy that asks."""

        def lookup(name: str, max_tokens: int) -> tuple[list[int], int]:
            found = gathered.get(name)
            if found is None or found[2] < max_tokens:
                if name not in LOOKUP_DRAFTERS or name not in self.drafters:
                    return [], 0
                tokens, n = self.drafters[name].lookup(committed, max_tokens)  # type: ignore[attr-defined]
                found = gathered[name] = (tokens, n, max_tokens)
            return found[0][:max_tokens], found[1]

        return lookup

    def _from_prediction(self, name: str) -> bool:
        return bool(getattr(self.drafters.get(name), "from_prediction", False))

    def _catch_up_of(self, committed: list[int]) -> Callable[[], int]:
        drafter = self.drafters.get("model")
        if not isinstance(drafter, ModelDrafter):
            return lambda: 0
        return lambda: drafter.catch_up_cost_tokens(committed)

    def _draft(
        self,
        committed: list[int],
        plan: Plan,
        params: SamplingParams,
        rng: np.random.Generator,
        gathered: dict[str, tuple[list[int], int, int]],
        penalties: Penalties,
        constraint: Constraint | None,
    ) -> Draft:
        """The planned draft: a lookup's proposal gathered for the policy, or the drafter
        asked now."""
        found = gathered.get(plan.drafter)
        if found is not None and found[2] >= plan.gamma:
            tokens = found[0][: plan.gamma]
            if plan.keep_going is not None:
                kept = 0
                while kept < len(tokens) and plan.keep_going(kept, 1.0):
                    kept += 1
                tokens = tokens[:kept]
            return Draft(tokens=list(tokens), confidences=[1.0] * len(tokens), match_len=found[1])
        wants_confidence = plan.wants_confidence or plan.keep_going is not None
        request = DraftRequest(
            plan.gamma,
            params,
            rng,
            plan.keep_going,
            wants_confidence,
            self._draft_transform(committed, penalties),
        )
        guide_from = self.drafters.get("grammar")
        if constraint is not None and params.greedy and isinstance(guide_from, GrammarDrafter):
            guide = GrammarGuide(guide_from, constraint, committed[-1])
            request.choose, request.forced = guide.choose, guide.forced
        return self.drafters[plan.drafter].propose(committed, request)

    @staticmethod
    def _draft_transform(
        committed: list[int], penalties: Penalties
    ) -> Callable[[np.ndarray, list[int]], np.ndarray] | None:
        """The penalties on the draft model's rows, each with its own history (the
        committed text and the tokens drafted before it)."""
        if not penalties.active:
            return None
        window = Window(committed, penalties.last_n)
        pushed = 0

        def apply(row: np.ndarray, drafted: list[int]) -> np.ndarray:
            nonlocal pushed
            for token in drafted[pushed:]:
                window.push(token)
            pushed = len(drafted)
            return transform_row(row, penalties, window.counts)

        return apply

    @staticmethod
    def _logprobs(
        rows: np.ndarray, tokens: list[int], top_n: int | None
    ) -> list[tuple[float, tuple[tuple[int, float], ...]]] | None:
        """Each token's log-probability under its row (the target's distribution at its
        position, penalties applied), and the ``top_n`` most likely tokens there."""
        if top_n is None:
            return None
        scores = []
        for row, token in zip(rows, tokens, strict=False):
            top = float(row.max())
            log_total = top + math.log(float(np.sum(np.exp(row - top), dtype=np.float64)))
            best: tuple[tuple[int, float], ...] = ()
            if top_n:
                ids = np.argpartition(row, -top_n)[-top_n:]
                ids = ids[np.argsort(-row[ids], kind="stable")]
                best = tuple((int(i), float(row[i]) - log_total) for i in ids)
            scores.append((float(row[token]) - log_total, best))
        return scores

    def _step(
        self,
        committed: list[int],
        plan: Plan,
        settings: GenerationSettings,
        rng: np.random.Generator,
        gathered: dict[str, tuple[list[int], int, int]],
        constraint: Constraint | None,
    ) -> tuple[list[int], list[str], Step, Draft, list | None]:
        target = self.target
        params = settings.sampling
        draft = Draft(tokens=[])
        if plan.gamma > 0 and plan.drafter != "none":
            draft = self._draft(committed, plan, params, rng, gathered, settings.penalties, constraint)
            # A draft that ends the answer ends the draft: tokens after it could only be
            # verified for nothing, and would count as accepted drafts that never appear.
            end = next((i + 1 for i, token in enumerate(draft.tokens) if target.is_eog(token)), None)
            if end is not None:
                draft.truncate(end)
            if constraint is not None:
                # Nor is a row spent after a token the grammar forbids. A sampled draft
                # keeps that token: the target refuses it for sure (the grammar gives it
                # no probability), and its residual is what keeps sampling exact; cut
                # before it, the draft's own probability of forbidden tokens would skew
                # the answer. A one-hot draft's residual there is the target's row itself.
                allowed = constraint.allowed_prefix(draft.tokens)
                draft.truncate(allowed + 1 if draft.q is not None and not params.greedy else allowed)
        gamma = len(draft.tokens)

        target.mark()
        verify_start = self.clock()
        logits = target.decode([committed[-1], *draft.tokens], gamma + 1)
        verify_s = self.clock() - verify_start
        if settings.penalties.active:
            logits = transform_rows(logits, settings.penalties, committed, draft.tokens)
        scores_of = logits  # log-probabilities are the target's own, before any grammar

        if constraint is not None and params.greedy:
            verdict = acceptance.Verdict(*constraint.verify_greedy(draft.tokens, logits))
        elif params.greedy:
            verdict = acceptance.verify_greedy(draft.tokens, np.argmax(logits, axis=1))
        else:
            if constraint is not None:
                logits = constraint.mask_rows(draft.tokens, logits)
            p = probabilities(logits, params)
            if settings.verify == "block" and settings.lenience == 1.0:
                verdict = acceptance.verify_block(draft.tokens, draft.q, p, rng)
            else:
                verdict = acceptance.verify_tokens(draft.tokens, draft.q, p, rng, settings.lenience)
        accepted = verdict.accepted
        target.keep(len(committed) + accepted)

        tokens = [*draft.tokens[:accepted], verdict.next_token]
        if constraint is not None:
            constraint.commit(tokens)
        last = PLAIN if gamma == 0 else BONUS if accepted == gamma else TARGET
        sources = [DRAFT] * accepted + [last]
        step = Step(
            drafter=plan.drafter if gamma else "none",
            gamma=gamma,
            accepted=accepted,
            draft_s=draft.seconds,
            verify_s=verify_s,
            planned_gamma=plan.gamma,
            reason=plan.reason,
        )
        return tokens, sources, step, draft, self._logprobs(scores_of, tokens, settings.logprobs)

    def _emit(
        self,
        tokens: list[int],
        sources: list[str],
        committed: list[int],
        generated: list[int],
        text: TextStream,
        settings: GenerationSettings,
        scores: list[tuple[float, tuple[tuple[int, float], ...]]] | None = None,
    ) -> Iterator[Token | str]:
        """Commit tokens one by one, yielding Token events; a str item is a stop reason
        (the tokens after it are dropped)."""
        for i, (token, source) in enumerate(zip(tokens, sources, strict=True)):
            if self.target.is_eog(token):
                yield "eos"
                return
            committed.append(token)
            generated.append(token)
            if scores is None:
                yield Token(token=token, text=text.push(token), source=source)
            else:
                logprob, best = scores[i]
                yield Token(token, text.push(token), source, logprob, best)
            if text.stopped:
                yield "stop_string"
                return
            if len(generated) >= settings.max_tokens:
                yield "max_tokens"
                return

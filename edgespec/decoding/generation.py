"""One answer, from its request to its ``Done``: the ``Generation`` owns everything that
lives as long as the answer does (its request and settings, its cancel token and live
control, its grammar's state, its drafters, its policy, its text so far and its figures).
The engine that creates it holds only what lives across answers.

One step: a drafter proposes up to γ tokens, the target scores the last committed token
plus every draft in ONE batched decode (γ+1 logits rows), the acceptance rule keeps the
longest valid prefix and adds one token of the target's own (a correction, or a bonus
when every draft was accepted), and both caches are rolled back to the committed text.
γ = 0 is plain target decoding through the very same code, which is what baselines use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from edgespec.decoding import acceptance
from edgespec.decoding.acceptance import check_lenience
from edgespec.decoding.constrained import Constraint
from edgespec.decoding.drafters import REGISTRY, AnswerSetup, Draft, Drafter, DraftRequest, Proposal
from edgespec.decoding.drafters.base import lookup_draft
from edgespec.decoding.events import BONUS, DRAFT, PLAIN, TARGET, Done, Event, Stats, Step, Token
from edgespec.decoding.penalties import Penalties, Window, transform_row, transform_rows
from edgespec.decoding.policy import Plan, Policy, StepOutcome, StepView
from edgespec.decoding.request import Request, prediction_tokens_used
from edgespec.decoding.runner import PAUSE, Deliver, DraftPass, Pass, Passed, Pause, Runner, Steps
from edgespec.decoding.sampling import probabilities, sample
from edgespec.decoding.slots import Cancel
from edgespec.decoding.textstream import TextStream
from edgespec.decoding.turns import Turns
from edgespec.runtime.model import Model
from edgespec.runtime.sequence import DecodeAborted, DecodeYielded, Sequence

Scores = list[tuple[float, tuple[tuple[int, float], ...]]]


class LiveControl:
    """The one part of a running answer that another thread may change: its lenience (the
    app's slider, read at every step) and its stop (which ends this answer, and only it)."""

    def __init__(self, lenience: float = 1.0):
        self._lenience = check_lenience(lenience)
        self.cancel = Cancel()

    @property
    def lenience(self) -> float:
        return self._lenience

    def set_lenience(self, lenience: float) -> None:
        self._lenience = check_lenience(float(lenience))

    def stop(self) -> None:
        self.cancel.set()

    @property
    def stopped(self) -> bool:
        return self.cancel.is_set()


class StepProposals:
    """One step's free proposals, each computed at most once and only when the policy asks
    for it; the step drafts the chosen one from here."""

    def __init__(self, drafters: dict[str, Drafter], context: list[int]):
        self._drafters = drafters
        self._context = context
        self._found: dict[str, Proposal] = {}

    def get(self, name: str, max_tokens: int) -> Proposal:
        """``name``'s proposal of at most ``max_tokens`` (empty for a drafter the answer
        does not have, or one that is not free)."""
        found = self._found.get(name)
        if found is None or found.asked < max_tokens:
            drafter = self._drafters.get(name)
            if drafter is None or not REGISTRY[name].free:
                return Proposal(name)
            found = self._found[name] = drafter.proposal(self._context, max_tokens)
        return found.first(max_tokens)

    def taken(self, name: str, gamma: int) -> Proposal | None:
        """The proposal gathered for ``name`` if it was asked for at least ``gamma`` tokens."""
        found = self._found.get(name)
        return found if found is not None and found.asked >= gamma else None

    def catch_up(self, name: str) -> int:
        drafter = self._drafters.get(name)
        return drafter.catch_up_tokens(self._context) if drafter is not None else 0


@dataclass(frozen=True)
class PairView:
    """What a generation uses of the engine that made it: the models, the clock, and the
    per-token facts the engine keeps across answers."""

    target: Model
    draft: Model | None
    clock: Callable[[], float]
    boundaries: Callable[[list[int]], list[int]]
    max_gamma: int
    turn: Turns  # the pair's loop: the slot table, the answers' model calls in turn


class Generation(Runner):
    """One answer, the live one: made by ``Engine.start`` from a validated request (with
    its owner and where its events go), queued once (``enqueue``, or on the first read of
    ``events()``), ``stop()`` ends it from any thread. As a ``Runner`` the pair's loop
    admits it into a slot (which sets ``sequence``) and drives its steps."""

    def __init__(
        self,
        pair: PairView,
        request: Request,
        policy: Policy,
        drafters: dict[str, Drafter],
        *,
        owner: str | None = None,
        deliver: Deliver | None = None,
    ):
        assert len(request.prompt) < pair.target.n_ctx, "the request builder checks the context"
        live = LiveControl(request.settings.lenience)
        super().__init__(request.prompt, live.cancel, owner, deliver)
        self.live = live
        self.pair = pair
        self.request = request
        self.settings = request.settings
        self.policy = policy
        self.drafters = drafters
        self.constraint: Constraint | None = None
        self.rng = np.random.default_rng(request.settings.seed)
        self.text = TextStream(pair.target.piece, request.settings.stop)
        self.committed = list(request.prompt)
        self.generated: list[int] = []
        self.stats = Stats(
            prompt_tokens=len(request.prompt), prediction_tokens=len(request.settings.prediction)
        )
        self.stop_reason = ""
        self.queued = False
        self.ahead = 0  # answers ahead of it when it was queued
        # The other answers' passes, and their tokens, decoded with the last pass: what the
        # next one is likely to share.
        self._shared_with = (0, 0)
        self._waited_s = 0.0  # what the last pass was waited for beyond its own share

    def stop(self) -> None:
        """End this answer at its next step (a long prefill at once); no other answer."""
        self.live.stop()

    @property
    def waiting(self) -> bool:
        """Queued and not yet given a slot."""
        return self.queued and self.pair.turn.slots.waits(self)

    def enqueue(self, limit: int | None = None) -> int:
        """Queue the answer (once) for a slot: the pair's loop runs it, its events handed
        to ``deliver``; how many answers were ahead of it. ``limit``: at most that many
        answers may wait, else ``slots.QueueFull``."""
        assert not self.queued, "an answer runs once"
        self.ahead = self.pair.turn.enqueue(self, limit)
        self.queued = True
        return self.ahead

    def events(self, every_s: float = 0.0) -> Iterator[Event]:
        """The answer's Token and Step events, then one Done, queued first if it was not
        yet: as they come or, with ``every_s``, in bunches at most that often after the
        first (the last at once). Leaving early stops the answer."""
        if not self.queued:
            self.enqueue()
        yield from self.pair.turn.follow(self, every_s)  # type: ignore[misc]  # (its events)

    def steps(self) -> Steps:
        return self._run()  # type: ignore[return-value]

    @property
    def target_sequence(self) -> Sequence:
        """The answer's sequence of the target: every decode and rollback of its names it."""
        return self.pair.target.sequence(self.sequence)

    def _run(self) -> Iterator[Event | Pause | Pass | DraftPass]:
        started = self.pair.clock()
        self.policy.begin()
        yield from self._first_token(started)
        while not self.stop_reason:
            yield from self._step()
        self.stats.tokens = len(self.generated)
        if self.settings.prediction:
            self.stats.prediction_accepted = prediction_tokens_used(self.settings.prediction, self.generated)
        tail = self.text.finish()
        self.stats.wall_s = self.pair.clock() - started
        yield Done(
            text=self.text.text,
            tail=tail,
            token_ids=self.generated,
            stop_reason=self.stop_reason,
            stats=self.stats,
            stop_sequence=self.text.matched,
        )

    # -- the prompt and the first token ---------------------------------------------------

    def _first_token(self, started: float) -> Iterator[Event | Pause | Pass]:
        """Prefill the target and emit its first token at once: time to first token never
        includes the draft's prefill. A long prompt is read a batch per turn."""
        target, prompt, settings = self.pair.target, list(self.request.prompt), self.settings
        if self.live.stopped:  # withdrawn while it waited for the pair: nothing runs
            self.stop_reason = "cancelled"
            return
        sequence, cancel = self.target_sequence, self.live.cancel
        self.stats.reused_tokens = sequence.sync(prompt, start=True, most=self.request.reuse_limit)
        rest = prompt[self.stats.reused_tokens :]
        try:
            # The same batches one decode of the whole rest would make, so the numbers
            # are the same; other answers step between them.
            chunk = target.prefill_chunk
            while len(rest) > chunk:
                yield from self._read(partial(sequence.decode, rest[:chunk], 0, cancel=cancel))
                rest = rest[chunk:]
            logits = sequence.decode(rest, 1, cancel=cancel)
        except DecodeAborted:
            self.stop_reason = "cancelled"
            return
        self.stats.prefill_s = self.pair.clock() - started
        if settings.penalties.active:
            logits = transform_rows(logits, settings.penalties, prompt, [])
        if settings.grammar is not None:
            self.constraint = Constraint(target, settings.grammar)
        self._begin_drafters()
        first = self._choose_first(logits[0])
        scores = self._logprobs(logits, [first])
        for token in self._commit([first], [PLAIN], scores):
            self.stats.ttft_s = self.pair.clock() - started
            yield token
        if not self.stop_reason and self.policy.prefill_draft:
            # The turn ends with the first token, so it reaches the reader before the
            # draft model reads the prompt.
            yield PAUSE
            yield from self._prefill_drafters()

    def _prefill_drafters(self) -> Iterator[Pause]:
        """The drafters read the prompt ahead of the first draft, a batch per turn."""
        try:
            for drafter in self.drafters.values():
                yield from self._read_ahead(drafter, leave=1)
        except DecodeAborted:
            self.stop_reason = "cancelled"

    def _read_ahead(self, drafter: Drafter, leave: int) -> Iterator[Pause]:
        """``drafter`` reads the context a batch per turn until at most ``leave`` tokens of
        it are left unread: the draft model reads a long context in many batches, and
        other answers step between them."""
        most = self.pair.draft.prefill_chunk if self.pair.draft is not None else None
        while drafter.catch_up_tokens(self.committed) > leave:
            self.stats.prefill_s += yield from self._read(partial(drafter.prefill, self.committed, most))

    def _read(self, decode: Callable[..., object]) -> Generator[Pause, None, float]:
        """One batch of a prompt (``decode``), then the turn ends; the seconds it took
        (not the other answers' turns). An answer that arrives meanwhile stops the batch
        (``DecodeYielded``): the turn ends at once, the newcomer goes first, and the batch
        is read again next turn, not stopped a second time."""
        clock = self.pair.clock
        started = clock()
        try:
            decode(arrival=self.pair.turn.arrival)
            spent = clock() - started
        except DecodeYielded:
            spent = clock() - started  # (lost, but this answer's own work)
            yield PAUSE
            if self.live.stopped:
                raise DecodeAborted() from None
            started = clock()
            decode()
            spent += clock() - started
        yield PAUSE
        if self.live.stopped:
            raise DecodeAborted()
        return spent

    def _begin_drafters(self) -> None:
        setup = AnswerSetup(
            prompt=list(self.request.prompt),
            prediction=list(self.settings.prediction),
            constraint=self.constraint,
            cancel=self.live.cancel,
            clock=self.pair.clock,
            sequence=self.sequence,
        )
        for drafter in self.drafters.values():
            drafter.begin(setup)

    def _choose_first(self, row: np.ndarray) -> int:
        params = self.settings.sampling
        if self.constraint is not None:
            first = self.constraint.choose(row, params, self.rng)
            self.constraint.commit([first])
            return first
        if params.greedy:
            return int(np.argmax(row))
        return sample(probabilities(row, params), self.rng)

    # -- the steps --------------------------------------------------------------------------

    def _step(self) -> Iterator[Event | Pause | Pass | DraftPass]:
        if self.live.stopped:
            self.stop_reason = "cancelled"
            return
        pair, settings = self.pair, self.settings
        room = pair.target.n_ctx - len(self.committed)
        if room < 0:
            self.stop_reason = "context_full"
            return
        budget = min(room, settings.max_tokens - len(self.generated) - 1, pair.max_gamma)
        step_started = pair.clock()
        proposals = StepProposals(self.drafters, self.committed)
        # the decode this step's pass will share: as far as this round knows it, else as
        # the last one was
        sharing = pair.turn.sharing() or self._shared_with
        view = StepView(
            self.committed,
            max(budget, 0),
            settings.sampling,
            settings.max_tokens - len(self.generated),
            pair.boundaries,
            proposal=proposals.get,
            catch_up=proposals.catch_up,
            others=sharing[0],
            others_tokens=sharing[1],
        )
        plan = self.policy.plan(view)
        try:
            if plan.gamma > 0 and plan.drafter in self.drafters and self.pair.draft is not None:
                # A drafter that has fallen behind by more than a batch (chosen after plain
                # steps) catches up a batch per turn; what is left it reads as it drafts.
                # (The plan's lookups and pricing stay in the step's time: they are what
                # drafting costs beyond plain decoding, besides its passes.)
                planned_s = pair.clock() - step_started
                yield from self._read_ahead(self.drafters[plan.drafter], self.pair.draft.prefill_chunk)
                step_started = pair.clock() - planned_s
            draft = yield from self._draft(plan, proposals)
            tokens, sources, step, scores = yield from self._verify(plan, draft)
        except DecodeAborted:
            self.stop_reason = "cancelled"
            return
        # Less the time the answer waited for its pass and its draft's decodes beyond
        # its share of them (other answers' turns): what the step cost is its own work.
        waited = self._waited_s + draft.waited_s
        self._learn(step, draft, tokens, pair.clock() - step_started - waited)
        yield step
        yield from self._commit(tokens, sources, scores)

    def _learn(self, step: Step, draft: Draft, tokens: list[int], step_s: float) -> None:
        self.policy.observe(
            StepOutcome(
                drafter=step.drafter,
                gamma=step.gamma,
                accepted=step.accepted,
                draft=draft,
                verify_s=step.verify_s,
                overhead_s=step_s - step.draft_s - step.verify_s,
                new_tokens=tokens,
                shared_with=self._shared_with[0],
            )
        )
        stats = self.stats
        stats.target_passes += 1
        stats.shared_passes += self._shared_with[0] > 0
        stats.drafted += step.gamma
        stats.accepted += step.accepted
        stats.draft_s += step.draft_s
        stats.verify_s += step.verify_s

    def _draft(self, plan: Plan, proposals: StepProposals) -> Generator[DraftPass, Passed, Draft]:
        """The planned draft, cut where it ends the answer or leaves the grammar."""
        if plan.gamma <= 0 or plan.drafter == "none":
            return Draft(tokens=[])
        found = proposals.taken(plan.drafter, plan.gamma)
        if found is not None:  # a free proposal gathered for the policy, drafted as it is
            draft = lookup_draft(found.tokens[: plan.gamma], found.evidence, plan.keep_going)
        else:
            draft = yield from self._ask(plan)
        # A draft that ends the answer ends the draft: tokens after it could only be
        # verified for nothing, and would count as accepted drafts that never appear.
        is_eog = self.pair.target.is_eog
        end = next((i + 1 for i, token in enumerate(draft.tokens) if is_eog(token)), None)
        if end is not None:
            draft.truncate(end)
        if self.constraint is not None:
            # Nor is a row spent after a token the grammar forbids. A sampled draft keeps
            # that token: the target refuses it for sure (the grammar gives it no
            # probability), and its residual is what keeps sampling exact; cut before it,
            # the draft's own probability of forbidden tokens would skew the answer. A
            # one-hot draft's residual there is the target's row itself.
            allowed = self.constraint.allowed_prefix(draft.tokens)
            sampled = draft.q is not None and not self.settings.sampling.greedy
            draft.truncate(allowed + 1 if sampled else allowed)
        return draft

    def _ask(self, plan: Plan) -> Generator[DraftPass, Passed, Draft]:
        request = DraftRequest(
            plan.gamma,
            self.settings.sampling,
            self.rng,
            plan.keep_going,
            plan.wants_confidence or plan.keep_going is not None,
            self._draft_transform(),
        )
        # The loop decodes the draft model's steps with the other answers'.
        return (yield from self.drafters[plan.drafter].drafting(self.committed, request))

    def _draft_transform(self) -> Callable[[np.ndarray, list[int]], np.ndarray] | None:
        """The penalties on the draft model's rows, each with its own history (the
        committed text and the tokens drafted before it)."""
        penalties: Penalties = self.settings.penalties
        if not penalties.active:
            return None
        window = Window(self.committed, penalties.last_n)
        pushed = 0

        def apply(row: np.ndarray, drafted: list[int]) -> np.ndarray:
            nonlocal pushed
            for token in drafted[pushed:]:
                window.push(token)
            pushed = len(drafted)
            return transform_row(row, penalties, window.counts)

        return apply

    def _verify(
        self, plan: Plan, draft: Draft
    ) -> Generator[Pass, object, tuple[list[int], list[str], Step, Scores | None]]:
        """One target pass over the last committed token and the draft; the committed
        tokens, their provenance, the step and the tokens' log-probabilities."""
        target, settings, committed = self.target_sequence, self.settings, self.committed
        gamma = len(draft.tokens)
        target.mark()
        passed = yield from self._pass([committed[-1], *draft.tokens])
        logits, verify_s = passed.logits, passed.seconds
        if settings.penalties.active:
            logits = transform_rows(logits, settings.penalties, committed, draft.tokens)
        verdict = self._verdict(draft, logits)
        accepted = verdict.accepted
        target.keep(len(committed) + accepted)
        tokens = [*draft.tokens[:accepted], verdict.next_token]
        if self.constraint is not None:
            self.constraint.commit(tokens)
        last = PLAIN if gamma == 0 else BONUS if accepted == gamma else TARGET
        step = Step(
            drafter=plan.drafter if gamma else "none",
            gamma=gamma,
            accepted=accepted,
            draft_s=draft.seconds,
            verify_s=verify_s,
            planned_gamma=plan.gamma,
            reason=plan.reason,
        )
        # log-probabilities are the target's own, before any grammar
        return tokens, [DRAFT] * accepted + [last], step, self._logprobs(logits, tokens)

    def _pass(self, tokens: list[int]) -> Generator[Pass, object, Passed]:
        """The target's pass over ``tokens``, a logits row each, asked of the pair's loop,
        which decodes it with the other answers' passes."""
        clock = self.pair.clock
        asked = clock()
        passed: Passed = yield Pass(tokens)  # (a failed decode is raised here)
        self._shared_with = (passed.others, passed.others_tokens)
        self._waited_s = clock() - asked - passed.seconds
        return passed

    def _verdict(self, draft: Draft, logits: np.ndarray) -> acceptance.Verdict:
        params, constraint = self.settings.sampling, self.constraint
        if constraint is not None and params.greedy:
            return acceptance.Verdict(*constraint.verify_greedy(draft.tokens, logits))
        if params.greedy:
            return acceptance.verify_greedy(draft.tokens, np.argmax(logits, axis=1))
        if constraint is not None:
            logits = constraint.mask_rows(draft.tokens, logits)
        p = probabilities(logits, params)
        lenience = self.live.lenience
        if self.settings.verify == "block" and lenience == 1.0:
            return acceptance.verify_block(draft.tokens, draft.q, p, self.rng)
        return acceptance.verify_tokens(draft.tokens, draft.q, p, self.rng, lenience)

    def _logprobs(self, rows: np.ndarray, tokens: list[int]) -> Scores | None:
        """Each token's log-probability under its row (the target's distribution at its
        position, penalties applied), and the most likely tokens there, as asked."""
        top_n = self.settings.logprobs
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

    def _commit(self, tokens: list[int], sources: list[str], scores: Scores | None) -> Iterator[Token]:
        """Commit tokens one by one, yielding a Token for each; where the answer ends
        (its end token, a stop string, max tokens) the rest are dropped and
        ``stop_reason`` says why."""
        for i, (token, source) in enumerate(zip(tokens, sources, strict=True)):
            if self.pair.target.is_eog(token):
                self.stop_reason = "eos"
                return
            self.committed.append(token)
            self.generated.append(token)
            text = self.text.push(token)
            if scores is None:
                yield Token(token=token, text=text, source=source)
            else:
                yield Token(token, text, source, *scores[i])
            if self.text.stopped:
                self.stop_reason = "stop_string"
                return
            if len(self.generated) >= self.settings.max_tokens:
                self.stop_reason = "max_tokens"
                return

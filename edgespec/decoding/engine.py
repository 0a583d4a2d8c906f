"""The engine: what lives across answers for one loaded pair (the models, the clock,
which drafters the pair can have and what they share across answers, what each token is
for the controller's copy boundaries). It makes one ``Generation`` per answer
(``start``), which runs the decoding loop and owns the answer's state; see
``decoding.generation``; and a ``ReadAhead`` per prompt read before it is asked
(``read_ahead``), which the loop runs below every answer; see ``decoding.read_ahead``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

from edgespec.decoding.drafters import REGISTRY, AnswerSetup, Drafter, registry
from edgespec.decoding.events import Event
from edgespec.decoding.generation import Generation, PairView
from edgespec.decoding.policy import LINE_BREAK, UNIT_END, FixedPolicy, Policy
from edgespec.decoding.read_ahead import ReadAhead
from edgespec.decoding.request import GenerationSettings, Request
from edgespec.decoding.runner import END, Deliver
from edgespec.decoding.slots import Slots
from edgespec.decoding.turns import Turns
from edgespec.runtime.model import Model

__all__ = ["Engine"]


def _dropped(_events: list[object]) -> None:
    """Where an ended answer's later events go."""


class Engine:
    """Speculative decoding over a target model and optional drafters."""

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        threaded: bool = False,
    ):
        self.target = target
        self.draft = draft
        # Every duration the engine and its drafters report (and the controller learns
        # from) is read off this clock: a replay on a cost curve this machine does not
        # have (edgespec.bench.replay) hands in a virtual one.
        self.clock = clock
        # The drafters this pair can have, by name, in registry order (each answer gets
        # its own instances of those it can use).
        self.drafters: tuple[str, ...] = registry.available(draft is not None)
        # What those drafters share across answers (the suffix lookup's index of every
        # conversation the pair has seen): it lives as long as the pair.
        self.shared = registry.PairShared()
        self._boundary_of: dict[int, int] = {}
        # Answers running at once: one sequence (slot) each, admitted from one queue by the
        # pair's loop, their steps in rounds (on one engine thread where several threads
        # read answers), their passes in one decode.
        self.slots = Slots(target.n_seq, lambda seq: target.sequence(seq).tokens, self._stored)
        drafts = partial(draft.decode_passes, last=True) if draft is not None else None
        self.turn = Turns(self.slots, threaded, target.decode_passes, clock, drafts)
        # The newest read-ahead of each owner: the next one of the owner stops it.
        self._reading: dict[str | None, ReadAhead] = {}
        self._reading_guard = threading.Lock()

    def _stored(self, prompt: list[int]) -> int:
        """How much of ``prompt`` the target's prompt cache could bring into a sequence."""
        cache, target = self.target.prompt_cache, self.target
        return cache.held(target, prompt) if cache is not None and target.rollback == "truncate" else 0

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

    def start(
        self,
        request: Request,
        policy: Policy | None = None,
        *,
        owner: str | None = None,
        deliver: Deliver | None = None,
    ) -> Generation:
        """One answer to ``request`` (validated at the edge: its prompt fits the context,
        its policy's drafters are among this pair's), decided step by step by ``policy``
        (target only when None), ``owner``'s, its events handed to ``deliver`` (None: kept
        for its reader). Nothing runs until it is queued (``Generation.enqueue``, or the
        first read of its events)."""
        policy = policy or FixedPolicy("none", 0)
        pair = PairView(self.target, self.draft, self.clock, self._boundaries, self.max_gamma, self.turn)
        drafters = registry.build(
            self.drafters,
            self.target,
            self.draft,
            has_grammar=request.settings.grammar is not None,
            shared=self.shared,
        )
        return Generation(pair, request, policy, drafters, owner=owner, deliver=deliver)

    def read_ahead(self, tokens: list[int], owner: str | None = None) -> ReadAhead:
        """A read-ahead of ``tokens`` (a prompt's beginning, validated at the edge), what
        the pair holds of them already counted as read; ``owner``'s last one is stopped
        (what it read stays). Nothing runs until it is handed to the loop
        (``turn.background``)."""
        cached = self.slots.cached(tokens)
        reading = ReadAhead(tokens, self.target, self.draft, self.turn.arrival, owner=owner, cached=cached)
        with self._reading_guard:
            before, self._reading[owner] = self._reading.get(owner), reading
        if before is not None:
            before.stop()
        return reading

    def end_answers(self, error: BaseException) -> int:
        """End every answer running or waiting with ``error``, each once (its later events
        go nowhere), and every call waiting on the loop: the loop will not come back from
        the pass it is in. How many answers were ended now."""
        self.turn.abandon_calls(error)
        ended = 0
        for answer in self.slots.answers():
            deliver = answer.deliver  # type: ignore[attr-defined]  # (the table's are runners)
            if deliver is _dropped:
                continue
            answer.deliver = _dropped  # type: ignore[attr-defined]
            answer.cancel.set()
            deliver([error, END])
            ended += 1
        return ended

    def stop_reading(self) -> None:
        """Stop every read-ahead (the pair is closing)."""
        with self._reading_guard:
            readings, self._reading = list(self._reading.values()), {}
        for reading in readings:
            reading.stop()

    def free_drafters(self, setup: AnswerSetup) -> dict[str, Drafter]:
        """The free drafters an answer with ``setup`` has, built and begun as its
        generation builds and begins them: what the benchmark's ceiling and holds judge."""
        names = tuple(name for name in self.drafters if REGISTRY[name].free)
        drafters = registry.build(
            names, self.target, self.draft, has_grammar=setup.constraint is not None, shared=self.shared
        )
        for drafter in drafters.values():
            drafter.begin(setup)
        return drafters

    def stream(
        self, prompt: list[int], settings: GenerationSettings, policy: Policy | None = None
    ) -> Iterator[Event]:
        """Generate from ``prompt`` (token ids), yielding Token, Step and finally Done."""
        yield from self.start(Request(tuple(prompt), settings), policy).events()

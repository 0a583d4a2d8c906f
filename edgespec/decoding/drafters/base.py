"""What every drafter shares: what it is given as an answer starts (``AnswerSetup``), a
free proposal (``Proposal``), a draft (``Draft``) and its request, the ``Drafter``
interface, and the base of the draftless lookup drafters.

The interface is small (as in llama.cpp's common/speculative) and explicit: every drafter
begins an answer, proposes for a step, says what it must decode before it can propose
(``catch_up_tokens``) and may read the context ahead of time (``prefill``); a free drafter
also answers ``proposal``, which the engine hands the policy as data. What a drafter may
need (a draft model, the answer's grammar, a predicted output) its ``DrafterSpec``
declares. A drafter instance serves one answer. It keeps whatever state it needs (a KV
cache, an n-gram index) and brings it up to date with the committed context it is given
at every call: accepting and rolling back are that context, so the engine never has to
tell a drafter what was accepted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from edgespec.decoding.sampling import SamplingParams
from edgespec.decoding.turns import DraftPass, Passed

if TYPE_CHECKING:
    from edgespec.decoding.constrained import Constraint


@dataclass(frozen=True)
class AnswerSetup:
    """What every drafter of an answer is given as the answer starts."""

    prompt: list[int]
    # The answer the client expects (OpenAI's Predicted Outputs; empty when none was given).
    prediction: list[int] = field(default_factory=list)
    # The grammar the answer follows, in step with the committed text (None: no grammar).
    constraint: Constraint | None = None
    # Set when the answer is stopped: a drafter's long decode stops with it.
    cancel: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], float] = time.perf_counter  # what durations are read off
    sequence: int = 0  # the answer's slot: the sequence of a draft model it decodes in


@dataclass(frozen=True)
class Proposal:
    """A free drafter's proposal for one step, as the engine hands it to the policy."""

    drafter: str
    tokens: tuple[int, ...] = ()
    # How much evidence is behind it, in tokens: the matched suffix of a copy, the forced
    # run that opens a grammar's proposal. The controller keeps acceptance by this.
    evidence: int = 0
    from_prediction: bool = False  # it copies the request's predicted output
    asked: int = 0  # the most tokens that were asked for

    def first(self, n: int) -> Proposal:
        """The same proposal cut to its first ``n`` tokens."""
        return (
            self
            if len(self.tokens) <= n
            else Proposal(self.drafter, self.tokens[:n], self.evidence, self.from_prediction, self.asked)
        )


@dataclass
class Draft:
    tokens: list[int]
    # Row i is the distribution token i was drawn from (sampling with a model drafter);
    # None when proposals are deterministic (greedy, n-gram): q is then one-hot.
    q: np.ndarray | None = None
    # The drafter's probability for each proposed token (its confidence), for the controller;
    # NaN for a token a grammar forced into a draft model's draft (no guess of the model's).
    confidences: list[float] = field(default_factory=list)
    seconds: float = 0.0  # llama.cpp time spent drafting
    catch_up: int = 0  # context tokens the drafter had to decode before drafting
    evidence: int = 0  # a free drafter's: see Proposal.evidence
    decodes: list[tuple[int, float]] = field(default_factory=list)  # (batch size, seconds) per decode
    # Some decode was shared with other answers' (its seconds a share of it): not what
    # the draft model's cost curve prices.
    shared: bool = False
    waited_s: float = 0.0  # spent on other answers' share of its decodes and their turns

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` proposed tokens."""
        del self.tokens[n:], self.confidences[n:]
        if self.q is not None:
            self.q = self.q[:n]


@dataclass
class DraftRequest:
    max_tokens: int
    params: SamplingParams
    rng: np.random.Generator
    # Asked for every draft token i (0-based) with the draft's confidence in it, before
    # it is included; False ends the draft there.
    keep_going: Callable[[int, float], bool] | None = None
    # Greedy drafting needs only the argmax; the confidence is a softmax over the whole
    # vocabulary per token, worth computing only for a policy that uses it.
    wants_confidence: bool = True
    # Applied to each row of the draft model's logits before it drafts from it, with the
    # tokens drafted so far in this step: the target's penalties and biases, so that the
    # draft proposes what the penalized target would.
    transform: Callable[[np.ndarray, list[int]], np.ndarray] | None = None


# A draft as the engine thread drives it: each decode of the draft model asked for, and
# what it gave (its logits row, its seconds); the draft at the end.
Drafting = Generator[DraftPass, Passed, Draft]


class Drafter(Protocol):
    name: str

    def begin(self, setup: AnswerSetup) -> None:
        """The answer starts (called once, before any other call)."""
        ...

    def proposal(self, context: list[int], max_tokens: int) -> Proposal:
        """A free drafter's proposal for the next step (a drafter that costs a model call
        proposes nothing here: it drafts only when asked to, in ``propose``)."""
        ...

    def propose(self, context: list[int], request: DraftRequest) -> Draft: ...

    def drafting(self, context: list[int], request: DraftRequest) -> Drafting:
        """The draft ``propose`` gives, each model decode it needs asked of whoever drives
        it: the engine thread batches several answers' decodes into one."""
        ...

    def catch_up_tokens(self, context: list[int]) -> int:
        """Context tokens ``propose`` would decode before its first draft token."""
        ...

    def prefill(
        self, context: list[int], most: int | None = None, *, arrival: threading.Event | None = None
    ) -> float:
        """Read ``context`` ahead of the first draft (at most ``most`` tokens of it this
        call: ``catch_up_tokens`` says what is left); seconds spent. ``arrival``: the
        read stops (``DecodeYielded``) once it is set (another answer arrived)."""
        ...


class LookupDrafter:
    """A draftless drafter: it copies a continuation out of the context itself, so a
    proposal costs no model call. Subclasses say where to copy from (``lookup``)."""

    name = "lookup"
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(self) -> None:
        self._seen: list[int] = []  # the context of the last lookup
        self.prediction: list[int] = []  # the request's predicted output, a second source
        self.from_prediction = False  # the last proposal copies the predicted output

    def begin(self, setup: AnswerSetup) -> None:
        self.prediction = list(setup.prediction)
        self.clock = setup.clock

    def catch_up_tokens(self, context: list[int]) -> int:
        return 0  # a lookup reads the context as it is

    def prefill(
        self, context: list[int], most: int | None = None, *, arrival: threading.Event | None = None
    ) -> float:
        return 0.0

    def proposal(self, context: list[int], max_tokens: int) -> Proposal:
        tokens, n = self.lookup(context, max_tokens)
        return Proposal(self.name, tuple(tokens), n, self.from_prediction, max_tokens)

    def _advance(self, context: list[int]) -> list[int] | None:
        """Tokens added to the context since the last lookup, so that an index is only
        extended; None when the context does not continue it (a new or edited
        conversation) and the index must start over."""
        seen = self._seen
        continues = len(context) >= len(seen) and context[: len(seen)] == seen
        self._seen = list(context)
        return context[len(seen) :] if continues else None

    def lookup(self, context: list[int], max_tokens: int) -> tuple[list[int], int]:
        """(proposed tokens, matched length in tokens); ([], 0) when nothing matches."""
        raise NotImplementedError

    def drafting(self, context: list[int], request: DraftRequest) -> Drafting:
        draft = self.propose(context, request)
        yield from ()  # a lookup asks for no decode
        return draft

    def propose(self, context: list[int], request: DraftRequest) -> Draft:
        start = self.clock()
        tokens, n = self.lookup(context, request.max_tokens)
        draft = lookup_draft(tokens, n, request.keep_going)
        draft.seconds = self.clock() - start
        return draft


def lookup_draft(
    tokens: Sequence[int], evidence: int, keep_going: Callable[[int, float], bool] | None
) -> Draft:
    """A free proposal as a draft: every token certain, up to where ``keep_going`` ends it."""
    kept = len(tokens)
    if keep_going is not None:
        kept = 0
        while kept < len(tokens) and keep_going(kept, 1.0):
            kept += 1
    return Draft(tokens=list(tokens[:kept]), confidences=[1.0] * kept, evidence=evidence)

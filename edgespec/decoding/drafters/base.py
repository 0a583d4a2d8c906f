"""What every drafter shares: the proposal (``Draft``), the request, the ``Drafter``
interface, and the base of the draftless lookup drafters.

The interface is deliberately tiny (as in llama.cpp's common/speculative): ``propose``
gets the committed context and a token budget and returns a ``Draft``. A drafter keeps
whatever state it needs (a KV cache, an n-gram index) and brings it up to date with the
context itself, so the engine never has to tell it what was accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edgespec.decoding.sampling import SamplingParams


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
    match_len: int = 0  # n-gram drafter: length of the matched suffix
    decodes: list[tuple[int, float]] = field(default_factory=list)  # (batch size, seconds) per decode

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
    # Greedy drafting under a grammar: the draft token from a row, with the tokens drafted
    # so far in this step (the highest-scoring one the grammar allows), so that a draft
    # model never spends its draft on a token the target would be refused.
    choose: Callable[[np.ndarray, list[int]], int] | None = None
    # ... and the tokens the grammar forces after the drafted ones (at most the given
    # number), drafted whole where it forces any.
    forced: Callable[[list[int], int], list[int]] | None = None


class Drafter(Protocol):
    name: str
    clock: Callable[[], float]  # what durations are read off (the engine's clock)

    def begin(self, prompt: list[int], prediction: list[int]) -> None:
        """A new generation starts from ``prompt``; ``prediction`` is the answer the
        client expects (OpenAI's Predicted Outputs; empty when none was given)."""
        ...

    def propose(self, context: list[int], request: DraftRequest) -> Draft: ...


class LookupDrafter:
    """A draftless drafter: it copies a continuation out of the context itself, so a
    proposal costs no model call. Subclasses say where to copy from (``lookup``)."""

    name = "lookup"
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(self) -> None:
        self._seen: list[int] = []  # the context of the last lookup
        self.prediction: list[int] = []  # the request's predicted output, a second source
        self.from_prediction = False  # the last proposal copies the predicted output

    def begin(self, prompt: list[int], prediction: list[int]) -> None:
        self.prediction = list(prediction)

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

    def propose(self, context: list[int], request: DraftRequest) -> Draft:
        start = self.clock()
        tokens, n = self.lookup(context, request.max_tokens)
        if request.keep_going is not None:
            kept = 0
            while kept < len(tokens) and request.keep_going(kept, 1.0):
                kept += 1
            tokens = tokens[:kept]
        return Draft(
            tokens=tokens,
            confidences=[1.0] * len(tokens),
            seconds=self.clock() - start,
            match_len=n,
        )

"""The draft model: a small model of the target's vocabulary drafting autoregressively."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import numpy as np

from edgespec.decoding.drafters.base import AnswerSetup, Draft, Drafting, DraftRequest, Proposal
from edgespec.decoding.drafters.grammar import ForcedText, GrammarGuide
from edgespec.decoding.sampling import max_probability, probabilities, sample
from edgespec.decoding.turns import DraftPass, Passed
from edgespec.runtime.model import Model
from edgespec.runtime.tokens import common_prefix

if TYPE_CHECKING:
    from edgespec.decoding.constrained import Constraint

# Tokens per decode of a forced run: the controller reads a draft decode of more than four
# tokens as the draft catching up on the context, not as drafting.
_RUN_CHUNK = 4


class ModelDrafter:
    """A small model of the same vocabulary drafting autoregressively."""

    name = "model"
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(self, model: Model, target: Model):
        self.model = model
        self.forced_text = ForcedText(target)  # where the answer's grammar guides a draft
        # q rows are as wide as the target's vocabulary; ids the draft lacks keep q = 0.
        width = max(target.n_vocab, model.n_vocab)
        self._q = np.zeros((model.options.max_outputs, width), dtype=np.float32)
        self.constraint: Constraint | None = None
        self.cancel = threading.Event()
        self.sequence = model.sequence(0)  # the answer's sequence of the draft model
        self._started = False  # whether this answer has synced the draft's cache yet

    def begin(self, setup: AnswerSetup) -> None:
        # The draft's cache is brought up to date lazily, by sync.
        self._started = False
        self.constraint = setup.constraint
        self.cancel = setup.cancel
        self.clock = setup.clock
        self.sequence = self.model.sequence(setup.sequence)

    def proposal(self, context: list[int], max_tokens: int) -> Proposal:
        return Proposal(self.name)  # a draft costs model calls: it is drafted only when chosen

    def prefill(
        self, context: list[int], most: int | None = None, *, arrival: threading.Event | None = None
    ) -> float:
        """Bring the draft's cache up to ``context`` (all but its last token), by at most
        ``most`` tokens; seconds. ``arrival``: as ``Sequence.decode``'s."""
        start = self.clock()
        reused = self._sync(context)
        end = len(context) - 1 if most is None else min(len(context) - 1, reused + most)
        if end > reused:
            self.sequence.decode(context[reused:end], n_outputs=0, cancel=self.cancel, arrival=arrival)
        return self.clock() - start

    def _sync(self, context: list[int]) -> int:
        """The answer's first sync may bring the draft's state for this prompt in from the
        pair's prompt cache, as the target's does."""
        reused = self.sequence.sync(context, start=not self._started)
        self._started = True
        return reused

    def catch_up_tokens(self, context: list[int]) -> int:
        """How many tokens ``propose`` would decode before its first draft token."""
        return len(context) - common_prefix(self.sequence.tokens, context, limit=len(context) - 1)

    def _guide(self, context: list[int], request: DraftRequest) -> GrammarGuide | None:
        """Greedy drafting under the answer's grammar: each token the best one the grammar
        allows, and forced text drafted whole, so a draft never spends a token the target
        would be refused."""
        if self.constraint is None or not request.params.greedy:
            return None
        return GrammarGuide(self.forced_text, self.constraint, context[-1])

    def propose(self, context: list[int], request: DraftRequest) -> Draft:
        """The draft, each of its decodes run here, alone."""
        steps = self.drafting(context, request)
        passed = None
        try:
            while True:
                asked = steps.send(passed)  # type: ignore[arg-type]  # (None starts it)
                start = self.clock()
                logits = self.sequence.decode(asked.tokens, 1, cancel=self.cancel)
                passed = Passed(logits, self.clock() - start)
        except StopIteration as done:
            return done.value

    def drafting(self, context: list[int], request: DraftRequest) -> Drafting:
        model = self.model
        start = self.clock()
        reused = self._sync(context)
        self.sequence.mark()
        draft = Draft(tokens=[], catch_up=len(context) - reused)
        logits = yield from self._decode(context[reused:], draft)
        greedy = request.params.greedy
        guide = self._guide(context, request)
        while (i := len(draft.tokens)) < request.max_tokens:
            forced = guide.forced(draft.tokens, request.max_tokens - i) if guide is not None else []
            if forced:
                if not self._take_forced(forced, request, draft):
                    break
                logits = yield from self._decode_run(forced, draft)
                continue
            if request.transform is not None:
                logits = request.transform(logits, draft.tokens)
            if greedy:
                token = int(np.argmax(logits)) if guide is None else guide.choose(logits, draft.tokens)
                confidence = max_probability(logits) if request.wants_confidence else 1.0
            else:
                q_row = probabilities(logits, request.params, out=self._q[i, : model.n_vocab])
                token = sample(q_row, request.rng)
                confidence = float(q_row[token])
            if request.keep_going is not None and not request.keep_going(i, confidence):
                break
            draft.tokens.append(token)
            draft.confidences.append(confidence)
            if model.is_eog(token):
                break  # nothing follows the end of the answer: drafting on is wasted work
            if i + 1 < request.max_tokens:
                logits = yield from self._decode([token], draft)
        draft.seconds = self.clock() - start - draft.waited_s
        if not greedy:
            draft.q = self._q[: len(draft.tokens)]
        return draft

    def _take_forced(self, forced: list[int], request: DraftRequest, draft: Draft) -> bool:
        """Draft the tokens a grammar forces (their confidence NaN: they are no guess of the
        draft model's, so its calibration leaves them out); whether drafting goes on after
        them (not past the end of the answer, the budget, or an early stop)."""
        for token in forced:
            if request.keep_going is not None and not request.keep_going(len(draft.tokens), 1.0):
                return False
            draft.tokens.append(token)
            draft.confidences.append(math.nan)
        return not self.model.is_eog(forced[-1]) and len(draft.tokens) < request.max_tokens

    def _decode_run(self, tokens: list[int], draft: Draft) -> Generator[DraftPass, Passed, np.ndarray]:
        """A forced run read in decodes the controller does not take for a catch-up."""
        for start in range(0, len(tokens), _RUN_CHUNK):
            logits = yield from self._decode(tokens[start : start + _RUN_CHUNK], draft)
        return logits

    def _decode(self, tokens: list[int], draft: Draft) -> Generator[DraftPass, Passed, np.ndarray]:
        """The last token's logits row; the decode's seconds are its own share of a
        decode shared with other answers, and the rest of the wait is not the draft's."""
        asked = self.clock()
        passed = yield DraftPass(tokens)
        draft.decodes.append((len(tokens), passed.seconds))
        draft.shared |= passed.shared
        draft.waited_s += self.clock() - asked - passed.seconds
        return passed.logits[0]

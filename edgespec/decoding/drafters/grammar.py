"""Drafting what a grammar decides: where the answer's grammar admits one continuation
(a schema's keys, quotes, colons, commas and braces, the end of the answer), that text is
proposed with certainty, in the target's usual tokenization of it. Between two such runs a
value is often copied from the context (an extraction quotes its source), so the n-gram
lookup's continuation follows a forced run, as far as the grammar allows it, and the next
forced run follows the copied value: one step can draft ``","city":"`` + ``Berlin`` +
``","country":"``.

The proposal is a lookup (it costs no model call, only grammar checks); the target still
verifies every token, so the answer is the target's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgespec.decoding.constrained import best_allowed
from edgespec.decoding.drafters.base import AnswerSetup, LookupDrafter
from edgespec.decoding.drafters.ngram import NgramDrafter
from edgespec.decoding.grammar import eog_token

if TYPE_CHECKING:
    from edgespec.decoding.constrained import Constraint
    from edgespec.decoding.grammar import GrammarState
    from edgespec.runtime.model import Model

_MIN_COPY_MATCH = 3  # tokens the lookup must match for its value to join a proposal
_BYTES_PER_TOKEN = 8
_TOKENIZED_KEPT = 4096  # forced text followed per token of budget (keys run several bytes a token)


class ForcedText:
    """The text a grammar forces, as the target's tokens: shared by the ``grammar``
    drafter's proposals and the draft model's guided drafts."""

    def __init__(self, target: Model):
        self.target = target
        # Forced texts recur (every key, comma and closing brace of a schema): their
        # tokenizations are kept, since the tokenizer costs more than the rest of a lookup.
        self._tokenized: dict[tuple[int, bytes], list[int]] = {}

    def run(self, walker: GrammarState, before: int, room: int) -> list[int] | None:
        """The tokens of the text the grammar forces from ``walker`` (which moves past it),
        and the end of the answer where the grammar must end; None where the target's
        tokenization of the text would not read back as it (then the walker is lost)."""
        text, ends = walker.advance_forced(room * _BYTES_PER_TOKEN)
        tokens = self._tokenize_after(before, text) if text else []
        if b"".join(map(self.target.piece, tokens)) != text:
            return None
        tokens = tokens[:room]
        if ends and len(tokens) < room:
            tokens.append(eog_token(self.target))
        return tokens

    def _tokenize_after(self, before: int, text: bytes) -> list[int]:
        """The target's tokenization of ``text`` where it follows the token ``before``: a
        tokenizer splits punctuation differently at the start of a text than after a
        word or a digit (``,"`` after a number is one token, after nothing two), and
        models write the split they learnt in context."""
        known = self._tokenized.get((before, text))
        if known is not None:
            return known
        if len(self._tokenized) >= _TOKENIZED_KEPT:
            self._tokenized.clear()
        tokens = self._tokenized[(before, text)] = self._tokenize_fresh(before, text)
        return tokens

    def _tokenize_fresh(self, before: int, text: bytes) -> list[int]:
        lead = self.target.piece(before)
        if lead.isascii() and lead.strip():
            joined = self.target.tokenize((lead + text).decode("ascii"), add_special=False)
            if joined and self.target.piece(joined[0]) == lead:
                return joined[1:]
        return self.target.tokenize(text.decode("ascii"), add_special=False)


class GrammarDrafter(LookupDrafter):
    """Forced runs of the answer's grammar, and copied values between them."""

    name = "grammar"

    def __init__(self, target: Model):
        super().__init__()
        self.target = target
        self.constraint: Constraint | None = None  # the answer's grammar (None: no proposal)
        self.copy = NgramDrafter()
        self.forced = ForcedText(target)

    def begin(self, setup: AnswerSetup) -> None:
        super().begin(setup)
        self.constraint = setup.constraint
        self.copy.begin(setup)

    def lookup(self, context: list[int], max_tokens: int) -> tuple[list[int], int]:
        """(proposal, tokens forced at its start): forced runs alternating with copied
        values. The forced count serves as the match length the controller's statistics
        are kept by: a proposal that opens with a long forced run is a sure one."""
        if self.constraint is None or max_tokens <= 0:
            return [], 0
        walker = self.constraint.state.clone()
        tokens: list[int] = []
        opening = -1
        try:
            while len(tokens) < max_tokens:
                before = tokens[-1] if tokens else context[-1]
                forced = self.forced.run(walker, before, max_tokens - len(tokens))
                if forced is None:
                    break
                tokens += forced
                if opening < 0:
                    opening = len(tokens)
                if len(tokens) >= max_tokens or (forced and self.target.is_eog(forced[-1])):
                    break
                copied = self._copied_value(walker, context, tokens, len(forced), max_tokens - len(tokens))
                if not copied:
                    break
                tokens += copied
        finally:
            walker.close()
        return tokens, max(opening, 0)

    def _copied_value(
        self, walker: GrammarState, context: list[int], ahead: list[int], forced: int, room: int
    ) -> list[int]:
        """The n-gram lookup's continuation after ``ahead`` (whose last ``forced`` tokens the
        grammar forced), as far as the grammar allows (``walker`` moves past what is kept)."""
        follow, matched = self.copy.lookup_after(context, ahead, room)
        if matched < max(_MIN_COPY_MATCH, forced + 1):
            # A short match (a digit, a key with its quote and colon: keys recur in an
            # answer, and forced text says nothing about the value after it) predicts no
            # value. One that reaches back past the forced text into the value before it
            # is a record or a phrase being copied. Short copies are left to the lookup
            # drafters, priced on their own.
            return []
        kept = []
        for token in follow:
            if self.target.is_eog(token) or not walker.allows(token):
                break
            walker.accept(token)
            kept.append(token)
        return kept


class GrammarGuide:
    """The answer's grammar guiding one greedy draft of the draft model: each token it
    drafts is the best one the grammar allows, and where the grammar forces text, that
    text is drafted whole (in the target's tokenization, as the ``grammar`` drafter
    proposes it) instead of token by token. So one draft-model step can hold a forced run,
    a value the draft model writes, and the next forced run."""

    def __init__(self, forced: ForcedText, constraint: Constraint, before: int):
        self.forced_text = forced
        self.walker = constraint.state.clone()
        self.before = before  # the last committed token
        self.pushed = 0

    def _catch_up(self, drafted: list[int]) -> None:
        for token in drafted[self.pushed :]:
            self.walker.accept(token)
        self.pushed = len(drafted)

    def choose(self, row: np.ndarray, drafted: list[int]) -> int:
        self._catch_up(drafted)
        return best_allowed(self.walker, row)

    def forced(self, drafted: list[int], room: int) -> list[int]:
        """The tokens the grammar forces after ``drafted`` (at most ``room``; the end of the
        answer where it must end), or none where it leaves a choice."""
        self._catch_up(drafted)
        probe = self.walker.clone()
        try:
            return self.forced_text.run(probe, drafted[-1] if drafted else self.before, room) or []
        finally:
            probe.close()

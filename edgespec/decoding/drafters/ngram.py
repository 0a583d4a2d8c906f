"""Prompt lookup on token n-grams: copy what followed the context's suffix earlier."""

from __future__ import annotations

from edgespec.decoding.drafters.base import AnswerSetup, LookupDrafter


class NgramDrafter(LookupDrafter):
    """Prompt-lookup decoding: find the longest recent repeat of the context's suffix
    (n from ``max_n`` down to ``min_n`` tokens) and propose what followed it.

    Useful where answers repeat their input (code editing, summaries that quote,
    reformatting). An index of every n-gram's most recent continuation is updated
    incrementally as the context grows."""

    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 6):
        super().__init__()
        self.min_n, self.max_n = min_n, max_n
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in the index
        self._prediction_index: dict[tuple[int, ...], int] = {}

    def begin(self, setup: AnswerSetup) -> None:
        """Index the predicted output once: its n-grams are matched like the context's,
        and win ties (the prediction is what the client expects the answer to be)."""
        super().begin(setup)
        prediction = self.prediction
        self._prediction_index = {}
        for end in range(len(prediction) - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self._prediction_index.setdefault(tuple(prediction[end - n + 1 : end + 1]), end + 1)

    def _update(self, context: list[int]) -> None:
        if self._advance(context) is None:
            self._index.clear()
            self._indexed = 0
        # An n-gram ending at position p is indexed once position p+1 exists, so every
        # indexed match has a continuation, and the context's own suffix never matches itself.
        for end in range(self._indexed, len(context) - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self._index[tuple(context[end - n + 1 : end + 1])] = end + 1
        self._indexed = max(self._indexed, len(context) - 1)

    def lookup(self, context: list[int], max_tokens: int) -> tuple[list[int], int]:
        self._update(context)
        return self._follow(context, context, max_tokens)

    def lookup_after(self, context: list[int], ahead: list[int], max_tokens: int) -> tuple[list[int], int]:
        """The lookup for ``context`` followed by tokens not committed yet (``ahead``): the
        index keeps to the committed context, so a proposal that is refused costs it
        nothing."""
        self._update(context)
        return self._follow(context, [*context[-self.max_n :], *ahead], max_tokens)

    def _follow(self, context: list[int], text: list[int], max_tokens: int) -> tuple[list[int], int]:
        """What followed the longest indexed repeat of ``text``'s last tokens, and how long
        the match behind it really is: the index is keyed on at most ``max_n`` tokens, but
        a copy in progress matches its source much further back, and a 40-token match
        holds far more often than a 6-token one."""
        for n in range(min(self.max_n, len(text)), self.min_n - 1, -1):
            suffix = tuple(text[-n:])
            follow = self._prediction_index.get(suffix)
            self.from_prediction = follow is not None
            if follow is not None:
                tokens = self.prediction[follow : follow + max_tokens]
                return tokens, match_length(self.prediction, follow, text, n)
            follow = self._index.get(suffix)
            if follow is not None:
                return context[follow : follow + max_tokens], match_length(context, follow, text, n)
        self.from_prediction = False
        return [], 0


MAX_MATCH = 96  # longer matches are as good as this long: the controller's last length bucket


def match_length(source: list[int], end: int, text: list[int], known: int) -> int:
    """How many tokens of ``text`` up to its end equal those of ``source`` up to ``end``
    (at least ``known``, which the caller matched already), counted up to ``MAX_MATCH``."""
    n = known
    limit = min(MAX_MATCH, end, len(text))
    while n < limit and source[end - n - 1] == text[-n - 1]:
        n += 1
    return n

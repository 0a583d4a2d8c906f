"""Drafters: anything that proposes the next few tokens for the target to verify.

The interface is deliberately tiny (as in llama.cpp's common/speculative): ``propose``
gets the committed context and a token budget and returns a ``Draft``. A drafter keeps
whatever state it needs (a KV cache, an n-gram index) and brings it up to date with the
context itself, so the engine never has to tell it what was accepted.
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edgespec.runtime import Model, common_prefix
from edgespec.sampling import SamplingParams, max_probability, probabilities, sample


@dataclass
class Draft:
    tokens: list[int]
    # Row i is the distribution token i was drawn from (sampling with a model drafter);
    # None when proposals are deterministic (greedy, n-gram): q is then one-hot.
    q: np.ndarray | None = None
    # The drafter's probability for each proposed token (its confidence), for the controller.
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


class Drafter(Protocol):
    name: str

    def propose(self, context: list[int], request: DraftRequest) -> Draft: ...


class ModelDrafter:
    """A small model of the same vocabulary drafting autoregressively."""

    name = "model"

    def __init__(self, model: Model, target_vocab: int | None = None):
        self.model = model
        # q rows are as wide as the target's vocabulary; ids the draft lacks keep q = 0.
        width = max(target_vocab or 0, model.n_vocab)
        self._q = np.zeros((model.options.max_outputs, width), dtype=np.float32)

    def prefill(self, context: list[int]) -> float:
        """Bring the draft's cache up to ``context`` (all but its last token); seconds."""
        start = time.perf_counter()
        reused = self.model.sync(context)
        if len(context) - 1 > reused:
            self.model.decode(context[reused:-1], n_outputs=0)
        return time.perf_counter() - start

    def catch_up_cost_tokens(self, context: list[int]) -> int:
        """How many tokens ``propose`` would decode before its first draft token."""
        return len(context) - common_prefix(self.model.tokens, context, limit=len(context) - 1)

    def propose(self, context: list[int], request: DraftRequest) -> Draft:
        model = self.model
        start = time.perf_counter()
        reused = model.sync(context)
        model.mark()
        draft = Draft(tokens=[], catch_up=len(context) - reused)
        logits = self._decode(context[reused:], draft)
        greedy = request.params.greedy
        for i in range(request.max_tokens):
            if greedy:
                token = int(np.argmax(logits))
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
                logits = self._decode([token], draft)
        draft.seconds = time.perf_counter() - start
        if not greedy:
            draft.q = self._q[: len(draft.tokens)]
        return draft

    def _decode(self, tokens: list[int], draft: Draft) -> np.ndarray:
        start = time.perf_counter()
        logits = self.model.decode(tokens, 1)[0]
        draft.decodes.append((len(tokens), time.perf_counter() - start))
        return logits


class LookupDrafter:
    """A draftless drafter: it copies a continuation out of the context itself, so a
    proposal costs no model call. Subclasses say where to copy from (``lookup``)."""

    name = "lookup"

    def __init__(self) -> None:
        self._seen: list[int] = []  # the context of the last lookup

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
        start = time.perf_counter()
        tokens, n = self.lookup(context, request.max_tokens)
        if request.keep_going is not None:
            kept = 0
            while kept < len(tokens) and request.keep_going(kept, 1.0):
                kept += 1
            tokens = tokens[:kept]
        return Draft(
            tokens=tokens,
            confidences=[1.0] * len(tokens),
            seconds=time.perf_counter() - start,
            match_len=n,
        )


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
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            follow = self._index.get(tuple(context[-n:]))
            if follow is not None:
                return context[follow : follow + max_tokens], n
        return [], 0


_WHITESPACE = re.compile(r"\s+")
_BOUNDARY = "\x00"  # stands for a control token (<|im_start|> …): never copied, never crossed
_CHARS_PER_TOKEN = 4  # rough length of a token in characters, to express a match in tokens


class ReflowDrafter(LookupDrafter):
    """Prompt lookup on the text, blind to line wrapping.

    Answers that quote a hard-wrapped text (a summary of release notes, an e-mail, a
    README) re-flow it: where the source breaks a line the answer writes a space. The
    token n-gram drafter loses such a copy at every line break and needs a few tokens to
    find it again, because the word after a newline and the word after a space are
    different tokens. This drafter compares text with every whitespace run read as one
    space: it finds the most recent earlier occurrence of the longest suffix of the
    context (``min_chars`` to ``max_chars`` characters) and proposes the text that followed
    it, whitespace collapsed likewise, tokenized by the model's own tokenizer.

    Where an answer keeps the source's line breaks (code), this drafter is wrong at each
    of them; the controller scores both lookup drafters at every step and uses the one
    that is right for the text at hand."""

    name = "reflow"

    def __init__(self, model: Model, min_chars: int = 8, max_chars: int = 96):
        super().__init__()
        self.model = model
        self.min_chars, self.max_chars = min_chars, max_chars
        self._text = ""  # the context as text, whitespace runs collapsed to one space
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._cached: tuple[int, int, tuple[list[int], int]] | None = None

    def _update(self, context: list[int]) -> None:
        new = self._advance(context)
        if new is None:
            self._text = ""
            self._decoder.reset()
            new = context
        if not new:
            return
        parts = []
        for token in new:
            if self.model.is_control(token):
                parts.append(self._decoder.decode(b"", final=True) + _BOUNDARY)
                self._decoder.reset()
            else:
                parts.append(self._decoder.decode(self.model.piece(token)))
        chunk = _WHITESPACE.sub(" ", "".join(parts))
        if chunk.startswith(" ") and self._text.endswith(" "):
            chunk = chunk[1:]
        self._text += chunk
        self._cached = None

    def _longest_earlier_suffix(self) -> tuple[int, int]:
        """(length, end) of the longest suffix of the text that also ends earlier, at
        ``end`` (its most recent earlier occurrence); (0, 0) when none is long enough.
        If a suffix occurs earlier, so does every shorter one: a binary search over the
        length needs a handful of substring searches."""
        text = self._text
        lo, hi = self.min_chars, min(self.max_chars, len(text) - 1)
        found = (0, 0)
        while lo <= hi:
            length = (lo + hi) // 2
            start = text.rfind(text[-length:], 0, len(text) - 1)
            if start >= 0:
                found = (length, start + length)
                lo = length + 1
            else:
                hi = length - 1
        return found

    def lookup(self, context: list[int], max_tokens: int) -> tuple[list[int], int]:
        self._update(context)
        # The controller prices a proposal, then the engine asks for it: compute it once.
        if self._cached is not None and self._cached[:2] == (len(context), max_tokens):
            return self._cached[2]
        length, end = self._longest_earlier_suffix()
        result: tuple[list[int], int] = ([], 0)
        if length:
            budget = (max_tokens + 2) * 2 * _CHARS_PER_TOKEN
            continuation = self._text[end : end + budget]
            cut = continuation.find(_BOUNDARY)
            complete = cut >= 0 or end + budget >= len(self._text)
            if cut >= 0:
                continuation = continuation[:cut]
            tokens = self.model.tokenize(continuation, add_special=False) if continuation else []
            if not complete:
                tokens = tokens[:-1]  # the text was cut mid-way: its last token may be a fragment
            if tokens:
                result = (tokens[:max_tokens], max(1, length // _CHARS_PER_TOKEN))
        self._cached = (len(context), max_tokens, result)
        return result

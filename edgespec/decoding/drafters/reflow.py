"""Prompt lookup on the text, blind to line wrapping."""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from edgespec.decoding.drafters.base import LookupDrafter
from edgespec.runtime.model import Model

_WHITESPACE = re.compile(r"\s+")
_BOUNDARY = "\x00"  # stands for a control token (<|im_start|> …): never copied, never crossed
_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))  # UTF-8 bytes that continue a character
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
        # The last continuation tokenized: while a copy holds, the next step's match ends
        # at a token boundary inside it, and its remaining tokens are the new proposal.
        # Tokenizing ~500 characters costs ~0.4 ms, a step's whole Python budget on a GPU.
        self._run: _Tokenized | None = None

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
        if new is context:
            self._run = None  # a new text: its offsets mean nothing in the old one

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
            tokens = self._continuation(end, max_tokens)
            if tokens:
                result = (tokens[:max_tokens], max(1, length // _CHARS_PER_TOKEN))
        self._cached = (len(context), max_tokens, result)
        return result

    def _continuation(self, end: int, max_tokens: int) -> list[int]:
        """The tokens of the text after ``end`` (at least ``max_tokens`` of them where the
        text goes on), up to a control token, reusing the last tokenization when ``end``
        is one of its token boundaries."""
        run = self._run
        if run is not None:
            i = run.index_at.get(end)
            if i is not None and (run.complete or len(run.tokens) - i >= max_tokens):
                return run.tokens[i:]
        budget = (max_tokens + 2) * 2 * _CHARS_PER_TOKEN
        continuation = self._text[end : end + budget]
        cut = continuation.find(_BOUNDARY)
        complete = cut >= 0 or end + budget >= len(self._text)
        if cut >= 0:
            continuation = continuation[:cut]
        tokens = self.model.tokenize(continuation, add_special=False) if continuation else []
        if not complete:
            tokens = tokens[:-1]  # the text was cut mid-way: its last token may be a fragment
        # Reused later only if it ended at a control token: one that ran to the end of the
        # text would now stop short of what the text has grown by since.
        self._run = _Tokenized.of(tokens, continuation, end, cut >= 0, self.model)
        return tokens


@dataclass
class _Tokenized:
    """A tokenized stretch of the text: its tokens, and the text offset each token starts
    at (only where the tokens spell the text back exactly and start on a character)."""

    tokens: list[int]
    index_at: dict[int, int]  # text offset -> index of the token that starts there
    complete: bool  # the stretch runs to a control token: there are no more tokens

    @classmethod
    def of(cls, tokens: list[int], text: str, start: int, complete: bool, model: Model) -> _Tokenized | None:
        data = text.encode("utf-8")
        index_at: dict[int, int] = {}
        offset = chars = 0
        for i, token in enumerate(tokens):
            piece = model.piece(token)
            if not data.startswith(piece, offset):
                return None  # a tokenizer that adds or alters text: nothing to reuse
            if (data[offset] & 0xC0) != 0x80:  # not inside a multi-byte character
                index_at[start + chars] = i
            offset += len(piece)
            chars += len(piece.translate(None, _CONTINUATION_BYTES))  # characters that start here
        return cls(tokens, index_at, complete)

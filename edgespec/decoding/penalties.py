"""Penalties and biases on the target's logits, per position, with that position's own
history: the transforms of llama.cpp's penalties sampler and OpenAI's ``logit_bias``.

Speculative decoding verifies γ+1 positions in one pass; the token at position i follows
the committed context *and the drafts before it*. So each row is transformed with its own
history (the window of the last ``repeat_last_n`` tokens ending just before it), exactly as
target-only decoding would transform it when it gets there: greedy output stays identical
and sampling stays exact. The draft model's rows are transformed alike (with its own
drafts as history), which keeps its proposals close to what the target will accept.

The formula is llama.cpp's (``llama-server``'s ``repeat_penalty``, ``repeat_last_n``,
``frequency_penalty``, ``presence_penalty``), over the same window of the context (prompt
and answer): for a token seen ``c`` > 0 times in the window, its logit ``l`` becomes
``l / repeat`` (``l * repeat`` where ``l`` ≤ 0), minus ``c × frequency`` and ``presence``.
``logit_bias`` is added first (OpenAI: -100 bans a token, +100 all but forces it).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from edgespec.errors import RequestError

DEFAULT_LAST_N = 64  # llama.cpp's default window


@dataclass(frozen=True)
class Penalties:
    presence: float = 0.0  # OpenAI presence_penalty, in [-2, 2]
    frequency: float = 0.0  # OpenAI frequency_penalty, in [-2, 2]
    repeat: float = 1.0  # llama.cpp repeat_penalty (1: off)
    last_n: int = DEFAULT_LAST_N  # llama.cpp repeat_last_n: tokens of history (-1: all, 0: none)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)

    @property
    def penalizes(self) -> bool:
        return self.last_n != 0 and (self.presence != 0 or self.frequency != 0 or self.repeat != 1)

    @property
    def active(self) -> bool:
        return self.penalizes or bool(self.logit_bias)

    def validate(self) -> None:
        """Raise RequestError (one line, naming the OpenAI field) for a value out of range.
        The token ids of ``logit_bias`` are checked by ``check_tokens``, which needs the
        loaded target's vocabulary."""
        for name, value in (("presence_penalty", self.presence), ("frequency_penalty", self.frequency)):
            if not _finite(value) or not -2.0 <= value <= 2.0:
                raise RequestError(f"{name} must be a number in [-2, 2] (got {value!r})", name)
        if not _finite(self.repeat) or self.repeat <= 0:
            raise RequestError(
                f"repeat_penalty must be a positive number (got {self.repeat!r})", "repeat_penalty"
            )
        if isinstance(self.last_n, bool) or not isinstance(self.last_n, int) or self.last_n < -1:
            raise RequestError(
                f"repeat_last_n must be an integer >= -1 (got {self.last_n!r})", "repeat_last_n"
            )
        for _, bias in self.logit_bias:
            if not _finite(bias) or not -100.0 <= bias <= 100.0:
                raise RequestError(
                    f"logit_bias values must be numbers in [-100, 100] (got {bias!r})", "logit_bias"
                )

    def check_tokens(self, n_vocab: int) -> None:
        """Raise RequestError unless every ``logit_bias`` key is a token id of a vocabulary
        of ``n_vocab`` tokens: an id past it would bias nothing, silently."""
        for token, _ in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise RequestError(
                    f"logit_bias keys must be token ids from 0 to {n_vocab - 1} (got {token!r})", "logit_bias"
                )
            if token >= n_vocab:
                raise RequestError(
                    f"logit_bias names token {token}, outside the vocabulary of {n_vocab} tokens "
                    f"(ids 0 to {n_vocab - 1})",
                    "logit_bias",
                )


def _finite(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)  # (an int too big for a float is finite)


class Window:
    """Counts of the tokens in the last ``last_n`` tokens of a history, moved one token at
    a time (so k rows of a verification cost k small updates, not k recounts)."""

    def __init__(self, history: list[int], last_n: int):
        self.last_n = last_n
        self.tokens = list(history if last_n < 0 else history[-last_n:] if last_n else [])
        self.counts = Counter(self.tokens)
        self._start = 0  # tokens[_start:] is the window

    def push(self, token: int) -> None:
        if self.last_n == 0:
            return
        self.tokens.append(token)
        self.counts[token] += 1
        if 0 < self.last_n < len(self.tokens) - self._start:
            gone = self.tokens[self._start]
            self._start += 1
            self.counts[gone] -= 1
            if not self.counts[gone]:
                del self.counts[gone]


def transform_row(row: np.ndarray, penalties: Penalties, counts: Counter) -> np.ndarray:
    """One row of logits with the bias and the penalties of the window ``counts`` applied
    (a new float32 array: ``row`` may be a read-only view of llama.cpp's buffer)."""
    out = np.array(row, dtype=np.float32, copy=True)
    for token, bias in penalties.logit_bias:
        # The builder checked the ids against the target's vocabulary; a compatible draft's
        # may be a little shorter, and an id past its end is one it never proposes.
        if token < out.shape[0]:
            out[token] += bias
    if penalties.penalizes and counts:
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        keep = ids < out.shape[0]  # (the draft's shorter vocabulary again)
        ids = ids[keep]
        seen = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))[keep]
        logits = out[ids]
        if penalties.repeat != 1.0:
            logits = np.where(logits <= 0, logits * penalties.repeat, logits / penalties.repeat)
        logits = logits - seen * np.float32(penalties.frequency) - np.float32(penalties.presence)
        out[ids] = logits
    return out


def transform_rows(
    logits: np.ndarray, penalties: Penalties, history: list[int], drafts: list[int]
) -> np.ndarray:
    """Rows 0..k-1 of a verification: row i follows ``history`` plus ``drafts[:i]``."""
    window = Window(history, penalties.last_n)
    rows = np.empty(logits.shape, dtype=np.float32)
    for i in range(logits.shape[0]):
        if i:
            window.push(drafts[i - 1])
        rows[i] = transform_row(logits[i], penalties, window.counts)
    return rows

"""One sequence of a model's context: the tokens it holds (position i holds token i) and
its rollback mark. Every call passes its own sequence id to the model, which keeps no
current one: answers running at once each hold a ``Sequence`` of their own
(``Model.sequence(seq)``), and nothing one does can land in another's.

A sequence can

* decode a batch of tokens appended at its end, asking for logits only for the last
  ``n_outputs`` of them (one row for a prefill or a draft step, γ+1 rows to verify), a
  long one stopped by its answer's cancel token, a batch of a prompt by an arrival;
* roll back to its first n tokens, by truncation (``llama_memory_seq_rm``) or, where a
  model's memory cannot drop part of a sequence (recurrent and hybrid models), by
  restoring a snapshot taken with ``mark()`` and re-decoding what follows;
* save and load its state (the prompt cache's exchange at an answer's first ``sync``).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.runtime.tokens import common_prefix


@dataclass
class Snapshot:
    """The saved state of a sequence when it held ``n_tokens`` tokens."""

    n_tokens: int
    data: ctypes.Array


class PromptExchange(Protocol):
    """What a sequence asks of the pair's prompt cache (``runtime.prompt_cache``) as an
    answer starts."""

    def exchange(self, sequence: Sequence, wanted: list[int], common: int) -> int: ...

    def held(self, model: Host, tokens: list[int]) -> int: ...


class Host(Protocol):
    """What a sequence uses of its model (``runtime.model.Model``): llama.cpp's calls,
    each given the sequence it works on."""

    name: str
    n_ctx: int
    n_vocab: int
    rollback: str
    prefill_chunk: int
    max_outputs: int
    prompt_cache: PromptExchange | None

    def decode_chunk(
        self,
        seq: int,
        pos0: int,
        chunk: list[int],
        first_output: int,
        cancel: threading.Event | None,
        arrival: threading.Event | None,
    ) -> int: ...

    def last_error(self) -> str: ...

    def synchronize(self) -> None: ...

    def logits(self, rows: int) -> np.ndarray: ...

    def remove(self, seq: int, start: int) -> bool: ...

    def save_state(self, seq: int) -> ctypes.Array: ...

    def set_state(self, seq: int, data: ctypes.Array) -> bool: ...

    def span(self, seq: int) -> tuple[int, int]: ...


class Sequence:
    """Sequence ``seq`` of ``model``'s context, and the tokens it holds."""

    def __init__(self, model: Host, seq: int):
        self.model = model
        self.seq = seq
        self.tokens: list[int] = []
        self._snapshot: Snapshot | None = None

    # -- decoding -----------------------------------------------------------------------

    def decode(
        self,
        tokens: list[int],
        n_outputs: int = 1,
        *,
        cancel: threading.Event | None = None,
        arrival: threading.Event | None = None,
    ) -> np.ndarray:
        """Append ``tokens`` and return logits for the last ``n_outputs`` positions as a
        (n_outputs, n_vocab) float32 view into llama.cpp's buffer. ``cancel``: the
        answer's token, which stops a long decode (``DecodeAborted``). ``arrival``, for a
        batch of a prompt (no outputs, one batch): it stops, ``DecodeYielded``, with
        nothing appended, once another answer arrives.

        The view is valid until the next decode; copy what must outlive it."""
        model = self.model
        if not tokens:
            raise ValueError("decode needs at least one token")
        if not 0 <= n_outputs <= min(len(tokens), model.max_outputs):
            raise ValueError(f"n_outputs={n_outputs} outside 0..{min(len(tokens), model.max_outputs)}")
        if (total := len(self.tokens) + len(tokens)) > model.n_ctx:
            raise EdgespecError(f"context full: {total} tokens > n_ctx {model.n_ctx}")
        if n_outputs or len(tokens) > model.prefill_chunk:
            # Only one batch of a prompt yields: what of it was decoded is lost, a little of
            # a long prompt's reading, against a whole batch added to a short question's
            # first token.
            arrival = None
        first_output = len(tokens) - n_outputs
        for start in range(0, len(tokens), model.prefill_chunk):
            chunk = tokens[start : start + model.prefill_chunk]
            status = model.decode_chunk(
                self.seq, len(self.tokens), chunk, first_output - start, cancel, arrival
            )
            if status != 0:
                self._failed(status, cancel)
            self.tokens.extend(chunk)
        if n_outputs == 0:
            # Reading logits waits for the backend; nothing is read here, and a GPU backend
            # returns while its work is still queued. That work would then be billed to the
            # next decode, and whatever times that decode (the cost profile) would price it
            # far above what it costs in a step.
            model.synchronize()
            return np.empty((0, model.n_vocab), dtype=np.float32)
        return model.logits(n_outputs)

    def _failed(self, status: int, cancel: threading.Event | None) -> None:
        """A fatal or aborted decode may leave part of its batch in memory: cut back to
        what the sequence is known to hold, and say why it stopped."""
        if not self.model.remove(self.seq, len(self.tokens)):
            self.reset()
        if status == 2:
            raise DecodeAborted() if cancel is not None and cancel.is_set() else DecodeYielded()
        raise EdgespecError(f"llama.cpp decode failed (status {status}): {self.model.last_error()}")

    # -- rollback -----------------------------------------------------------------------

    def mark(self) -> None:
        """Remember the current state so that ``keep`` can return to it in snapshot mode.
        Only needed (and only costs anything) when rollback == "snapshot"."""
        if self.model.rollback == "snapshot":
            self._snapshot = self.snapshot()

    def keep(self, n: int) -> None:
        """Roll back to the first ``n`` tokens."""
        if n >= len(self.tokens):
            return
        if self.model.rollback == "truncate":
            self.truncate(n)
            return
        snap = self._snapshot
        if snap is None or snap.n_tokens > n:
            # No snapshot at or before n: start over and re-decode the prefix.
            replay = self.tokens[:n]
            self.reset()
        else:
            replay = self.tokens[snap.n_tokens : n]
            self.restore(snap)
        if replay:
            self.decode(replay, n_outputs=0)

    def truncate(self, n: int) -> None:
        """Drop every position >= n from the KV cache."""
        if not self.model.remove(self.seq, n):
            raise EdgespecError(
                f"{self.model.name}: llama.cpp cannot remove part of this model's sequence; "
                "use --rollback snapshot"
            )
        del self.tokens[n:]

    def snapshot(self) -> Snapshot:
        return Snapshot(n_tokens=len(self.tokens), data=self.model.save_state(self.seq))

    def restore(self, snap: Snapshot) -> None:
        self.model.remove(self.seq, -1)
        if snap.n_tokens and not self.model.set_state(self.seq, snap.data):
            self.tokens = []
            raise EdgespecError(f"{self.model.name}: restoring the sequence state failed")
        self.tokens = self.tokens[: snap.n_tokens]
        self._snapshot = snap

    def load_state(self, tokens: list[int], data: ctypes.Array) -> None:
        """Hold ``tokens`` from state bytes saved by ``snapshot`` (on this model, with these
        context settings: the prompt cache checks that)."""
        self.reset()
        if not self.model.set_state(self.seq, data):
            raise EdgespecError(f"{self.model.name}: restoring a cached state failed")
        self.tokens = list(tokens)

    def reset(self) -> None:
        """Empty the sequence (removing a whole sequence never fails)."""
        self.model.remove(self.seq, -1)
        self.tokens, self._snapshot = [], None

    def forget(self) -> None:
        """What the sequence remembers, once llama.cpp's whole memory was cleared."""
        self.tokens, self._snapshot = [], None

    def cache_span(self) -> tuple[int, int]:
        """(first, last) position llama.cpp holds for the sequence, (-1, -1) if empty: for tests."""
        return self.model.span(self.seq)

    def sync(self, tokens: list[int], *, start: bool = False, most: int | None = None) -> int:
        """Make the cache hold the longest prefix of ``tokens`` it can without decoding, less
        at least one token (whose logits are needed); returns how many tokens are reused.

        ``start``: the first sync of an answer (its prompt), where the pair's prompt cache
        may keep what the sequence holds and bring in a stored state sharing more of it.
        ``most``: reuse no more than this many tokens (a baseline that must pay the prefill
        the answer it is compared with paid)."""
        limit = len(tokens) - 1 if most is None else min(len(tokens) - 1, most)
        common = common_prefix(self.tokens, tokens, limit=limit)
        cache = self.model.prompt_cache
        if start and cache is not None and self.model.rollback == "truncate" and most is None:
            common = cache.exchange(self, tokens[:limit], common)
        self.keep(common)
        return common


class DecodeAborted(Exception):
    """A decode stopped because the answer it decoded for was stopped (its ``cancel``)."""


class DecodeYielded(Exception):
    """A batch of a prompt stopped, nothing of it kept, because another answer arrived (its
    ``arrival``); decoded again, it gives the same state."""

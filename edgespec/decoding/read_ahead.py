"""Reading ahead: the beginning of a prompt still being written read into the pair's cache
before it is asked, below every answer. The chat app reads the conversation and the files
attached to the message being typed while the question is typed; Enter then reads only
what is left and the question.

A ``ReadAhead`` is background work of the pair's loop (``turns.Background``), an answer
that only prefills and never takes a slot an answer wants. Whenever no answer runs or
waits, the loop lends it a slot (the one holding most of its tokens, as an answer would be
given) and a fresh ``_Reading`` reads what is left, a batch a turn: the target's first,
then the draft model's. An answer's arrival stops the batch in progress (``DecodeYielded``,
as it stops a long prompt's), and the loop takes the slot back before it seats the answer:
an answer whose prompt extends the tokens is seated there (the longest prefix) and reads
only the rest; any other gets a slot by the same rule, what was read going to the prompt
cache as any conversation's state does. The reading goes on once the pair is idle again.

It reads whole batches only, from where the sequence's tokens stop matching: the rest, less
than a batch, is read with the question. llama.cpp's numbers depend on how a prompt is cut
into batches (on a CPU a greedy answer changed when its prompt's batches were cut
elsewhere), and an answer reads its prompt in whole batches from where its sequence stops
matching; so a prompt read ahead holds the very states it would have held read by the
answer alone, and the answer is the same, token for token.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from edgespec.decoding.runner import PAUSE, Pause, Runner, Steps
from edgespec.decoding.slots import Cancel
from edgespec.runtime.model import Model
from edgespec.runtime.sequence import DecodeAborted, DecodeYielded, Sequence
from edgespec.runtime.tokens import common_prefix

__all__ = ["ReadAhead"]


class ReadAhead:
    """The tokens of a prompt's beginning, read into the cache below every answer: how far
    it has read (``progress``), whether it has read them all (``done``), its ``stop`` from
    any thread (what was read stays as cache) and ``wait`` for its end. Made and run by
    ``EdgeSpec.read_ahead``."""

    def __init__(
        self,
        tokens: list[int],
        target: Model,
        draft: Model | None,
        arrival: threading.Event,
        *,
        owner: str | None = None,
        cached: int = 0,
    ):
        self.tokens = tuple(tokens)
        self.owner = owner
        self.cancel = Cancel()
        # The target first: an answer's first token waits for it, not for the draft model.
        self.models: tuple[Model, ...] = (target,) if draft is None else (target, draft)
        self.arrival = arrival  # the pair's loop's: set while an answer waits for its round
        # (What the target holds of the tokens, what it will hold once done), as last known.
        read = min(cached, len(self.tokens))
        self._progress = (read, reach(read, len(self.tokens), target.prefill_chunk))
        self._complete = False
        self._ended = threading.Event()
        self.error: BaseException | None = None  # what ended it, when something failed

    # -- what front ends ask ---------------------------------------------------------------

    def progress(self) -> tuple[int, int]:
        """(tokens of ``tokens`` the target holds, counting those held before it began;
        those it will hold once done: all but the last part of a batch, which is read with
        the question)."""
        return self._progress

    @property
    def done(self) -> bool:
        """Everything it reads read, by both models."""
        return self._complete

    @property
    def stopped(self) -> bool:
        return self.cancel.is_set() and not self._complete

    def stop(self) -> None:
        """Stop reading, from any thread: a batch being read stops at once, what was read
        before it stays in the cache."""
        self.cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it has ended (all read, stopped, or failed); whether it has."""
        return self._ended.wait(timeout)

    # -- the loop's side ---------------------------------------------------------------------

    def lease(self) -> Runner | None:
        """A runner for what is left, for a slot the loop lends it; None once it has ended."""
        if self._complete or self.cancel.is_set():
            self.end()
            return None
        return _Reading(self)

    def end(self, error: BaseException | None = None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self._ended.set()

    def _note(self, model: Model, held: int, goal: int) -> None:
        if model is self.models[0]:
            self._progress = (held, goal)

    def _finished(self) -> None:
        self._complete = True


class _Reading(Runner):
    """One lease of a read-ahead: its tokens read into the slot it was lent, a batch per
    turn, until all are read, it is stopped, or the loop takes the slot back (then it is
    dropped between two turns, and the next lease starts from what the slot holds)."""

    def __init__(self, work: ReadAhead):
        super().__init__(work.tokens, work.cancel)
        self.owner = work.owner
        self.work = work
        self.deliver = self._handed

    def steps(self) -> Steps:
        return self._read()  # type: ignore[return-value]  # (pauses only)

    def _handed(self, items: list[object]) -> None:
        """Its last items (it sends no events): an error it met, then ``END`` (the loop
        ends the work once it has handed them over)."""
        error = next((item for item in items if isinstance(item, BaseException)), None)
        if error is not None and self.work.error is None:
            self.work.error = error

    def _read(self) -> Iterator[Pause]:
        work, tokens = self.work, list(self.work.tokens)
        for model in work.models:
            sequence = model.sequence(self.sequence)
            held = hold(sequence, tokens)
            chunk = model.prefill_chunk
            goal = reach(held, len(tokens), chunk)
            work._note(model, held, goal)
            while held < goal:
                if self.cancel.is_set():
                    return
                end = held + chunk
                try:
                    sequence.decode(tokens[held:end], 0, cancel=self.cancel, arrival=work.arrival)
                except DecodeYielded:
                    # An answer arrived: the turn ends, and the loop takes the slot back
                    # before it seats the answer; the batch is read again when the reading
                    # goes on (at once, if that answer was stopped before its round).
                    yield PAUSE
                    continue
                except DecodeAborted:
                    return  # stopped: what the earlier batches read stays
                held = end
                work._note(model, held, goal)
                yield PAUSE
        work._finished()


def hold(sequence: Sequence, tokens: list[int]) -> int:
    """How many of ``tokens`` ``sequence`` holds once ready to read the rest. All of them
    when it holds them already, and whatever follows (an answer given since) stays; else
    its first sync, as an answer's: the prompt cache keeps what it would lose and brings in
    a stored state sharing more."""
    if common_prefix(sequence.tokens, tokens) == len(tokens):
        return len(tokens)
    # The tokens are a prompt's beginning, all of which may be held: the sync is asked for
    # a token more, a stand-in for the prompt's next one, which a sync always leaves unread.
    return sequence.sync([*tokens, 0], start=True)


def reach(held: int, total: int, chunk: int) -> int:
    """How far whole batches of ``chunk`` tokens from ``held`` go into ``total`` tokens."""
    return total if held >= total else held + (total - held) // chunk * chunk

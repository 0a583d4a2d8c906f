"""One answer as the pair's loop drives it (``decoding.turns``): the steps it yields (its
events, the pauses between batches of its prompt, and the passes it asks the loop for),
the slot it was given, and where its events go.

A ``Generation`` is a ``Runner``: the answer has one object from the API to the loop.
Its events go to whoever reads it: by default a queue a reading thread drains
(``read``); the server hands in ``deliver`` when it submits the answer, which puts them
on its event loop, so no thread waits between the engine and a client.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import numpy as np

from edgespec.decoding.slots import Cancel


class Pause:
    """Between two batches of a long prompt: the answer's turn ends, no event is sent."""


PAUSE = Pause()


@dataclass(frozen=True)
class Pass:
    """A target pass an answer asks for: ``tokens`` appended to its sequence, a logits
    row for each."""

    tokens: list[int]


@dataclass(frozen=True)
class DraftPass:
    """A draft-model decode an answer asks for as it drafts: ``tokens`` appended to its
    sequence of the draft model, a logits row for the last one."""

    tokens: list[int]


@dataclass(frozen=True)
class Passed:
    """What a pass gave: its logits rows and its share of the decode's seconds (by what
    it would cost alone); ``others`` and ``others_tokens``: the other answers' passes in
    the same decode, and their tokens (what the answer's next pass is likely to share)."""

    logits: np.ndarray
    seconds: float
    others: int = 0
    others_tokens: int = 0

    @property
    def shared(self) -> bool:
        return self.others > 0


END = object()  # the last item an answer hands over
Steps = Generator[object, Passed | BaseException | None, None]  # events, pauses and passes
Deliver = Callable[[list[object]], None]


class Runner:
    """An answer's steps, driven a turn at a time. Subclasses give ``steps()``."""

    def __init__(
        self,
        prompt: tuple[int, ...],
        cancel: Cancel,
        owner: str | None = None,
        deliver: Deliver | None = None,
    ):
        self.prompt = prompt
        self.cancel = cancel
        self.owner = owner  # which front end's (an app tab, a connection): its stop ends only its own
        self.sequence = 0  # the slot the table gave it
        self.finished = False
        self.told = False  # its last turn handed events (a token) to its reader
        self._steps: Steps | None = None
        self._last: list[object] = []  # the final events, handed over once its slot is free
        self.inbox: queue.SimpleQueue[list[object]] = queue.SimpleQueue()
        self.ended = threading.Event()  # set with the last events: a paced reader wakes for them
        # Where its events go, given once, where the answer is made: a server's event loop,
        # or (by default) the inbox a reading thread drains.
        self.deliver: Deliver = deliver if deliver is not None else self.inbox.put

    def steps(self) -> Steps:
        raise NotImplementedError

    @property
    def stopping(self) -> bool:
        """Stopped, and not yet ended: it is advanced at once, to end."""
        return self.cancel.is_set()

    def advance(self, result: Passed | BaseException | None) -> Pass | DraftPass | None:
        """Go on (with the last pass's result, or its error) to the next pass asked for;
        None when the turn ended without one (a batch of the prompt, or the end)."""
        if self._steps is None:
            self._steps = self.steps()
        # A turn's events are handed over together: each hand-over wakes the reading
        # thread, which then runs beside the next decode and slows it.
        events: list[object] = []
        try:
            steps = self._steps
            item = steps.throw(result) if isinstance(result, BaseException) else steps.send(result)
            while not isinstance(item, Pass | DraftPass | Pause):
                events.append(item)
                item = next(steps)
        except StopIteration:
            self._finish(events)
            return None
        except Exception as error:  # the reader raises it
            self._finish([*events, error])
            return None
        self.told = bool(events)
        if events:
            self.deliver(events)
        return None if isinstance(item, Pause) else item

    def fail(self, error: BaseException) -> None:
        """End the answer with ``error`` (the engine closed under it)."""
        self._finish([error])

    def _finish(self, events: list[object]) -> None:
        self.finished = True
        self._last = [*events, END]

    def hand_over(self) -> None:
        """The final events, once the loop has given its slot back: a client that asks
        again the moment it has its answer finds the slot free."""
        last, self._last = self._last, []
        if last:
            self.deliver(last)
            self.ended.set()

    def take(self, wait: bool = True) -> list[object]:
        """Every event handed over and not yet taken, waiting for the next if none is
        (``wait``)."""
        items: list[object] = []
        if wait:
            items.extend(self.inbox.get())
        while not self.inbox.empty():
            items.extend(self.inbox.get())
        return items


def read(runner: Runner, every_s: float = 0.0) -> Iterator[object]:
    """The events of a runner the engine thread drives, as they come, or with ``every_s``
    at most that often after the first (the last at once). A reader that leaves stops
    the answer and waits the step or two its end takes: its slot is leased until then."""
    ended = False
    try:
        while not ended:
            items = runner.take()
            # Known before anything is handed on: a reader that leaves at the last event
            # (a Done taken with the END behind it) must not wait for an END already taken.
            ended = any(item is END or isinstance(item, BaseException) for item in items)
            for item in items:
                if isinstance(item, BaseException):
                    raise item
                if item is not END:
                    yield item
            if every_s > 0 and not ended:
                # Each hand-over wakes this thread beside a decode; a reader that shows the
                # answer a few times a second needs no more wakes than that.
                runner.ended.wait(every_s)
    finally:
        if not ended:
            runner.cancel.set()
            while END not in runner.inbox.get():
                pass

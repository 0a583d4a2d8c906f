"""Several answers on one pair at once: each leases a sequence of the models' contexts (a
*slot*) for its whole life.

``Slots`` hands out the sequences. A new answer gets the free one whose tokens share the
longest prefix with its prompt (a conversation that comes back finds its own history
still there), counting what the prompt cache holds as held by any; among those alike the
one that throws away least, then the one idle longest; with none free it waits, in
arrival order, on a condition every change notifies: a slot given back, and a waiting
answer's stop (its ``Cancel`` token wakes the slots as it is set).
Holding every slot (``exclusive``) is how the cost profile is measured and the pair is
closed without an answer in between. How the answers in slots share the pair, step by
step, is ``decoding.turns``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from edgespec.runtime.tokens import common_prefix


class Cancel(threading.Event):
    """An answer's stop: set once, from any thread. Setting it also runs the callbacks
    watching it, so whoever waits for the answer's sake (a slot) wakes at once."""

    def __init__(self) -> None:
        super().__init__()
        self._watchers: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        for watcher in list(self._watchers):
            watcher()

    def watch(self, callback: Callable[[], None]) -> None:
        self._watchers.append(callback)

    def unwatch(self, callback: Callable[[], None]) -> None:
        self._watchers.remove(callback)


class Slots:
    """The sequences of a pair's contexts, one per answer running at once."""

    def __init__(
        self,
        count: int,
        held: Callable[[int], list[int]],
        stored: Callable[[list[int]], int] = lambda _prompt: 0,
    ):
        """``count`` sequences; ``held(seq)``: the tokens sequence ``seq`` holds now;
        ``stored(prompt)``: how much of a prompt the prompt cache could bring into any."""
        self.count = count
        self._held = held
        self._stored = stored
        self._cond = threading.Condition()
        self._free = set(range(self.count))
        self._last_used = dict.fromkeys(range(self.count), 0)
        self._tick = itertools.count(1)
        self._queue = itertools.count()  # arrival numbers: the longest waiting goes first
        self._waiting: list[int] = []
        self._exclusive = False
        self.lock = ExclusiveLock(self)

    def cached(self, prompt: list[int]) -> int:
        """How many of ``prompt``'s first tokens some sequence or the prompt cache holds:
        what an answer to it would not read again."""
        held = max((common_prefix(self._held(seq), prompt) for seq in range(self.count)), default=0)
        return max(held, self._stored(prompt))

    @property
    def busy(self) -> int:
        return self.count - len(self._free)

    @contextmanager
    def lease(self, prompt: tuple[int, ...] | list[int], cancel: Cancel) -> Iterator[int | None]:
        """A sequence for one answer while the block runs; None when ``cancel`` was set
        while it waited for one (it then runs nothing)."""
        seq = self._take(list(prompt), cancel)
        try:
            yield seq
        finally:
            if seq is not None:
                self._give_back(seq)

    def _take(self, prompt: list[int], cancel: Cancel) -> int | None:
        # Watched before the first look, so a stop set at any moment is seen or wakes it.
        cancel.watch(self._wake)
        try:
            with self._cond:
                number = next(self._queue)
                self._waiting.append(number)
                try:
                    while self._exclusive or not self._free or self._waiting[0] != number:
                        if cancel.is_set():
                            return None
                        self._cond.wait()
                    seq = self._choose(prompt)
                    self._free.discard(seq)
                    return seq
                finally:
                    self._waiting.remove(number)
                    self._cond.notify_all()
        finally:
            cancel.unwatch(self._wake)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _choose(self, prompt: list[int]) -> int:
        """The slot holding most of the prompt, counting what the prompt cache holds as held
        by every slot; among those alike, the one that throws away least of what it holds
        (an empty one, or the conversation's own), then the one idle longest. So two
        conversations taking turns keep a slot each: one that shares only the system
        prompt's header with another's slot is not read into it, and the other's state is
        neither stored nor brought back at every turn."""
        stored = self._stored(prompt)

        def value(seq: int) -> tuple[int, int, int]:
            held = self._held(seq)
            common = common_prefix(held, prompt)
            return max(common, stored), common - len(held), -self._last_used[seq]

        return max(sorted(self._free), key=value)

    def _give_back(self, seq: int) -> None:
        with self._cond:
            self._free.add(seq)
            self._last_used[seq] = next(self._tick)
            self._cond.notify_all()

    def hold_all(self, timeout: float | None = None) -> bool:
        """Wait until no answer runs and keep new ones waiting (True), or give up after
        ``timeout`` seconds (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._exclusive or len(self._free) < self.count:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)  # (None: until a slot is given back)
            self._exclusive = True
            return True

    def release_all(self) -> None:
        with self._cond:
            self._exclusive = False
            self._cond.notify_all()


class ExclusiveLock:
    """``Slots.hold_all`` as a lock: ``with lm.lock:`` runs with no answer on the pair."""

    def __init__(self, slots: Slots):
        self._slots = slots

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not blocking:
            timeout = 0
        return self._slots.hold_all(None if timeout < 0 else timeout)

    def release(self) -> None:
        self._slots.release_all()

    def __enter__(self) -> ExclusiveLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

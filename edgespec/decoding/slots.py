"""Several answers on one pair at once: the slot table and the one queue answers are
admitted from. Each answer leases a sequence of the models' contexts (a *slot*) for its
whole life.

``Slots`` is owned by the pair's loop (``decoding.turns``), which admits the waiting
answers into free slots at the start of each round, under the table's condition. A new
answer gets the free slot whose tokens share the longest prefix with its prompt (a
conversation that comes back finds its own history still there), counting what the prompt
cache holds as held by any; among those alike the one that throws away least, then the
one idle longest. With none free it waits, in arrival order. Nothing polls: every change
(an answer queued, a slot given back, a waiting answer's stop, whose ``Cancel`` token
notifies the table as it is set) notifies the condition the loop waits on.
Holding every slot (``exclusive``) is how the cost profile is measured and the pair is
closed without an answer in between.

A slot may also be *lent* to work below every answer (a read-ahead: a prompt read into the
cache before it is asked, ``decoding.read_ahead``): only while no answer runs or waits and
nobody waits to hold the pair, and ``claimed`` says when it must come back. A lent slot is
no answer's: it is not among ``answers``, ``busy`` or a queue's bound.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from edgespec.runtime.tokens import common_prefix


class Cancel(threading.Event):
    """An answer's stop: set once, from any thread. Setting it also runs the callbacks
    watching it, so whoever waits for the answer's sake (the slot table) wakes at once."""

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
        if callback in self._watchers:
            self._watchers.remove(callback)


@dataclass(frozen=True)
class Occupancy:
    """The table at a glance: how many slots it has, the answers holding one, the answers
    waiting."""

    total: int
    busy: int
    waiting: int


class QueueFull(Exception):
    """More answers are waiting than their front end allows."""


class Seated(Protocol):
    """What the table knows of an answer: its prompt, its stop, which front end's it is,
    and the sequence it was given."""

    prompt: tuple[int, ...]
    cancel: Cancel
    owner: str | None
    sequence: int


class Slots:
    """The sequences of a pair's contexts, one per answer running at once, and the
    answers waiting for one."""

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
        # Re-entrant: the loop admits and gives back while it holds the condition.
        self.cond = threading.Condition(threading.RLock())
        self._free = set(range(self.count))
        self._last_used = dict.fromkeys(range(self.count), 0)
        self._tick = itertools.count(1)
        self._waiting: deque[Seated] = deque()
        self._seated: dict[int, Seated] = {}  # by id(answer): the answers holding a slot
        self._lent: dict[int, Seated] = {}  # by id(work): background work holding a slot
        self._exclusive = False
        self._holders = 0  # threads waiting in ``hold_all``: a lent slot comes back for them
        self.lock = ExclusiveLock(self)

    # -- what front ends ask ----------------------------------------------------------------

    def cached(self, prompt: list[int]) -> int:
        """How many of ``prompt``'s first tokens some sequence or the prompt cache holds:
        what an answer to it would not read again."""
        held = max((common_prefix(self._held(seq), prompt) for seq in range(self.count)), default=0)
        return max(held, self._stored(prompt))

    @property
    def busy(self) -> int:
        """The slots answers hold (a lent one is not busy: it comes back when asked)."""
        return self.count - len(self._free) - len(self._lent)

    @property
    def waiting(self) -> int:
        with self.cond:
            return sum(not answer.cancel.is_set() for answer in self._waiting)

    def occupancy(self) -> Occupancy:
        with self.cond:
            return Occupancy(self.count, self.busy, self.waiting)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no answer holds a slot, within ``timeout`` seconds; whether none does."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.busy and (left := deadline - time.monotonic()) > 0:
                self.cond.wait(left)
            return self.busy == 0

    def answers(self, owner: str | None = None) -> list[Seated]:
        """The answers seated or waiting (``owner``'s only, when given)."""
        with self.cond:
            every = [*self._seated.values(), *self._waiting]
        return [answer for answer in every if owner is None or answer.owner == owner]

    # -- the queue ---------------------------------------------------------------------------

    def enqueue(self, answer: Seated, limit: int | None = None) -> int:
        """Queue ``answer`` for a slot; how many answers were ahead of it. ``limit``: at
        most that many may wait besides the slots' answers, else ``QueueFull``."""
        with self.cond:
            ahead = self.waiting + self.busy
            if limit is not None and ahead >= self.count + limit:
                raise QueueFull(self.waiting)
            answer.cancel.watch(self._wake)
            self._waiting.append(answer)
            self.cond.notify_all()
            return ahead

    def ready(self) -> bool:
        """Whether ``admit`` has an answer to hand out (the caller holds ``cond``)."""
        if any(answer.cancel.is_set() for answer in self._waiting):
            return True
        return bool(self._waiting) and bool(self._free) and not self._exclusive

    def admit(self) -> list[Seated]:
        """The waiting answers that go on now, in arrival order (the caller holds
        ``cond``): each next one given a free slot while there is one, and every stopped
        one at once, without a slot (it ends before it touches a model)."""
        admitted: list[Seated] = []
        for answer in [a for a in self._waiting if a.cancel.is_set()]:
            self._waiting.remove(answer)
            answer.cancel.unwatch(self._wake)
            admitted.append(answer)
        while self._waiting and self._free and not self._exclusive:
            answer = self._waiting.popleft()
            answer.cancel.unwatch(self._wake)
            answer.sequence = self._choose(list(answer.prompt))
            self._free.discard(answer.sequence)
            self._seated[id(answer)] = answer
            admitted.append(answer)
        if admitted:
            self.cond.notify_all()
        return admitted

    def drop_waiting(self) -> list[Seated]:
        """Every waiting answer, taken out of the queue (the pair is closing)."""
        with self.cond:
            dropped, self._waiting = list(self._waiting), deque()
            for answer in dropped:
                answer.cancel.unwatch(self._wake)
            return dropped

    def waits(self, answer: Seated) -> bool:
        with self.cond:
            return answer in self._waiting

    def give_back(self, answer: Seated) -> None:
        """``answer`` (or lent work) has ended: its slot (if it had one) is free for the next."""
        with self.cond:
            held = self._seated.pop(id(answer), None)
            if held is None:
                held = self._lent.pop(id(answer), None)
            if held is not None:
                self._free.add(answer.sequence)
                self._last_used[answer.sequence] = next(self._tick)
            self.cond.notify_all()

    def _wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    # -- work below every answer -----------------------------------------------------------

    def lendable(self) -> bool:
        """Whether a slot may be lent now (the caller holds ``cond``): a free one, and no
        answer running or waiting, nor anyone waiting to hold the pair."""
        return bool(self._free) and not (self._seated or self._lent or self.claimed() or self._exclusive)

    def lend(self, work: Seated) -> bool:
        """Seat ``work`` in the free slot holding most of its prompt, as an answer would be
        (so what it reads is where that answer will look first), if ``lendable``."""
        with self.cond:
            if not self.lendable():
                return False
            work.sequence = self._choose(list(work.prompt))
            self._free.discard(work.sequence)
            self._lent[id(work)] = work
            return True

    def claimed(self) -> bool:
        """Whether lent slots must come back: an answer waits (stopped ones need no slot),
        or someone waits to hold the whole pair."""
        with self.cond:
            return self._holders > 0 or any(not answer.cancel.is_set() for answer in self._waiting)

    @property
    def lent(self) -> int:
        return len(self._lent)

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

    # -- the whole pair --------------------------------------------------------------------

    def hold_all(self, timeout: float | None = None) -> bool:
        """Wait until no answer holds a slot and keep new ones waiting (True), or give up
        after ``timeout`` seconds (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            # Counted while it waits: a slot lent to a read-ahead comes back at the end of
            # its batch, not at the end of its reading.
            self._holders += 1
            self.cond.notify_all()
            try:
                while self._exclusive or len(self._free) < self.count:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self.cond.wait(left)  # (None: until a slot is given back)
            finally:
                self._holders -= 1
            self._exclusive = True
            return True

    def release_all(self) -> None:
        with self.cond:
            self._exclusive = False
            self.cond.notify_all()


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

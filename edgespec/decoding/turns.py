"""The pair's one loop: every answer is admitted from one queue into a slot
(``decoding.slots``), and every model call on the pair is made in turn.

In a round each running answer goes on to its next target pass (drafting it included,
its draft model's decodes batched with the other answers'), or reads one batch of its
prompt; then the passes of all of them are one ``llama_decode`` over their sequences, so
that several answers at once get further than the same answers in turn (a pass over a
few tokens costs a CPU much less than as many single ones: docs/sessions.md). Each
answer's events go where its reader asked (``runner.Runner.deliver``). Other calls
(measuring costs, an embedding) run between rounds, in the order asked.

An answer admitted goes first in the next round, and the batch of a prompt being read
when it arrives stops (``arrival``, which each prompt batch is decoded with) and is read
again after it: a short question's first token waits for its own prompt, not another's
batch.

The engine is shared by time, not by turns: each answer is charged the seconds of its own
turns and its share of shared decodes, and an answer reading a long prompt takes its next
batch only once the other answers have had about as long (``Turns._due``). A batch of a
long prompt costs as much as a dozen steps or more; one batch per round would give a short
answer one token per batch while a long prompt is read.

Below every answer runs background work (``Background``: a read-ahead, a prompt read into
the cache before it is asked, ``decoding.read_ahead``): the loop lends it a slot only while
no answer runs or waits, and takes the slot back between two of its batches as soon as
one arrives (its batch in progress stops with the arrival, as a prompt's does), the work
waiting, first in line, for the pair to be idle again. What it read stays in the sequence
for the answer that extends it (which the table seats there), or for the prompt cache.

Where the loop runs: threaded (a server, the app: several threads read answers), on one
engine thread, because llama.cpp's CPU backend (OpenMP) keeps a team of compute threads
per calling thread and decodes called from several threads in turn run slower than the
same decodes from one (docs/sessions.md). Unthreaded (the CLI, the benchmarks: one slot,
one answer at a time), in the reader's own thread: the same rounds, of one answer each.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, InvalidStateError
from functools import partial
from typing import Protocol, TypeVar

import numpy as np

from edgespec.decoding.runner import END as _END
from edgespec.decoding.runner import PAUSE, DraftPass, Pass, Passed, Pause, Runner, read
from edgespec.decoding.slots import Cancel, Slots

__all__ = [
    "AHEAD_S",
    "PAUSE",
    "Background",
    "DecodePasses",
    "DraftPass",
    "Pass",
    "Passed",
    "Pause",
    "Runner",
    "Turns",
]

T = TypeVar("T")
# A prompt whose batches take longer than this is a long one (a batch of 128 tokens takes
# seconds on a 2-core CPU), and each batch waits for the other answers' steps: how far ahead of the least
# served answer a batch may put its answer. Shorter batches (a draft model's, a short
# prompt's, any on a GPU) go on in every round, with the others' steps.
AHEAD_S = 0.5
# Several sequences' passes, ``(seq, tokens)``, decoded together: each one's logits rows.
DecodePasses = Callable[[list[tuple[int, list[int]]]], list[np.ndarray]]


class Background(Protocol):
    """Work below every answer: each time the pair is idle the loop asks it for a runner
    for what is left, seats that runner in a lent slot, and drops it (its slot given back,
    what it read kept) once an answer or a holder of the pair waits. When a runner of it
    ends, so does the work."""

    cancel: Cancel  # its stop: a work that waits its turn then ends at once

    def lease(self) -> Runner | None:
        """A runner for what is left; None once nothing is, or it was stopped (it has
        ended then)."""
        ...

    def end(self, error: BaseException | None = None) -> None:
        """It will not run again: stopped while it waited, or the engine closed."""
        ...


class Turns:
    """The pair's one loop: it admits answers from the slot table's queue and runs them in
    rounds, on the engine thread (threaded) or in the one reader's own (not)."""

    def __init__(
        self,
        slots: Slots,
        threaded: bool = False,
        decode_passes: DecodePasses | None = None,
        clock: Callable[[], float] = time.perf_counter,
        decode_drafts: DecodePasses | None = None,
    ):
        self.slots = slots
        self._decode_passes = decode_passes
        self._decode_drafts = decode_drafts
        self._clock = clock
        # One condition for the table and the loop: an answer queued, a slot given back,
        # a waiting answer's stop and a call asked all wake the loop.
        self._cond = slots.cond
        self._calls: deque[tuple[Callable[[], object], Future]] = deque()
        self._taken: deque[tuple[Callable[[], object], Future]] = deque()  # the calls being run
        self._runners: list[Runner] = []
        self._results: dict[int, Passed | BaseException] = {}  # by id(runner), for its next advance
        self._spent: dict[int, float] = {}  # by id(runner): engine seconds charged to it
        # By id(runner), while it reads its prompt: its longest turn so far (a batch).
        self._batch_s: dict[int, float] = {}
        # By id(runner): the answers that joined and have not had a turn yet.
        self._new: set[int] = set()
        # Background work waiting for an idle pair, oldest first; and by id(runner), the
        # work each lent slot's runner reads for.
        self._pending: deque[Background] = deque()
        self._leases: dict[int, Background] = {}
        self._closed = False
        # Set while an answer that joined waits for its first round: the prompt batch
        # decoding then, given it, stops (``DecodeYielded``) and is read again after the
        # newcomer's.
        self.arrival = threading.Event()
        # What a pass of k tokens costs alone (the pair's cost curve, once known): a shared
        # decode's seconds are split by it, so each answer is charged what its pass would
        # cost alone, scaled to the decode; by tokens until then.
        self.weigh: Callable[[int], float] | None = None
        # Told of every decode of several answers' target passes (how many passes, their
        # tokens, its seconds): what a shared step is priced by (``costs.shared``).
        self.observe_shared: Callable[[int, int, float], None] | None = None
        # While a round's answers plan, on the engine thread: the round's other answers
        # and the tokens their passes will hold, as far as known (``sharing``).
        self._round_view: tuple[int, int] | None = None
        self._last_pass: dict[int, int] = {}  # by id(runner): the tokens of its last pass
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._loop, name="edgespec-engine", daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def run(self, call: Callable[..., T], *args: object) -> T:
        """``call(*args)`` on the engine thread, between rounds, in the order asked; its
        exception is raised here. Unthreaded: at once, here."""
        if self._thread is None:
            return call(*args)
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._calls.append((lambda: call(*args), future))
            self._cond.notify_all()
        return future.result()

    def sharing(self) -> tuple[int, int] | None:
        """For the answer taking its turn now, on the engine thread: the other answers of
        this round and the tokens of the decode they will share with it, the passes they
        asked already counted as asked and those still to plan as plain steps; None
        outside a round. The answers of a round decide their drafts in turn, each knowing
        what the ones before it put in the shared pass (a draft that the batch already
        pays for elsewhere is dearer here than it would be alone)."""
        return self._round_view

    def follow(self, runner: Runner, every_s: float = 0.0) -> Iterator[object]:
        """A queued ``runner``'s events as they come, until its end (see ``runner.read``
        for ``every_s``): read from its inbox (threaded), or run here (unthreaded)."""
        if self._thread is not None:
            yield from read(runner, every_s)
        else:
            yield from self._inline(runner)

    def enqueue(self, runner: Runner, limit: int | None = None) -> int:
        """Queue ``runner``: the loop admits it into a slot and drives it to its end, its
        events handed to ``runner.deliver``. How many answers were ahead of it; with
        ``limit`` (the waiting answers a front end allows), ``QueueFull`` past it."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            ahead = self.slots.enqueue(runner, limit)
            if self._thread is not None and (self.slots.ready() or self._leases):
                # Its round is next (a lent slot is taken back for it): a prompt batch
                # being read stops for it. (Unthreaded, its reader admits it itself, and
                # no batch is being read meanwhile.)
                self.arrival.set()
            self._cond.notify_all()
        return ahead

    def background(self, work: Background) -> None:
        """Run ``work`` below every answer. Threaded: on the engine thread while no answer
        runs or waits; this returns at once. Unthreaded: here, to its end, giving way
        between two batches to each answer another thread asks for meanwhile."""
        work.cancel.watch(partial(self._withdraw, work))
        if self._thread is None:
            self._background_inline(work)
            return
        with self._cond:
            if self._closed:
                work.end(RuntimeError("the engine is closed"))
                return
            self._pending.append(work)
            self._cond.notify_all()

    def _withdraw(self, work: Background) -> None:
        """A work stopped while it waits for an idle pair ends now (one running ends at
        its next batch, or within it: its decodes carry the stop)."""
        with self._cond:
            if work in self._pending:
                self._pending.remove(work)
                work.end()
            self._cond.notify_all()

    def _background_inline(self, work: Background) -> None:
        """Unthreaded: this thread leases the work a slot whenever no answer runs or
        waits, and gives it back for the next that does."""
        while (runner := self._lease_inline(work)) is not None:
            while not runner.finished:
                with self._cond:
                    if self.slots.claimed():
                        self._give_way(runner)
                        break
                self._round([runner])

    def _lease_inline(self, work: Background) -> Runner | None:
        with self._cond:
            while not self.slots.lendable():
                if work.cancel.is_set() or self._closed:
                    work.end()
                    return None
                self._cond.wait()
            runner = work.lease()
            if runner is not None:
                self.slots.lend(runner)
                self._leases[id(runner)] = work
            return runner

    def _inline(self, runner: Runner) -> Iterator[object]:
        """Unthreaded: this thread waits for a slot (the others' readers admit it as they
        give theirs back), then runs the answer's rounds itself."""
        with self._cond:
            while self.slots.waits(runner):
                if self.slots.ready():
                    self.slots.admit()
                else:
                    self._cond.wait()
        try:
            while not runner.finished:
                self._round([runner])
                for item in runner.take(wait=False):
                    if isinstance(item, BaseException):
                        raise item
                    if item is not _END:
                        yield item
        finally:
            if not runner.finished:  # the reader left: the answer ends, its slot goes back
                runner.cancel.set()
                while not runner.finished:
                    self._round([runner])

    def abandon_calls(self, error: BaseException) -> int:
        """End every call waiting for the engine thread, or running on it, with ``error``;
        how many. For a loop that will never come back from the pass it is in (a worker of a
        split target lost mid-pass, ``server/unavailable.py``): whoever waits in ``run``
        hears of it instead of waiting for good."""
        with self._cond:
            futures = [future for _, future in (*self._taken, *self._calls)]
            self._calls.clear()
        ended = 0
        for future in futures:
            with contextlib.suppress(InvalidStateError, RuntimeError):  # done meanwhile
                if future.running() or future.set_running_or_notify_cancel():
                    future.set_exception(error)
                    ended += 1
        return ended

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the engine thread -------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._calls or self._runners or self._admits()):
                    self._cond.wait()
                if self._closed:
                    self._end()
                    return
                calls = self._taken = self._calls
                self._calls = deque()
                self._take_back()
                # First in the next round, the newest first: a new answer's prompt is read,
                # and its first token sent, before the other answers' batches and steps.
                for runner in self.slots.admit():
                    self._runners.insert(0, runner)  # type: ignore[arg-type]  # (the table's are runners)
                self._lend()
                runners = list(self._runners)
                self.arrival.clear()
            while calls:
                _settle(calls[0][1], calls[0][0])
                calls.popleft()
            if runners:
                self._round(self._due(runners))

    def _admits(self) -> bool:
        """Whether the table has an answer to admit or background work may run (the
        caller holds ``cond``)."""
        return self.slots.ready() or self._idle()

    def _idle(self) -> bool:
        """Whether background work may run now (the caller holds ``cond``)."""
        return bool(self._pending) and not self._runners and self.slots.lendable()

    def _lend(self) -> None:
        """With nothing else to run, the oldest background work goes on in a lent slot
        (the caller holds ``cond``)."""
        while self._idle():
            work = self._pending.popleft()
            runner = work.lease()
            if runner is None:
                continue  # (stopped, or nothing left: it has ended)
            self.slots.lend(runner)  # (lendable, under the same hold of ``cond``)
            self._leases[id(runner)] = work
            self._runners.append(runner)

    def _take_back(self) -> None:
        """An answer, or a holder of the whole pair, waits: the background work running
        gives its slot back before the table seats anyone (the caller holds ``cond``)."""
        if self._leases and self.slots.claimed():
            for runner in [r for r in self._runners if id(r) in self._leases]:
                self._runners.remove(runner)
                self._give_way(runner)

    def _give_way(self, runner: Runner) -> None:
        """A background runner stops between two batches: its slot goes back with what it
        read, and its work waits, first in line, for the pair to be idle again."""
        work = self._leases.pop(id(runner))
        self.slots.give_back(runner)
        self._forget(runner)
        if work.cancel.is_set():
            work.end()
        elif self._thread is not None:
            self._pending.appendleft(work)

    def _due(self, runners: list[Runner]) -> list[Runner]:
        """The runners that go on this round. An answer reading a long prompt (its
        batches longer than ``AHEAD_S``) waits while other answers run, until its next
        batch would leave it at most ``AHEAD_S`` better served than the least served of
        them: fair queuing by finish time, so the others get about a batch's time of
        steps between two batches. The others always go on; so do long prompts read
        with nothing else running, in the same rounds. A newcomer starts level with the
        least served (and its first turn, a short prompt read whole, is not charged:
        ``_advance``)."""
        floor = min(self._spent.values(), default=0.0)
        for runner in runners:
            if id(runner) not in self._spent:
                self._spent[id(runner)] = floor
                self._new.add(id(runner))
        heavy = {id(r) for r in runners if self._batch_s.get(id(r), 0.0) > AHEAD_S}
        light = [r for r in runners if id(r) not in heavy]
        if not heavy or not light:
            return runners
        due = min(self._finish(r) for r in light) + AHEAD_S
        return [r for r in runners if id(r) not in heavy or self._finish(r) <= due or r.stopping]

    def _finish(self, runner: Runner) -> float:
        """The engine seconds the runner will have had after its next turn."""
        return self._spent[id(runner)] + self._batch_s.get(id(runner), 0.0)

    def _round(self, runners: list[Runner]) -> None:
        """Each answer goes on to its target pass, its draft model's decodes on the way
        batched with the other answers' (a draft step of several sequences costs a CPU
        less than as many single ones); then the target passes, in one decode."""
        asked: list[tuple[Runner, Pass]] = []
        drafting = runners
        while drafting:
            drafts: list[tuple[Runner, Pass | DraftPass]] = []
            for i, runner in enumerate(drafting):
                # the passes asked, the answers drafting (a token at least each), and those
                # after this one (a plain step each until they plan)
                known = sum(len(wanted.tokens) for _, wanted in asked) + len(drafts)
                later = sum(self._last_pass.get(id(r), 1) for r in drafting[i + 1 :])
                self._round_view = (len(runners) - 1, known + later)
                wanted = self._advance(runner)
                self._round_view = None
                if runner.finished:
                    self._retire(runner)
                elif isinstance(wanted, DraftPass):
                    drafts.append((runner, wanted))
                elif wanted is not None:
                    asked.append((runner, wanted))
            if drafts:
                assert self._decode_drafts is not None, "only a pair with a draft model drafts with it"
                self._decode(drafts, self._decode_drafts, float)
            drafting = [runner for runner, _ in drafts]
        if asked:
            assert self._decode_passes is not None, "a threaded engine decodes its answers' passes"
            seconds = self._decode(asked, self._decode_passes, self.weigh or float)
            if len(asked) > 1 and seconds is not None and self.observe_shared is not None:
                self.observe_shared(len(asked), sum(len(wanted.tokens) for _, wanted in asked), seconds)

    def _retire(self, runner: Runner) -> None:
        """An answer that ended leaves the rounds and gives its slot back; then its last
        events go to its reader."""
        with self._cond:
            if runner in self._runners:
                self._runners.remove(runner)
            work = self._leases.pop(id(runner), None)
            self.slots.give_back(runner)
        self._forget(runner)
        runner.hand_over()
        if work is not None:
            work.end()

    def _forget(self, runner: Runner) -> None:
        self._last_pass.pop(id(runner), None)
        self._spent.pop(id(runner), None)
        self._batch_s.pop(id(runner), None)
        self._new.discard(id(runner))

    def _advance(self, runner: Runner) -> Pass | DraftPass | None:
        """The runner's next turn, its seconds charged to it (a batch of its prompt, read
        within the turn, among them)."""
        key, start = id(runner), self._clock()
        wanted = runner.advance(self._results.pop(key, None))
        seconds = self._clock() - start
        if key in self._new:
            self._new.discard(key)
            if runner.told:
                # A prompt read whole in its first turn, and its first token sent, is not
                # charged: a short question asked while a long prompt is read gets its
                # share of steps after it, so its short answer ends before the next batch.
                seconds = 0.0
        self._spent[key] = self._spent.get(key, 0.0) + seconds
        if wanted is not None:
            self._batch_s.pop(key, None)
        elif not runner.told:
            # (A turn that sent the first token is no batch: a short question's whole prompt
            # and first token must not make it wait like a long prompt. A batch cut short by
            # a newcomer leaves the estimate as it was.)
            self._batch_s[key] = max(self._batch_s.get(key, 0.0), seconds)
        return wanted

    def _decode(
        self,
        asked: list[tuple[Runner, Pass | DraftPass]],
        decode: DecodePasses,
        weigh: Callable[[int], float],
    ) -> float | None:
        """One decode of the passes ``asked``, each answer's result and share of its seconds
        handed back; its seconds (None where it failed)."""
        start = self._clock()
        try:
            rows = decode([(runner.sequence, wanted.tokens) for runner, wanted in asked])
        except Exception as error:  # handed to each answer, which ends with it
            for runner, _ in asked:
                self._results[id(runner)] = error
            return None
        seconds = self._clock() - start
        weights = [max(weigh(len(wanted.tokens)), 1e-9) for _, wanted in asked]
        tokens = sum(len(wanted.tokens) for _, wanted in asked)
        for (runner, wanted), logits, weight in zip(asked, rows, weights, strict=True):
            if isinstance(wanted, Pass):
                self._last_pass[id(runner)] = len(wanted.tokens)
            share = seconds * weight / sum(weights)
            others = (len(asked) - 1, tokens - len(wanted.tokens))
            self._results[id(runner)] = Passed(logits, share, *others)
            self._spent[id(runner)] = self._spent.get(id(runner), 0.0) + share
        return seconds

    def _end(self) -> None:
        closed = RuntimeError("the engine is closed")
        for _, future in self._calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(closed)
        for runner in [*self._runners, *self.slots.admit(), *self.slots.drop_waiting()]:
            runner.fail(closed)  # type: ignore[union-attr]  # (the table's are runners)
            self.slots.give_back(runner)
            runner.hand_over()  # type: ignore[union-attr]
        for work in [*self._pending, *self._leases.values()]:
            work.end(closed)
        self._pending.clear()
        self._leases.clear()
        self._calls.clear()
        self._runners.clear()
        self._spent.clear()
        self._batch_s.clear()
        self._new.clear()


def _settle(future: Future, call: Callable[[], object]) -> None:
    try:
        if future.done() or not future.set_running_or_notify_cancel():  # (done: abandoned)
            return
    except RuntimeError:  # abandoned between the two
        return
    try:
        result = call()
    except BaseException as error:  # the caller gets it, whatever it is
        with contextlib.suppress(InvalidStateError):  # abandoned meanwhile
            future.set_exception(error)
        return
    with contextlib.suppress(InvalidStateError):
        future.set_result(result)

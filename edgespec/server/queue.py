"""One engine, many clients: jobs start in the order they arrived, as many at once as the
pair has slots (``--parallel``), the rest waiting.

One worker thread per slot takes jobs from a FIFO queue, so the order is arrival order by
construction (a bare lock would let any waiter win); the running answers take turns on
the pair step by step (``decoding.slots``). Each job's events
are handed to the request's event loop as they come. A client that goes away cancels its
job: a waiting job is skipped, a running one's answer is stopped at its next step (its
own answer: a stop never reaches another front end's), and its worker moves on to the
next job at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from dataclasses import dataclass, field

from edgespec.api import EdgeSpec
from edgespec.decoding.events import Done, Event
from edgespec.decoding.generation import Generation
from edgespec.server.schemas import Job


class QueueFull(Exception):
    """More clients are waiting than the server was told to hold."""


@dataclass(eq=False)
class Ticket:
    job: Job
    loop: asyncio.AbstractEventLoop
    # Events, then None when the job is over; an Exception in place of an event means it failed.
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    position: int = 0  # jobs ahead of this one when it arrived
    dropped: bool = False  # cancelled while waiting: no longer counted, skipped when its turn comes
    started: bool = False
    released: bool = False  # no longer holds a place: ended, dropped, or its Done was sent
    answer: Generation | None = None  # the job's answer, once the worker made it

    def put(self, item: Event | Exception | None) -> None:
        # RuntimeError: the event loop is gone (server shutting down), nobody listens.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class EngineQueue:
    def __init__(self, lm: EdgeSpec, max_waiting: int):
        self.lm = lm
        self.max_waiting = max_waiting
        self._jobs: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._waiting = 0
        # Jobs holding a place, the running one included, until their Done is sent. Capacity
        # is counted from this, not from ``_running``: a job an idle worker has not picked up
        # yet, or one whose answer the client already has while the engine tidies up, must
        # not make the next client look like one too many.
        self._admitted = 0
        self._running: set[Ticket] = set()
        self.workers = lm.engine.slots.count
        self._threads = [
            threading.Thread(target=self._run, name=f"edgespec-slot-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def waiting(self) -> int:
        return self._waiting

    def submit(self, job: Job) -> Ticket:
        ticket = Ticket(job, asyncio.get_running_loop())
        with self._guard:
            if self._admitted >= self.max_waiting + self.workers:
                raise QueueFull(self._waiting)
            ticket.position = self._waiting + len(self._running)
            self._waiting += 1
            self._admitted += 1
        self._jobs.put(ticket)
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The client is gone: skip or stop its job (never anyone else's)."""
        ticket.cancelled.set()
        with self._guard:
            if not ticket.started and not ticket.dropped:
                # Its place in the queue is free at once, for the next client to take.
                ticket.dropped = True
                self._waiting -= 1
                self._release(ticket)
            elif ticket.answer is not None:
                ticket.answer.stop()  # stops a long prefill too

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop the running jobs, drop the waiting ones; True once the workers have ended."""
        while True:  # waiting jobs are not started any more
            try:
                ticket = self._jobs.get_nowait()
            except queue.Empty:
                break
            if ticket is not None:
                ticket.cancelled.set()
                ticket.put(None)
        with self._guard:
            for running in self._running:
                running.cancelled.set()
                if running.answer is not None:
                    running.answer.stop()
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _run(self) -> None:
        while True:
            ticket = self._jobs.get()
            if ticket is None:
                return
            with self._guard:
                if ticket.dropped:
                    ticket.put(None)
                    continue
                ticket.started = True
                self._waiting -= 1
                self._running.add(ticket)
            try:
                if not ticket.cancelled.is_set():
                    self._generate(ticket)
            except Exception as exc:  # reported to the client; the worker must live on
                ticket.put(exc)
            finally:
                with self._guard:
                    self._running.discard(ticket)
                    self._release(ticket)
                ticket.put(None)

    def _release(self, ticket: Ticket) -> None:
        """Free the ticket's place once; the caller holds ``_guard``."""
        if not ticket.released:
            ticket.released = True
            self._admitted -= 1

    def _generate(self, ticket: Ticket) -> None:
        answer = self.lm.start(ticket.job.request)
        with self._guard:
            ticket.answer = answer
            if ticket.cancelled.is_set():
                answer.stop()
        for event in self.lm.events(answer):
            if ticket.cancelled.is_set():
                continue  # drain to Done: the answer ends at its next step
            if isinstance(event, Done):
                # The place is freed before the client can see its answer and ask again.
                with self._guard:
                    self._release(ticket)
            ticket.put(event)

"""Many clients on the pair's one queue: each request's answer is submitted to the pair's
loop (``decoding.turns``), which admits it into a slot in arrival order (as many at once as
the pair has slots, ``--parallel``) and hands its events straight to the request's event
loop. No thread of the server's stands between the loop and a client.

The server bounds the queue: past ``max_waiting`` answers waiting for a slot, a new one is
refused (``QueueFull``: a 503). A client that goes away stops its own answer: a waiting
one leaves the queue at once (its place is free for the next client), a running one ends
at its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from edgespec.api import EdgeSpec
from edgespec.decoding.generation import Generation
from edgespec.decoding.slots import QueueFull
from edgespec.server.schemas import Job

__all__ = ["EngineQueue", "QueueFull", "Submitted"]


@dataclass(eq=False)
class Submitted:
    """A job's answer, submitted: its events arrive on ``events`` in lists, the last
    ending with ``decoding.runner.END`` or an exception."""

    job: Job
    answer: Generation
    position: int = 0  # answers ahead of it when it arrived
    events: asyncio.Queue = field(default_factory=asyncio.Queue)


class EngineQueue:
    def __init__(self, lm: EdgeSpec, max_waiting: int):
        self.lm = lm
        self.max_waiting = max_waiting

    @property
    def waiting(self) -> int:
        return self.lm.engine.slots.waiting

    def submit(self, job: Job) -> Submitted:
        loop = asyncio.get_running_loop()
        submitted = Submitted(job, self.lm.start(job.request))

        def deliver(events: list[object]) -> None:
            # RuntimeError: the event loop is gone (server shutting down), nobody listens.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(submitted.events.put_nowait, events)

        submitted.position = self.lm.submit(submitted.answer, deliver, self.max_waiting)
        return submitted

    def cancel(self, submitted: Submitted) -> None:
        """The client is gone: stop its answer (never anyone else's)."""
        submitted.answer.stop()

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop every answer, running or waiting; True once none holds a slot."""
        slots = self.lm.engine.slots
        for answer in slots.answers():
            answer.cancel.set()
        deadline = time.monotonic() + timeout
        with slots.cond:
            while slots.busy and (left := deadline - time.monotonic()) > 0:
                slots.cond.wait(left)
            return slots.busy == 0

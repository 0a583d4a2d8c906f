"""The server's job queue on the real loaded pair, without HTTP: how many clients it holds.

Capacity is "one running plus ``max_waiting`` waiting", counted from admission until a
job's Done. In a live server these cases depend on thread timing (whether the worker is
still tidying up after an answer the client already has); here the test holds the
engine's lock before the first job starts and holds the worker right after each Done, so
the worker waits exactly where the test wants it and every outcome is fixed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from edgespec.api import EdgeSpec
from edgespec.decoding.events import Done
from edgespec.server.queue import EngineQueue, QueueFull, Ticket
from edgespec.server.schemas import Job


def job(lm: EdgeSpec) -> Job:
    return Job(
        kind="chat",
        request=lm.request("Say hello.", chat=True, max_tokens=3, drafter="none", gamma=0),
        stream=True,
        include_usage=False,
        model="default",
    )


async def answer(ticket: Ticket) -> Done:
    """Read a ticket's events up to its Done (what a client sees)."""
    while True:
        item = await asyncio.wait_for(ticket.events.get(), 120)
        if isinstance(item, Exception):
            raise item
        assert item is not None, "the job ended without an answer"
        if isinstance(item, Done):
            return item


async def drain(ticket: Ticket) -> None:
    while await asyncio.wait_for(ticket.events.get(), 120) is not None:
        pass


def test_capacity_is_one_running_and_the_waiting_ones(
    pair: EdgeSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    tidied = threading.Event()  # set: the worker may go on past a Done
    generate = pair.stream

    def stream_then_wait(*args, **kwargs) -> Iterator:
        for event in generate(*args, **kwargs):
            yield event
            if isinstance(event, Done):
                tidied.wait(120)  # the worker stays between the answer and its tidying up

    monkeypatch.setattr(pair, "stream", stream_then_wait)

    async def scenario() -> None:
        engine = EngineQueue(pair, max_waiting=1)
        pair.lock.acquire()  # the worker blocks inside the first job, before any event
        try:
            first = engine.submit(job(pair))
            # Asked together while the worker may not have picked up the first: one runs,
            # one waits, both are admitted whatever the threads did meanwhile.
            second = engine.submit(job(pair))
            assert (first.position, second.position) == (0, 1)
            with pytest.raises(QueueFull):
                engine.submit(job(pair))
            # A waiting client that hangs up frees its place at once.
            engine.cancel(second)
            third = engine.submit(job(pair))
            with pytest.raises(QueueFull):
                engine.submit(job(pair))
        finally:
            pair.lock.release()
        await answer(first)
        # The moment a client has its answer it may ask again and be admitted, although
        # the worker is still tidying up after the first job (held there).
        fourth = engine.submit(job(pair))
        with pytest.raises(QueueFull):
            engine.submit(job(pair))
        tidied.set()
        await drain(second)
        for ticket in (third, fourth):
            assert (await answer(ticket)).stop_reason == "max_tokens"
        assert engine.waiting == 0
        assert engine.shutdown()

    asyncio.run(scenario())

"""The server's queue on the real loaded pair, without HTTP: how many clients it holds.

Capacity is "the slots' answers plus ``max_waiting`` waiting". The test holds the pair
(``lm.lock``: no answer is admitted meanwhile), so every answer submitted waits and every
outcome is fixed whatever the threads do.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.decoding.events import Done
from edgespec.decoding.runner import END
from edgespec.server.queue import EngineQueue, QueueFull, Submitted
from edgespec.server.schemas import Job

pytestmark = pytest.mark.needs_models


@pytest.fixture(scope="module")
def lm():
    """A pair as the server loads it: its loop on an engine thread, two slots."""
    loaded = EdgeSpec(options=RuntimeOptions(n_ctx=512, parallel=2), quiet=True)
    yield loaded
    loaded.close()


def job(lm: EdgeSpec) -> Job:
    return Job(
        kind="chat",
        request=lm.request("Say hello.", chat=True, max_tokens=3, drafter="none", gamma=0),
        stream=True,
        include_usage=False,
        model="default",
    )


async def answer(submitted: Submitted) -> Done | None:
    """Read an answer's events to its end (what a client sees): its Done, if it has one."""
    done = None
    while True:
        for item in await asyncio.wait_for(submitted.events.get(), 120):
            if isinstance(item, BaseException):
                raise item
            if item is END:
                return done
            if isinstance(item, Done):
                done = item


def test_capacity_is_the_slots_and_the_waiting_ones(lm: EdgeSpec) -> None:
    pair = lm
    slots = pair.engine.slots.count

    async def scenario() -> None:
        engine = EngineQueue(pair, max_waiting=1)
        pair.lock.acquire()  # nothing is admitted: every answer submitted waits
        try:
            held = [engine.submit(job(pair)) for _ in range(slots + 1)]
            assert [s.position for s in held] == list(range(slots + 1))
            with pytest.raises(QueueFull):
                engine.submit(job(pair))
            # A waiting client that hangs up frees its place at once.
            engine.cancel(held[-1])
            late = engine.submit(job(pair))
            with pytest.raises(QueueFull):
                engine.submit(job(pair))
            assert engine.waiting == slots + 1
        finally:
            pair.lock.release()
        assert await answer(held[-1]) is not None  # the stopped one ends, cancelled
        for submitted in [*held[:-1], late]:
            done = await answer(submitted)
            assert done is not None and done.stop_reason == "max_tokens"
        assert engine.waiting == 0
        # The moment a client has its answer its slot is free: it may ask again at once.
        again = [engine.submit(job(pair)) for _ in range(slots + 1)]
        for submitted in again:
            await answer(submitted)
        assert engine.shutdown()

    asyncio.run(scenario())


def test_no_thread_stands_between_the_engine_and_a_client(lm: EdgeSpec) -> None:
    pair = lm
    before = {t.name for t in threading.enumerate()}

    async def scenario() -> None:
        engine = EngineQueue(pair, max_waiting=4)
        submitted = [engine.submit(job(pair)) for _ in range(3)]
        for s in submitted:
            await answer(s)

    asyncio.run(scenario())
    assert not {t.name for t in threading.enumerate()} - before

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
from edgespec.decoding.slots import QueueFull
from edgespec.server.errors import ApiError
from edgespec.server.pipeline import Asked, ask
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


async def answer(submitted: Asked) -> Done | None:
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
    slots = pair.occupancy().total

    async def scenario() -> None:
        pair.lock.acquire()  # nothing is admitted: every answer submitted waits
        try:
            held = [ask(pair, job(pair), 1) for _ in range(slots + 1)]
            assert [s.answer.ahead for s in held] == list(range(slots + 1))
            with pytest.raises(ApiError) as refused:
                ask(pair, job(pair), 1)
            assert refused.value.status == 503 and "1 requests are already waiting" in str(refused.value)
            with pytest.raises(QueueFull):  # the one check, under the server's word for it
                pair.submit(job(pair).request, limit=1)
            # A waiting client that hangs up frees its place at once.
            held[-1].answer.stop()
            late = ask(pair, job(pair), 1)
            with pytest.raises(ApiError):
                ask(pair, job(pair), 1)
            assert pair.occupancy().waiting == slots + 1
        finally:
            pair.lock.release()
        assert await answer(held[-1]) is not None  # the stopped one ends, cancelled
        for submitted in [*held[:-1], late]:
            done = await answer(submitted)
            assert done is not None and done.stop_reason == "max_tokens"
        assert pair.occupancy().waiting == 0
        # The moment a client has its answer its slot is free: it may ask again at once.
        again = [ask(pair, job(pair), 1) for _ in range(slots + 1)]
        for submitted in again:
            await answer(submitted)
        assert pair.stop_answers() == 0 and pair.wait_idle(10)

    asyncio.run(scenario())


def test_no_thread_stands_between_the_engine_and_a_client(lm: EdgeSpec) -> None:
    pair = lm
    before = {t.name for t in threading.enumerate()}

    async def scenario() -> None:
        submitted = [ask(pair, job(pair), 4) for _ in range(3)]
        for s in submitted:
            await answer(s)

    asyncio.run(scenario())
    assert not {t.name for t in threading.enumerate()} - before


def long_request(lm: EdgeSpec):
    """An answer that cannot end by itself before the test stops it: a long budget, and a
    stop string no greedy answer to this prompt reaches before its end."""
    return lm.request(
        "Count from one to two hundred in words.", chat=True, max_tokens=400, drafter="none", gamma=0
    )


def first_then_rest(answer) -> tuple[threading.Event, list, threading.Thread]:
    """Read ``answer`` on a thread of its own: an event set at its first token, and its
    events once the thread is done."""
    seen, events = threading.Event(), []

    def read() -> None:
        for event in answer.events():
            events.append(event)
            seen.set()
        seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return seen, events, reader


def stopped_from_another_thread(answer) -> None:
    stopper = threading.Thread(target=answer.stop)
    stopper.start()
    stopper.join()


def test_a_running_and_a_waiting_answer_stopped_from_another_thread_end_at_once(lm: EdgeSpec) -> None:
    total = lm.occupancy().total
    running = [lm.submit(long_request(lm), owner="tab-1") for _ in range(total)]
    readers = [first_then_rest(answer) for answer in running]
    for seen, _, _ in readers:
        assert seen.wait(120)  # every slot holds a running answer now
    waiting = lm.submit(long_request(lm), owner="tab-2")
    assert waiting.waiting and lm.occupancy().waiting == 1
    stopped_from_another_thread(waiting)
    ended = list(waiting.events())  # the running ones still hold every slot
    assert [type(e) for e in ended] == [Done] and ended[0].stop_reason == "cancelled"
    assert lm.occupancy().waiting == 0 and lm.occupancy().busy == total
    for answer, (_, events, reader) in zip(running, readers, strict=True):
        stopped_from_another_thread(answer)
        reader.join(120)
        assert not reader.is_alive()
        assert isinstance(events[-1], Done) and events[-1].stop_reason == "cancelled"
        assert len(events[-1].token_ids) < 400
    assert lm.wait_idle(10)  # every slot given back


def test_an_owners_stop_ends_its_own_answers_waiting_or_running_and_no_other(lm: EdgeSpec) -> None:
    """What the app's Stop and a closed tab call: ``stop_answers(owner)``."""
    total = lm.occupancy().total
    theirs = lm.submit(long_request(lm), owner="tab-theirs")
    mine = [lm.submit(long_request(lm), owner="tab-mine") for _ in range(total)]  # the last waits
    assert mine[-1].waiting
    readers = [first_then_rest(answer) for answer in [theirs, *mine]]
    assert readers[0][0].wait(120)
    assert lm.stop_answers("tab-mine") == total
    for _, events, reader in readers[1:]:
        reader.join(120)
        assert isinstance(events[-1], Done) and events[-1].stop_reason == "cancelled"
    assert lm.answers() == [theirs] and not theirs.live.stopped
    theirs.stop()
    readers[0][2].join(120)
    assert readers[0][1][-1].stop_reason == "cancelled" and lm.wait_idle(10)


def test_a_reader_that_leaves_at_the_done_is_let_go_at_once(lm: EdgeSpec) -> None:
    """The last events come together (the Done, then the end behind it): a reader that
    stops reading at the Done has taken the end already, and must not wait for another."""
    answer = lm.submit(job(lm).request)
    assert answer.ended.wait(120)  # every event, the end too, waits to be read

    def leave_at_the_done() -> None:
        next(event for event in answer.events() if isinstance(event, Done))

    reader = threading.Thread(target=leave_at_the_done, daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive()
    assert lm.occupancy().busy == 0

"""Slots and turns without a model: a new answer gets the free sequence holding the
longest prefix of its prompt, else the one idle longest; waiting answers are served in
arrival order; a stopped one stops waiting; the turns go round fairly."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from edgespec.decoding.slots import Cancel, Slots
from edgespec.decoding.turns import Turns


def make(held: dict[int, list[int]]) -> Slots:
    return Slots(len(held), lambda seq: held[seq])


def test_a_prompt_goes_to_the_slot_holding_most_of_it():
    slots = make({0: [1, 2, 3], 1: [1, 2, 9, 9], 2: []})
    never = Cancel()
    with slots.lease([1, 2, 9, 5], never) as seq:
        assert seq == 1
        with slots.lease([1, 2, 3, 4], never) as other:
            assert other == 0
            assert slots.busy == 2


def test_what_the_prompt_cache_holds_counts_as_held_by_every_slot():
    """Two conversations taking turns keep a slot each: the one sharing only a header with
    another's slot takes an empty one, and a conversation the cache holds goes to the slot
    that throws away least, not into the other conversation's."""
    held = {0: [1, 2, 3, 4, 5, 6], 1: [], 2: [1, 2, 7]}
    stored = {(1, 2, 8, 9, 9): 5}
    slots = Slots(len(held), lambda seq: held[seq], lambda prompt: stored.get(tuple(prompt), 0))
    never = Cancel()
    with slots.lease([1, 2, 8, 9, 9], never) as seq:
        assert seq == 1  # all three hold at least 2 of it, counting the cache: 1 loses nothing
    with slots.lease([1, 2, 3, 4, 5, 6, 7], never) as seq:
        assert seq == 0  # its own history
    with slots.lease([1, 2, 7, 8], never) as seq:
        assert seq == 2


def test_without_a_shared_prefix_the_slot_idle_longest_is_taken():
    slots = make({0: [], 1: [], 2: []})
    never = Cancel()
    leases = [slots.lease([5], never) for _ in range(3)]
    taken = [lease.__enter__() for lease in leases]
    assert sorted(taken) == [0, 1, 2]
    for i in (2, 0, 1):  # given back in this order: the slot of lease 2 is idle longest
        leases[i].__exit__(None, None, None)
    with slots.lease([7], never) as seq:
        assert seq == taken[2]


def test_waiting_answers_are_served_in_arrival_order_and_a_stopped_one_gives_up():
    slots = make({0: []})
    never, stopped = Cancel(), Cancel()
    order: list[str] = []

    def wait(name: str, cancel: Cancel) -> None:
        with slots.lease([1], cancel) as seq:
            order.append(f"{name}:{seq}")

    with slots.lease([1], never):
        waiters = []
        for name, cancel in (("first", never), ("quitter", stopped), ("second", never)):
            waiters.append(threading.Thread(target=wait, args=(name, cancel)))
            waiters[-1].start()
            time.sleep(0.1)  # arrival order
        stopped.set()
        waiters[1].join(5)
        assert order == ["quitter:None"]
    for waiter in waiters:
        waiter.join(5)
    assert order == ["quitter:None", "first:0", "second:0"]


def test_a_waiting_answers_stop_wakes_it_at_once_without_polling():
    """The stop itself wakes the waiting answer (its ``Cancel`` notifies the slots): every
    wait is untimed, and the answer gives up as soon as its stop is set."""
    slots = make({0: []})
    timeouts: list[float | None] = []
    cond = slots._cond
    real_wait = cond.wait

    def untimed(timeout: float | None = None) -> bool:
        timeouts.append(timeout)
        return real_wait(timeout)

    cond.wait = untimed  # type: ignore[method-assign]
    cancel = Cancel()
    got: list[int | None] = []
    gave_up = threading.Event()

    def wait() -> None:
        with slots.lease([1], cancel) as seq:
            got.append(seq)
        gave_up.set()

    with slots.lease([1], Cancel()):
        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 5
        while not timeouts and time.monotonic() < deadline:
            time.sleep(0.001)  # (the test's own wait for the waiter to be waiting)
        assert timeouts, "the answer never waited"
        time.sleep(0.1)  # a poll would have looked by now: only the stop may wake it
        waits = len(timeouts)
        stopped_at = time.perf_counter()
        cancel.set()
        assert gave_up.wait(1)
        woke_s = time.perf_counter() - stopped_at
        waiter.join(1)
    assert got == [None]
    assert timeouts == [None] * len(timeouts) and len(timeouts) == waits  # one wake, the stop's
    assert woke_s < 0.2, f"the stop took {woke_s:.3f} s to wake the waiting answer"


def test_holding_all_waits_for_the_running_answer_and_keeps_new_ones_out():
    slots = make({0: [], 1: []})
    never = Cancel()
    with slots.lease([1], never):
        assert not slots.hold_all(timeout=0.1)  # an answer runs
    assert slots.hold_all(timeout=1)
    got: list[int | None] = []
    late = threading.Thread(target=lambda: got.extend(_lease_once(slots)))
    late.start()
    time.sleep(0.2)
    assert got == []  # kept out while held
    slots.release_all()
    late.join(5)
    assert got and got[0] is not None


def _lease_once(slots: Slots) -> list[int | None]:
    with slots.lease([1], Cancel()) as seq:
        return [seq]


def test_threaded_turns_run_on_one_thread_in_the_order_asked():
    turns = Turns(threaded=True)
    log: list[tuple[str, str]] = []
    ready = threading.Barrier(3)

    def step(name: str) -> None:
        log.append((name, threading.current_thread().name))
        time.sleep(0.01)

    def worker(name: str) -> None:
        ready.wait()
        for _ in range(3):
            turns.run(step, name)

    try:
        blocker = threading.Event()
        turns.run(lambda: None)
        held = threading.Thread(target=turns.run, args=(blocker.wait,))
        held.start()  # the engine is busy: both workers line up behind it
        threads = [threading.Thread(target=worker, args=(n,)) for n in "ab"]
        for thread in threads:
            thread.start()
        ready.wait()
        time.sleep(0.2)
        blocker.set()
        for thread in [held, *threads]:
            thread.join(5)
    finally:
        turns.close()
    names = [name for name, _ in log]
    assert sorted(names) == ["a"] * 3 + ["b"] * 3
    # Neither runs twice in a row while the other waits: an answer that asks again queues.
    assert all(x != y for x, y in itertools.pairwise(names))
    assert len({thread for _, thread in log}) == 1  # every step on the one engine thread
    with pytest.raises(ZeroDivisionError):  # a step's error reaches its caller
        Turns(threaded=True).run(lambda: 1 / 0)

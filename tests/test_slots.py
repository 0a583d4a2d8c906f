"""The slot table and its queue without a model: a new answer gets the free sequence
holding the longest prefix of its prompt, else the one idle longest; waiting answers are
admitted in arrival order; a stopped one leaves the queue at once; a front end's bound on
the queue is kept; the pair's loop waits for all this without polling."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

from edgespec.decoding.runner import END, Pass, Runner
from edgespec.decoding.slots import Cancel, QueueFull, Slots
from edgespec.decoding.turns import Turns


class Asked:
    """An answer as the table sees it."""

    def __init__(self, prompt: list[int], owner: str | None = None):
        self.prompt = tuple(prompt)
        self.cancel = Cancel()
        self.owner = owner
        self.sequence = -1


def make(held: dict[int, list[int]]) -> Slots:
    return Slots(len(held), lambda seq: held[seq])


def seat(slots: Slots, prompt: list[int]) -> Asked:
    answer = Asked(prompt)
    slots.enqueue(answer)
    with slots.cond:
        assert slots.admit() == [answer]
    return answer


def test_a_prompt_goes_to_the_slot_holding_most_of_it():
    slots = make({0: [1, 2, 3], 1: [1, 2, 9, 9], 2: []})
    assert seat(slots, [1, 2, 9, 5]).sequence == 1
    assert seat(slots, [1, 2, 3, 4]).sequence == 0
    assert slots.busy == 2


def test_what_the_prompt_cache_holds_counts_as_held_by_every_slot():
    """Two conversations taking turns keep a slot each: the one sharing only a header with
    another's slot takes an empty one, and a conversation the cache holds goes to the slot
    that throws away least, not into the other conversation's."""
    held = {0: [1, 2, 3, 4, 5, 6], 1: [], 2: [1, 2, 7]}
    stored = {(1, 2, 8, 9, 9): 5}
    slots = Slots(len(held), lambda seq: held[seq], lambda prompt: stored.get(tuple(prompt), 0))
    for prompt, expected in (([1, 2, 8, 9, 9], 1), ([1, 2, 3, 4, 5, 6, 7], 0), ([1, 2, 7, 8], 2)):
        answer = seat(slots, prompt)
        assert answer.sequence == expected  # (the first: all hold 2 of it, counting the cache)
        slots.give_back(answer)


def test_without_a_shared_prefix_the_slot_idle_longest_is_taken():
    slots = make({0: [], 1: [], 2: []})
    seated = [seat(slots, [5]) for _ in range(3)]
    assert sorted(a.sequence for a in seated) == [0, 1, 2]
    for i in (2, 0, 1):  # given back in this order: the slot of answer 2 is idle longest
        slots.give_back(seated[i])
    assert seat(slots, [7]).sequence == seated[2].sequence


def test_waiting_answers_are_admitted_in_arrival_order_and_a_stopped_one_at_once():
    slots = make({0: []})
    running = seat(slots, [1])
    first, quitter, second = Asked([1]), Asked([1]), Asked([1])
    assert [slots.enqueue(a) for a in (first, quitter, second)] == [1, 2, 3]  # answers ahead
    with slots.cond:
        assert not slots.ready() and slots.admit() == []
    quitter.cancel.set()
    with slots.cond:
        assert slots.ready()
        assert slots.admit() == [quitter]  # without a slot: it ends before it touches a model
    assert slots.busy == 1 and slots.waiting == 2
    slots.give_back(running)
    with slots.cond:
        assert slots.admit() == [first]
    slots.give_back(first)
    with slots.cond:
        assert slots.admit() == [second]
    slots.give_back(quitter)  # (it held no slot: nothing is freed twice)
    assert slots.busy == 1


def test_a_front_ends_bound_on_the_queue_is_kept_and_a_stopped_answer_frees_its_place():
    slots = make({0: []})
    seat(slots, [1])
    waiting = Asked([1])
    assert slots.enqueue(waiting, limit=1) == 1
    with pytest.raises(QueueFull):
        slots.enqueue(Asked([1]), limit=1)
    waiting.cancel.set()  # a client that hangs up frees its place at once
    assert slots.enqueue(Asked([1]), limit=1) == 1
    assert slots.enqueue(Asked([1])) == 2  # the Python API sets no bound


def test_owners_find_their_own_answers_only():
    slots = make({0: []})
    mine, theirs = Asked([1], owner="tab-1"), Asked([1], owner="tab-2")
    slots.enqueue(mine)
    slots.enqueue(theirs)
    with slots.cond:
        slots.admit()
    assert slots.answers("tab-1") == [mine] and slots.answers("tab-2") == [theirs]
    assert slots.answers() == [mine, theirs]  # the seated first


class Forever(Runner):
    """An answer that asks for passes until it is stopped."""

    def steps(self):
        while not self.cancel.is_set():
            yield "step"
            yield Pass([1])


def test_a_waiting_answers_stop_ends_it_at_once_and_the_loop_never_polls():
    """The stop itself wakes the loop (the answer's ``Cancel`` notifies the table): every
    wait of the loop is untimed, and the stopped answer ends as soon as its stop is set."""
    slots = make({0: []})
    timeouts: list[float | None] = []
    real_wait = slots.cond.wait

    def untimed(timeout: float | None = None) -> bool:
        timeouts.append(timeout)
        return real_wait(timeout)

    slots.cond.wait = untimed  # type: ignore[method-assign]
    gate = threading.Event()

    def decode(passes):
        gate.wait(10)  # the running answer's pass, held while the other waits
        return [np.zeros((len(tokens), 3), dtype=np.float32) for _, tokens in passes]

    turns = Turns(slots, threaded=True, decode_passes=decode)
    running, waiting = Forever((1,), Cancel()), Forever((1,), Cancel())
    try:
        turns.enqueue(running)
        turns.enqueue(waiting)
        assert slots.waits(waiting)
        stopped_at = time.perf_counter()
        waiting.cancel.set()
        gate.set()
        items = waiting.take()
        woke_s = time.perf_counter() - stopped_at
        assert items == [END]  # it ran nothing
        running.cancel.set()
        assert END in running.take() + running.take()
    finally:
        turns.close()
    assert all(timeout is None for timeout in timeouts)
    assert woke_s < 5, f"the stop took {woke_s:.3f} s to end the waiting answer"


def test_holding_all_waits_for_the_running_answer_and_keeps_new_ones_out():
    slots = make({0: [], 1: []})
    running = seat(slots, [1])
    assert not slots.hold_all(timeout=0.1)  # an answer runs
    slots.give_back(running)
    assert slots.hold_all(timeout=1)
    late = Asked([1])
    slots.enqueue(late)
    with slots.cond:
        assert not slots.ready() and slots.admit() == []  # kept out while held
    slots.release_all()
    with slots.cond:
        assert slots.admit() == [late]


def test_threaded_turns_run_on_one_thread_in_the_order_asked():
    turns = Turns(make({0: []}), threaded=True)
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
        Turns(make({0: []}), threaded=True).run(lambda: 1 / 0)

"""The engine thread's rounds (``decoding.turns``): the passes the answers running at once
ask for in a round are one decode; an answer that ends leaves the rounds; a failed decode
ends the answers it held and no other; other calls run on the same thread between rounds.
The runners here are plain scripted answers: what is tested is the scheduling."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

from edgespec.decoding.runner import Runner
from edgespec.decoding.slots import Cancel, Slots
from edgespec.decoding.turns import AHEAD_S, DraftPass, Pass, Passed, Turns


def table(count: int = 4) -> Slots:
    """A slot table of ``count`` empty sequences: answers get the lowest free one first."""
    return Slots(count, lambda _seq: [])


class Scripted:
    """An answer that asks for ``passes`` passes of ``size`` tokens, one per round,
    recording what each pass gave."""

    stopping = False
    told = False
    prompt: tuple[int, ...] = ()
    owner = None

    def __init__(self, sequence: int, passes: int, size: int = 1):
        self.cancel = Cancel()
        self.sequence = sequence  # (the table gives it the same, given in order)
        self.finished = False
        self.left = passes
        self.size = size
        self.results: list[Passed | BaseException] = []
        self.threads: set[str] = set()
        self.done = threading.Event()

    def advance(self, result: Passed | BaseException | None) -> Pass | None:
        self.threads.add(threading.current_thread().name)
        if result is not None:
            self.results.append(result)
            if isinstance(result, BaseException):
                self.fail(result)
                return None
        if self.left == 0:
            self.finished = True
            self.done.set()
            return None
        self.left -= 1
        return Pass([self.sequence] * self.size)

    def fail(self, error: BaseException) -> None:
        self.finished = True
        self.done.set()

    def hand_over(self) -> None:
        pass


class Recorder:
    """A decode of several passes: each row holds its sequence number."""

    def __init__(self, fail_when: int | None = None):
        self.calls: list[list[int]] = []
        self.fail_when = fail_when

    def __call__(self, passes: list[tuple[int, list[int]]]) -> list[np.ndarray]:
        self.calls.append([seq for seq, _ in passes])
        if self.fail_when is not None and self.fail_when in self.calls[-1]:
            raise RuntimeError("the decode failed")
        time.sleep(0.002)
        return [np.full((len(tokens), 3), seq, dtype=np.float32) for seq, tokens in passes]


def run_all(turns: Turns, runners: list[Scripted]) -> None:
    for runner in runners:
        turns.enqueue(runner)
    for runner in runners:
        assert runner.done.wait(10)


def run_together(turns: Turns, runners: list) -> None:
    """``runners`` joined while the engine is held by a call, so that all of them join
    before the first round (the last joined first in it); then each runs to its end, and
    the engine is closed."""
    blocker = threading.Event()
    held = threading.Thread(target=turns.run, args=(blocker.wait,))
    held.start()
    for runner in runners:
        turns.enqueue(runner)
    blocker.set()
    try:
        for runner in runners:
            assert runner.done.wait(10)
    finally:
        turns.close()


def drive(turns: Turns, runner: Runner, every_s: float = 0.0):
    """Queue ``runner`` and follow it to its end, as ``Generation.events`` does."""
    turns.enqueue(runner)
    return turns.follow(runner, every_s)


def test_the_passes_of_the_answers_running_at_once_are_one_decode():
    decode = Recorder()
    turns = Turns(table(), threaded=True, decode_passes=decode)
    runners = [Scripted(0, 3), Scripted(1, 5), Scripted(2, 1, size=4)]
    run_together(turns, runners)
    # The one that joined last goes first: a new answer is read before the others step.
    assert decode.calls == [[2, 1, 0], [1, 0], [1, 0], [1], [1]]
    for runner in runners:
        assert all(isinstance(r, Passed) and (r.logits == runner.sequence).all() for r in runner.results)
        assert runner.threads == {"edgespec-engine"}
    shared = [r.shared for r in runners[1].results]  # type: ignore[union-attr]
    assert shared == [True, True, True, False, False]
    # Each pass is told what else was in its decode: the next step's price depends on it.
    others = [(r.others, r.others_tokens) for r in runners[1].results]  # type: ignore[union-attr]
    assert others == [(2, 5), (1, 1), (1, 1), (0, 0), (0, 0)]
    assert (runners[2].results[0].others, runners[2].results[0].others_tokens) == (2, 2)  # type: ignore[union-attr]
    # A decode's seconds are shared by tokens: the 4-token pass got 4/6 of the first one.
    first = [runner.results[0].seconds for runner in runners]  # type: ignore[union-attr]
    assert first[2] == pytest.approx(4 * first[0]) and first[0] == pytest.approx(first[1])


def test_an_answer_that_joins_goes_first_in_the_next_round():
    """What gets a short question's prompt read, and its first token sent, before the
    other answers' next batches of a long prompt."""
    decode = Recorder()
    turns = Turns(table(), threaded=True, decode_passes=decode)
    running = Scripted(0, 1000)
    joining = Scripted(1, 3)
    try:
        turns.enqueue(running)
        while len(decode.calls) < 3:
            time.sleep(0.001)
        turns.enqueue(joining)
        assert joining.done.wait(10)
    finally:
        turns.close()
    shared = [call for call in decode.calls if 1 in call]
    assert shared == [[1, 0]] * 3


def test_a_joining_answer_is_announced_until_its_round_begins():
    """``arrival``: what stops a prompt batch being read (``Sequence.decode``'s)."""
    decode = Recorder()
    turns = Turns(table(), threaded=True, decode_passes=decode)
    inside, blocker = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        blocker.wait()

    held = threading.Thread(target=turns.run, args=(hold,))
    held.start()
    runner = Scripted(0, 2)
    try:
        assert inside.wait(10)  # the engine thread is in the call, between rounds
        turns.enqueue(runner)
        assert turns.arrival.is_set()  # the engine is busy: the round has not begun
        blocker.set()
        assert runner.done.wait(10)
        assert not turns.arrival.is_set()
    finally:
        blocker.set()
        turns.close()


def test_a_failed_decode_ends_the_answers_in_it_and_no_other():
    decode = Recorder(fail_when=0)
    turns = Turns(table(), threaded=True, decode_passes=decode)
    try:
        failing = Scripted(0, 3)
        run_all(turns, [failing])
        other = Scripted(1, 2)  # (the table gives it the slot idle longest: 1)
        run_all(turns, [other])
    finally:
        turns.close()
    assert len(failing.results) == 1 and isinstance(failing.results[0], RuntimeError)
    assert [type(r) for r in other.results] == [Passed, Passed]


def test_calls_run_on_the_engine_thread_between_rounds_and_raise_where_asked():
    turns = Turns(table(), threaded=True, decode_passes=Recorder())
    try:
        assert turns.run(threading.current_thread).name == "edgespec-engine"
        with pytest.raises(ZeroDivisionError):
            turns.run(lambda: 1 / 0)
        runner = Scripted(0, 10**9)  # runs until told to stop
        turns.enqueue(runner)
        assert turns.run(lambda: 7) == 7  # answered while the answer runs
        runner.left = 0
        assert runner.done.wait(10)
    finally:
        turns.close()
    with pytest.raises(RuntimeError, match="closed"):
        turns.run(lambda: 1)


def test_calls_on_a_loop_stuck_for_good_end_with_the_error_they_are_given():
    """A worker lost mid-pass parks the engine thread for good: the call running on it and
    the ones queued behind it end with the error, and a late result goes nowhere."""
    turns = Turns(table(), threaded=True, decode_passes=Recorder())
    stuck, release = threading.Event(), threading.Event()

    def park() -> str:
        stuck.set()
        release.wait(30)
        return "late"

    outcomes: list[object] = []

    def ask(call) -> None:
        try:
            outcomes.append(turns.run(call))
        except BaseException as exc:
            outcomes.append(exc)

    askers = [threading.Thread(target=ask, args=(call,)) for call in (park, lambda: 1, lambda: 2)]
    try:
        askers[0].start()
        assert stuck.wait(10)
        for asker in askers[1:]:
            asker.start()
        deadline = time.monotonic() + 10
        while len(turns._calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        lost = ConnectionError("the worker was lost")
        assert turns.abandon_calls(lost) == 3
        for asker in askers:
            asker.join(10)
        assert outcomes == [lost, lost, lost]
        assert turns.abandon_calls(lost) == 0  # nothing left to end
        release.set()  # the stuck call returns after all: its result is dropped quietly
        assert turns.run(lambda: 3) == 3  # and the loop goes on
    finally:
        release.set()
        turns.close()


def test_unthreaded_calls_run_in_the_callers_thread():
    turns = Turns(table())
    assert not turns.threaded
    assert turns.run(threading.current_thread) is threading.current_thread()


def test_a_shared_decode_is_charged_by_what_each_pass_would_cost_alone():
    turns = Turns(table(), threaded=True, decode_passes=Recorder())
    turns.weigh = lambda k: 1.0 + 0.25 * (k - 1)  # a pass of 5 tokens costs 2 of 1 token
    one, five = Scripted(0, 1), Scripted(1, 1, size=5)
    run_together(turns, [one, five])
    shares = [runner.results[0].seconds for runner in (one, five)]  # type: ignore[union-attr]
    assert shares[1] == pytest.approx(2 * shares[0])


class Drafting(Scripted):
    """An answer whose every step drafts: ``drafts`` draft-model decodes, then its pass."""

    def __init__(self, sequence: int, passes: int, drafts: int):
        super().__init__(sequence, passes)
        self.drafts = drafts
        self.drafted = 0

    def advance(self, result: Passed | BaseException | None) -> Pass | DraftPass | None:
        if result is not None:
            self.results.append(result)
        if self.left == 0:
            self.finished = True
            self.done.set()
            return None
        if self.drafted < self.drafts:
            self.drafted += 1
            return DraftPass([self.sequence])
        self.drafted = 0
        self.left -= 1
        return Pass([self.sequence] * 2)


def test_the_answers_draft_model_decodes_are_batched_before_their_passes():
    """Within a round each answer drafts (its draft model's decodes shared with the others
    still drafting), then all the round's target passes are one decode."""
    log: list[tuple[str, list[int]]] = []

    def recorder(kind: str):
        def decode(passes: list[tuple[int, list[int]]]) -> list[np.ndarray]:
            log.append((kind, [seq for seq, _ in passes]))
            rows = 1 if kind == "draft" else 2
            return [np.full((rows, 3), seq, dtype=np.float32) for seq, _ in passes]

        return decode

    turns = Turns(table(), threaded=True, decode_passes=recorder("target"), decode_drafts=recorder("draft"))
    short, long, plain = Drafting(0, 2, drafts=1), Drafting(1, 2, drafts=3), Scripted(2, 2)
    run_together(turns, [short, long, plain])
    # Each pass is asked as its answer's drafting ends; the decode orders them by sequence.
    one_round = [("draft", [1, 0]), ("draft", [1]), ("draft", [1]), ("target", [2, 0, 1])]
    assert log == one_round * 2
    shapes = [r.logits.shape for r in long.results]  # type: ignore[union-attr]
    assert shapes == ([(1, 3)] * 3 + [(2, 3)]) * 2
    assert [r.shared for r in long.results] == [True, False, False, True] * 2  # type: ignore[union-attr]


class Clock:
    """The engine's clock, moved on only by what the scripted decodes and batches cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Reading(Scripted):
    """An answer reading its prompt: ``batches`` turns that each cost ``cost`` seconds and
    ask for no pass; then its passes. Stopped, it ends at its next turn."""

    def __init__(self, sequence: int, batches: int, cost: float, clock: Clock, log: list, read=lambda: None):
        super().__init__(sequence, passes=1)
        self.batches, self.cost, self.clock, self.log = batches, cost, clock, log
        self.read = read  # called after each batch

    def advance(self, result: Passed | BaseException | None) -> Pass | None:
        if self.stopping:
            self.log.append(("end", self.sequence))
            self.finished = True
            self.done.set()
            return None
        if self.batches:
            self.batches -= 1
            self.clock.now += self.cost
            self.log.append(("read", self.sequence))
            self.read()
            return None
        return super().advance(result)


class Asking(Scripted):
    """A short question: its first turn reads its whole prompt (``prompt_s`` seconds) and
    sends its first token; then one step a turn."""

    told = True

    def __init__(self, sequence: int, passes: int, prompt_s: float, clock: Clock, log: list):
        super().__init__(sequence, passes)
        self.prompt_s, self.clock, self.log = prompt_s, clock, log
        self.asked = False

    def advance(self, result: Passed | BaseException | None) -> Pass | None:
        if not self.asked:
            self.asked = True
            self.clock.now += self.prompt_s
            self.log.append(("asked", self.sequence))
        return super().advance(result)


def timed_decode(clock: Clock, cost: float, log: list):
    def decode(passes: list[tuple[int, list[int]]]) -> list[np.ndarray]:
        clock.now += cost
        log.extend(("pass", seq) for seq, _ in passes)
        return [np.zeros((len(tokens), 3), dtype=np.float32) for _, tokens in passes]

    return decode


def test_a_prompt_being_read_shares_the_engine_by_time_with_the_answers_decoding():
    """A batch of a long prompt costs as much as many steps: the answer decoding beside it
    gets about a batch's seconds of steps between two batches, not one step."""
    clock, log = Clock(), []
    step, batch = AHEAD_S / 10, 4 * AHEAD_S
    turns = Turns(table(), threaded=True, decode_passes=timed_decode(clock, step, log), clock=clock)
    decoding, reading = Scripted(0, 300), Reading(1, batches=5, cost=batch, clock=clock, log=log)
    run_together(turns, [decoding, reading])
    reads = [i for i, entry in enumerate(log) if entry == ("read", 1)]
    steps = [i for i, entry in enumerate(log) if entry == ("pass", 0)]
    # After the first batch the steps catch up with it and the next (to within AHEAD_S: 70
    # steps); then each batch waits until the steps have had a batch's time again: 40.
    assert 69 <= sum(reads[0] < i < reads[1] for i in steps) <= 71
    for before, after in itertools.pairwise(reads[1:]):
        assert 39 <= sum(before < i < after for i in steps) <= 41


def test_a_question_asked_while_a_long_prompt_is_read_is_not_charged_its_prompt():
    """The question's prompt and first token take one turn, which is not charged: after it,
    the question gets its share of steps before the long prompt's next batch (a batch less
    AHEAD_S: 30 steps), not that share less what its prompt took (10)."""
    clock, log = Clock(), []
    step, batch = AHEAD_S / 10, 4 * AHEAD_S
    turns = Turns(table(), threaded=True, decode_passes=timed_decode(clock, step, log), clock=clock)
    question = Asking(1, passes=200, prompt_s=2 * AHEAD_S, clock=clock, log=log)
    joined = []

    def ask_once() -> None:
        if not joined:
            turns.enqueue(question)
            joined.append(question)

    reading = Reading(0, batches=3, cost=batch, clock=clock, log=log, read=ask_once)
    try:
        turns.enqueue(reading)
        assert reading.done.wait(10) and question.done.wait(10)
    finally:
        turns.close()
    asked, reads = log.index(("asked", 1)), [i for i, entry in enumerate(log) if entry == ("read", 0)]
    assert reads[0] < asked < reads[1]
    assert 29 <= sum(asked < i < reads[1] and entry == ("pass", 1) for i, entry in enumerate(log)) <= 31


def test_long_prompts_read_alone_go_on_together():
    """With no answer decoding, prompts being read take a batch each every round, as
    before: they end about together and then decode in shared passes."""
    clock, log = Clock(), []
    turns = Turns(table(), threaded=True, decode_passes=timed_decode(clock, AHEAD_S / 10, log), clock=clock)
    readers = [Reading(seq, batches=4, cost=4 * AHEAD_S, clock=clock, log=log) for seq in range(3)]
    run_together(turns, readers)
    reads = [seq for kind, seq in log if kind == "read"]
    assert reads == [2, 1, 0] * 4


def test_an_answer_stopped_while_its_prompt_waits_ends_at_once():
    clock, log = Clock(), []
    turns = Turns(table(), threaded=True, decode_passes=timed_decode(clock, 0.01, log), clock=clock)
    decoding, reading = Scripted(0, 10**6), Reading(1, batches=100, cost=100 * AHEAD_S, clock=clock, log=log)
    try:
        turns.enqueue(decoding)
        turns.enqueue(reading)
        while ("read", 1) not in log:
            time.sleep(0.001)
        log.append(("stop", 1))
        reading.stopping = True  # else it waits for thousands of steps
        assert reading.done.wait(10)
        between = log[log.index(("stop", 1)) : log.index(("end", 1))]
        assert sum(entry == ("pass", 0) for entry in between) <= 2  # it ends in the next round
        decoding.left = 0
        assert decoding.done.wait(10)
    finally:
        turns.close()


def test_a_paced_reader_gets_the_first_events_and_the_last_at_once():
    """``every_s`` spares the reading thread a wake per step, never the answer's start or
    end: here the pace is longer than the test may take."""
    turns = Turns(table(), threaded=True, decode_passes=Recorder())
    first_seen = threading.Event()

    def steps():
        yield "first"
        yield Pass([0])
        if not first_seen.wait(10):  # the reader waits out no pace for the first events
            raise AssertionError("the first event was held back")
        for i in range(30):
            yield i
            yield Pass([0])
        yield "last"

    class Scripted(Runner):
        def steps(self):
            return steps()

    got, started = [], time.perf_counter()
    try:
        for item in drive(turns, Scripted((), Cancel()), every_s=60.0):
            got.append(item)
            if item == "first":
                first_seen.set()
    finally:
        turns.close()
    assert got == ["first", *range(30), "last"]
    assert time.perf_counter() - started < 30  # the end is handed over at once, not after the pace


def test_an_unthreaded_answer_runs_in_its_readers_thread_in_rounds_of_one():
    """Where the loop runs is all "threaded" means: unthreaded, the reader's own thread
    admits its answer and decodes its passes, alone."""
    decode = Recorder()
    turns = Turns(table(1), decode_passes=decode)
    threads: set[str] = set()

    def steps():
        for i in range(3):
            threads.add(threading.current_thread().name)
            yield i
            passed = yield Pass([7, 7])
            assert passed.logits.shape == (2, 3) and not passed.shared

    class Scripted(Runner):
        def steps(self):
            return steps()

    answer = Scripted((), Cancel())
    assert list(drive(turns, answer)) == [0, 1, 2]
    assert decode.calls == [[0]] * 3 and threads == {threading.current_thread().name}
    assert turns.slots.busy == 0  # its slot went back as it ended
    # A reader that leaves stops its answer, which ends and gives its slot back.
    left = drive(turns, Scripted((), Cancel()))
    assert next(left) == 0
    left.close()
    assert turns.slots.busy == 0

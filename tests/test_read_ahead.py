"""Reading ahead (``decoding.read_ahead``): a prompt's beginning read into the cache below
every answer. With the loop alone (scripted work): it runs only while no answer runs or
waits, gives its slot back between two batches as one arrives, and goes on after it. On
the real pair: the tokens read ahead begin the final prompt, whatever question follows;
the answer reads only the rest and is the same, token for token, as without; an answer
asked meanwhile runs while the reading waits; a stop from another thread keeps what was
read; a pair without an engine thread reads ahead in the caller's thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import pytest

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.decoding.events import Done, Token
from edgespec.decoding.runner import PAUSE, Pass, Runner
from edgespec.decoding.slots import Cancel, Slots
from edgespec.decoding.turns import Turns
from edgespec.runtime.prompt_cache import GIB, CacheOptions
from tests.conftest import fresh

# -- the loop alone ------------------------------------------------------------------------


class Work:
    """Scripted background work: ``batches`` turns of reading, each noted in ``log``."""

    def __init__(self, batches: int, log: list[str], name: str = "read"):
        self.cancel = Cancel()
        self.left = batches
        self.log = log
        self.name = name
        self.ended = threading.Event()
        self.leases = 0

    def lease(self) -> Runner | None:
        if self.left == 0 or self.cancel.is_set():
            self.end()
            return None
        self.leases += 1
        work = self

        class Reading(Runner):
            def steps(self):
                return work.read()

        return Reading((), self.cancel)

    def read(self) -> Iterator[object]:
        while self.left > 0 and not self.cancel.is_set():
            self.log.append(self.name)
            self.left -= 1
            time.sleep(0.001)  # (a batch takes a while)
            yield PAUSE

    def end(self, error: BaseException | None = None) -> None:
        self.ended.set()


class Answer(Runner):
    """A scripted answer of ``passes`` one-token passes, each noted in ``log``."""

    def __init__(self, passes: int, log: list[str]):
        super().__init__((), Cancel())
        self.passes, self.log = passes, log

    def steps(self):
        return self._script()

    def _script(self):
        for _ in range(self.passes):
            self.log.append("answer")
            yield Pass([1])


def decode(passes: list[tuple[int, list[int]]]) -> list[np.ndarray]:
    return [np.zeros((len(tokens), 3), dtype=np.float32) for _, tokens in passes]


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 600) -> None:
    """Until ``condition`` holds (a guard against a hang, not a measure of speed)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def test_background_work_gives_way_to_an_answer_and_goes_on_after_it():
    log: list[str] = []
    turns = Turns(Slots(1, lambda _seq: []), threaded=True, decode_passes=decode)
    blocker = threading.Event()
    try:
        work = Work(10**6, log)
        turns.background(work)
        wait_for(lambda: len(log) >= 3, "the work reads")
        # Held between two rounds, the loop takes an answer: the work gives its slot back.
        held = threading.Thread(target=turns.run, args=(blocker.wait,))
        held.start()
        answer = Answer(5, log)
        turns.enqueue(answer)
        assert turns.arrival.is_set()  # a batch being read would stop for it
        blocker.set()
        assert answer.ended.wait(10)
        at_end = len(log)
        wait_for(lambda: len(log) > at_end + 2, "the work goes on after the answer")
        work.cancel.set()
        assert work.ended.wait(10)
    finally:
        blocker.set()
        turns.close()
    first, last = log.index("answer"), len(log) - 1 - log[::-1].index("answer")
    assert log[first : last + 1] == ["answer"] * 5  # nothing read while it ran
    assert work.leases == 2 and turns.slots.busy == 0 and turns.slots.lent == 0


def test_background_work_waits_for_every_answer_and_a_stop_while_it_waits_ends_it():
    log: list[str] = []
    slots = Slots(2, lambda _seq: [])
    turns = Turns(slots, threaded=True, decode_passes=decode)
    inside, blocker = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        blocker.wait()

    try:
        held = threading.Thread(target=turns.run, args=(hold,))
        held.start()
        assert inside.wait(10)  # the engine thread is in the call, between rounds
        answer = Answer(3, log)
        turns.enqueue(answer)
        waiting = Work(2, log)
        turns.background(waiting)
        stopped = Work(2, log, "stopped")
        turns.background(stopped)
        stopped.cancel.set()
        assert stopped.ended.wait(10) and stopped.leases == 0  # ended without running
        blocker.set()
        assert waiting.ended.wait(10)
    finally:
        blocker.set()
        turns.close()
    assert log == ["answer"] * 3 + ["read"] * 2  # a free slot is no reason to read beside it


def test_holding_the_pair_takes_a_lent_slot_back():
    log: list[str] = []
    turns = Turns(Slots(1, lambda _seq: []), threaded=True, decode_passes=decode)
    try:
        work = Work(10**6, log)
        turns.background(work)
        wait_for(lambda: len(log) >= 2, "the work reads")
        assert turns.slots.hold_all(timeout=10)
        seen = len(log)
        time.sleep(0.05)
        assert len(log) == seen  # nothing read while the pair is held
        turns.slots.release_all()
        wait_for(lambda: len(log) > seen, "the work goes on once the pair is let go")
        work.cancel.set()
        assert work.ended.wait(10)
    finally:
        turns.close()


def test_unthreaded_background_work_runs_in_the_callers_thread_to_its_end():
    log: list[str] = []
    turns = Turns(Slots(1, lambda _seq: []), decode_passes=decode)
    work = Work(4, log)
    turns.background(work)
    assert work.ended.is_set() and log == ["read"] * 4 and turns.slots.lent == 0


def test_a_lent_slot_is_no_answers():
    slots = Slots(2, lambda _seq: [])
    work = Work(1, [])
    runner = work.lease()
    assert runner is not None and slots.lend(runner)
    assert slots.busy == 0 and slots.answers() == [] and slots.lent == 1
    assert not slots.lend(Work(1, []).lease())  # one at a time
    slots.give_back(runner)
    assert slots.lent == 0 and slots.lendable()


# -- the real pair ---------------------------------------------------------------------------


def code_file(lines: int, seed: int) -> str:
    lines_of = (f"def step_{i}(x):\n    return x * {i} + {i * seed % 7}  # note {i}\n" for i in range(lines))
    return "\n".join(lines_of)


HISTORY = [
    {"role": "user", "content": "I will send you some code."},
    {"role": "assistant", "content": "Send it; I will read it."},
]


def attached(text: str) -> str:
    return f"File step.py:\n```python\n{text}\n```\n\n"


def final(partial: str, question: str) -> list[dict[str, str]]:
    return [*HISTORY, {"role": "user", "content": partial + question}]


@pytest.fixture(scope="module")
def lm() -> Iterator[EdgeSpec]:
    """The pair as the app runs it: an engine thread, one slot, a prompt cache."""
    options = RuntimeOptions(n_ctx=2048, engine_thread=True, cache=CacheOptions(ram_bytes=GIB // 2))
    pair = EdgeSpec(options=options, quiet=True)
    yield pair
    pair.close()


def test_the_tokens_read_ahead_begin_the_final_prompt_whatever_follows(pair):
    cases = [
        (attached(code_file(3, 1)), ["What does step_2 return?", "\n\nExplain.", " and also", "1 + 1"]),
        ("Here is a note about compu", ["ters and caches.", "te(x)", "ting"]),
        ("Numbers: 12", ["345 and 6", ".5", " apples"]),
        ("Ends with spaces   ", ["word", "\nline", "   more"]),
    ]
    for partial, questions in cases:
        prefix = pair.prompt_prefix_tokens(HISTORY, partial)
        history = pair.prompt_tokens(HISTORY, chat=True)
        assert len(prefix) > len(history) // 2  # the chat so far is most of it at least
        for question in questions:
            whole = pair.prompt_tokens(final(partial, question), chat=True)
            assert whole[: len(prefix)] == prefix, (partial, question)


def test_an_answer_after_reading_ahead_reads_only_the_rest_and_is_the_same(lm):
    # A prompt whose greedy answer changes when the part of a batch read ahead is read
    # apart from the rest of its batch (the reason whole batches only are read ahead).
    partial = attached(code_file(10, 1))
    messages = final(partial, "What does step_3 return for 2?")

    def ask():
        return lm.generate(messages, chat=True, drafter="model", gamma=3, max_tokens=16)

    reference = ask_afresh(lm, messages)
    prefix = lm.prompt_prefix_tokens(HISTORY, partial)
    assert 200 <= len(prefix) <= 600
    lm.start_afresh()
    reading = lm.read_ahead(prefix)
    assert reading.wait(600) and reading.done and not reading.stopped
    read, goal = reading.progress()
    chunk = lm.target.prefill_chunk
    assert read == goal and len(prefix) - chunk < goal <= len(prefix)
    assert lm.cached_tokens(prefix) >= goal
    answer = ask()
    assert answer.stats.reused_tokens >= goal > len(prefix) - chunk
    assert answer.token_ids == reference.token_ids and answer.text == reference.text


def test_an_answer_asked_while_its_beginning_is_read_goes_on_from_what_was_read(lm):
    """Enter pressed before the files are read: the answer takes the reading's slot with
    what it read, reads the rest itself, and is the same; the reading then finds its
    tokens held and is done."""
    partial = attached(code_file(30, 2))
    messages = final(partial, "Which step adds 4? Name one.")

    def ask():
        return lm.generate(messages, chat=True, drafter="model", gamma=3, max_tokens=16)

    reference = ask_afresh(lm, messages)
    prefix = lm.prompt_prefix_tokens(HISTORY, partial)
    chunk = lm.target.prefill_chunk
    assert len(prefix) > 4 * chunk
    lm.start_afresh()
    reading = lm.read_ahead(prefix, owner="tab")
    wait_for(lambda: reading.progress()[0] >= chunk, "a batch read")
    read_before = reading.progress()[0]
    answer = ask()
    assert answer.stats.reused_tokens >= read_before
    assert answer.token_ids == reference.token_ids
    assert reading.wait(60) and reading.done
    assert reading.progress() == (len(prefix), len(prefix))


def ask_afresh(lm: EdgeSpec, messages: list[dict[str, str]]) -> Done:
    """The answer as it is without reading ahead: its whole prompt read by the answer itself,
    whatever earlier tests left in the pair's prompt cache (a baseline's reuse limit)."""
    lm.start_afresh()
    request = replace(lm.request(messages, chat=True, drafter="model", gamma=3, max_tokens=16), reuse_limit=0)
    done = next(e for e in lm.submit(request).events() if isinstance(e, Done))
    assert done.stats.reused_tokens == 0
    return done


def test_an_answer_asked_while_reading_ahead_runs_first_and_the_reading_goes_on_after(lm):
    lm.start_afresh()
    tokens = lm.prompt_prefix_tokens(HISTORY, attached(code_file(60, 5)))
    assert len(tokens) > 1200
    reading = lm.read_ahead(tokens, owner="tab")
    chunk = lm.target.prefill_chunk
    wait_for(lambda: reading.progress()[0] >= chunk, "a batch read")
    seen: list[int] = []
    for event in lm.stream("Say hello in French.", chat=True, max_tokens=8, drafter="none"):
        if isinstance(event, Token | Done):
            seen.append(reading.progress()[0])
    assert not reading.done  # the answer ended first, far from the end of the reading
    assert len(set(seen)) == 1  # nothing was read while it ran
    # The answer took the reading's one slot: its state went to the prompt cache, and the
    # reading goes on from where it was.
    wait_for(lambda: reading.progress()[0] > seen[0], "the reading goes on")
    reading.stop()
    assert reading.wait(60) and reading.stopped


def test_a_stop_from_another_thread_keeps_what_was_read(lm):
    lm.start_afresh()
    tokens = lm.prompt_prefix_tokens(HISTORY, attached(code_file(40, 7)))
    reading = lm.read_ahead(tokens, owner="tab")
    chunk = lm.target.prefill_chunk
    wait_for(lambda: reading.progress()[0] >= chunk, "a batch read")
    stopper = threading.Thread(target=reading.stop)
    stopper.start()
    stopper.join()
    assert reading.wait(60) and reading.stopped and not reading.done
    read = reading.progress()[0]
    assert read >= chunk
    assert lm.cached_tokens(tokens) >= read


def test_a_second_read_ahead_of_an_owner_stops_the_first(lm):
    lm.start_afresh()
    first = lm.read_ahead(lm.prompt_prefix_tokens(HISTORY, attached(code_file(40, 8))), owner="tab")
    other = lm.read_ahead(lm.prompt_prefix_tokens(HISTORY, attached(code_file(4, 9))), owner="other tab")
    second = lm.read_ahead(lm.prompt_prefix_tokens(HISTORY, attached(code_file(5, 8))), owner="tab")
    assert first.wait(60) and first.stopped
    assert other.wait(600) and other.done and second.wait(600) and second.done
    with pytest.raises(Exception, match="token ids"):
        lm.read_ahead([-1])


def test_without_an_engine_thread_reading_ahead_runs_in_the_callers_thread(pair):
    fresh(pair)
    partial = attached(code_file(8, 4))
    prefix = pair.prompt_prefix_tokens(HISTORY, partial)
    reading = pair.read_ahead(prefix)
    assert reading.done  # read when the call returns
    read, goal = reading.progress()
    assert read == goal > len(prefix) - pair.target.prefill_chunk
    question = "What does step_3 return for 1?"
    done = pair.generate(final(partial, question), chat=True, drafter="none", max_tokens=8)
    assert done.stats.reused_tokens >= goal

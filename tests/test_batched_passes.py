"""Several sequences' target passes in one ``llama_decode`` on the real target: each pass
gets its own rows (what it gives decoded alone, up to the kernels' rounding) and only its
own sequence grows; a pass that does not fit is refused before anything is decoded; and
answers running at once on a threaded engine share their passes and still answer as they
do alone, their draft model's steps batched too; and the draft model reads a new
answer's prompt a batch per turn."""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from conftest import fresh

from edgespec.decoding.engine import Engine
from edgespec.decoding.events import Done, Step, Token
from edgespec.decoding.policy import FixedPolicy
from edgespec.decoding.request import GenerationSettings, Request
from edgespec.decoding.turns import PAUSE, DraftPass, Pass, Passed
from edgespec.runtime.model import DecodeAborted, DecodeYielded, LoadOptions, Model

pytestmark = pytest.mark.needs_models

PROMPTS = (
    "The days of the week are Monday, Tuesday,",
    "def add(a, b):\n    return",
    "1, 2, 3, 4, 5, 6,",
)


@pytest.fixture(scope="module")
def target(target_path: Path) -> Model:
    model = Model(target_path, LoadOptions(n_ctx=256, n_seq=3, max_outputs=9))
    yield model
    model.close()


def prefill(model: Model) -> list[list[int]]:
    prompts = [model.tokenize(text) for text in PROMPTS]
    for seq, tokens in enumerate(prompts):
        model.sequence(seq).reset()
        model.sequence(seq).decode(tokens, 1)
    return prompts


def test_each_pass_in_a_shared_decode_gets_its_own_rows(target: Model) -> None:
    prompts = prefill(target)
    more = (" Wednesday", " a + b", " 7, 8")  # passes of different lengths
    passes = [(seq, target.tokenize(text, add_special=False)) for seq, text in enumerate(more)]
    alone = []
    for seq, tokens in passes:
        alone.append(target.sequence(seq).decode(tokens, len(tokens)).copy())
        target.sequence(seq).keep(len(prompts[seq]))
    # Asked out of order: the rows still come back in the order asked.
    shared = target.decode_passes(list(reversed(passes)))[::-1]
    for (seq, tokens), rows, reference in zip(passes, shared, alone, strict=True):
        assert rows.shape == (len(tokens), target.n_vocab)
        assert (rows.argmax(axis=1) == reference.argmax(axis=1)).all()
        # Batch shapes round differently (0.3 here); another sequence's rows differ by about 20.
        assert np.abs(rows - reference).max() < 2.0
        assert target.sequence(seq).tokens == prompts[seq] + tokens
        assert target.sequence(seq).cache_span() == (0, len(prompts[seq]) + len(tokens) - 1)


def test_a_pass_alone_keeps_its_rows_past_the_next_decode(target: Model) -> None:
    """Its answer reads them in the next round, after another answer may have decoded (a
    new one, whose first token goes first)."""
    prefill(target)
    rows = target.decode_passes([(0, target.tokenize(" Wednesday", add_special=False))])[0]
    kept = rows.copy()
    target.sequence(1).decode(target.tokenize(" b", add_special=False), 1)
    assert np.array_equal(rows, kept)


def test_a_pass_that_does_not_fit_is_refused_and_nothing_is_decoded(target: Model) -> None:
    prompts = prefill(target)
    too_long = [1] * (target.options.max_outputs + 1)
    with pytest.raises(ValueError, match="does not fit"):
        target.decode_passes([(0, [5]), (2, too_long)])
    for seq, tokens in enumerate(prompts):
        held = target.sequence(seq)
        assert held.tokens == tokens and held.cache_span() == (0, len(tokens) - 1)


def test_answers_at_once_share_their_passes_and_answer_as_they_do_alone(target: Model) -> None:
    prefill(target)  # (the answers find none of their prompts cached: each reads it whole)
    engine = Engine(target, threaded=True)
    settings = GenerationSettings(max_tokens=12)
    requests = [Request(tuple(target.tokenize(text)), settings) for text in PROMPTS]
    try:
        alone = [answer(engine, request, seq) for seq, request in enumerate(requests)]
        together = at_once(engine, requests)
    finally:
        engine.turn.close()
    assert [done.text for done in together] == [done.text for done in alone]
    assert all(done.stats.shared_passes == 0 for done in alone)
    assert sum(done.stats.shared_passes for done in together) > 0


@pytest.fixture(scope="module")
def draft(draft_path: Path) -> Model:
    model = Model(draft_path, LoadOptions(n_ctx=256, n_seq=3, max_outputs=9))
    yield model
    model.close()


def test_a_draft_model_step_of_several_sequences_gives_each_its_last_row(draft: Model) -> None:
    prompts = prefill(draft)
    more = (" Wednesday", " a", " 7, 8")
    passes = [(seq, draft.tokenize(text, add_special=False)) for seq, text in enumerate(more)]
    alone = []
    for seq, tokens in passes:
        alone.append(draft.sequence(seq).decode(tokens, 1).copy())
        draft.sequence(seq).keep(len(prompts[seq]))
    shared = draft.decode_passes(passes, last=True)
    for (seq, tokens), row, reference in zip(passes, shared, alone, strict=True):
        assert row.shape == (1, draft.n_vocab) and row.argmax() == reference.argmax()
        assert np.abs(row - reference).max() < 2.0
        assert draft.sequence(seq).tokens == prompts[seq] + tokens


def test_answers_drafting_at_once_share_the_draft_models_steps(target: Model, draft: Model) -> None:
    """Their draft model's decodes are batched across the answers, and each answer is still
    the target's own (greedy: the text it gives alone)."""
    engine = Engine(target, draft, threaded=True)
    steps: list[int] = []
    decode_drafts = engine.turn._decode_drafts
    engine.turn._decode_drafts = lambda passes: steps.append(len(passes)) or decode_drafts(passes)
    # (The first prompt has a near-tie, ", and Saturday" or ", Saturday, and", that passes
    # of other shapes part, with the draft model's steps batched or not.)
    texts = PROMPTS[1:]
    requests = [Request(tuple(target.tokenize(text)), GenerationSettings(max_tokens=12)) for text in texts]
    policy = partial(FixedPolicy, "model", 3)
    try:
        empty(engine, len(requests))
        alone = [answer(engine, request, seq, policy()) for seq, request in enumerate(requests)]
        assert set(steps) == {1}
        together = at_once(engine, requests, policy)
    finally:
        engine.turn.close()
    assert [done.text for done in together] == [done.text for done in alone]
    assert max(steps) == len(requests)
    assert sum(done.stats.drafted for done in together) > 0


def at_once(engine: Engine, requests: list[Request], policy=None) -> list[Done]:
    """The answers to ``requests`` run at once (sequence i each), from empty caches; the
    engine is held until all have joined, whatever this machine's load."""
    empty(engine, len(requests))
    together: list[Done | None] = [None] * len(requests)

    def run(seq: int) -> None:
        together[seq] = answer(engine, requests[seq], seq, policy() if policy else None)

    blocker = threading.Event()
    held = threading.Thread(target=engine.turn.run, args=(blocker.wait,))
    held.start()
    threads = [threading.Thread(target=run, args=(seq,)) for seq in range(len(requests))]
    for thread in threads:
        thread.start()
    while engine.slots.waiting + engine.slots.busy < len(threads):  # all queued or admitted
        time.sleep(0.01)
    blocker.set()
    for thread in [held, *threads]:
        thread.join(120)
    assert all(done is not None for done in together)
    return together  # type: ignore[return-value]


def empty(engine: Engine, sequences: int) -> None:
    for model in (engine.target, engine.draft):
        for seq in range(sequences if model is not None else 0):
            model.sequence(seq).reset()


def answer(engine: Engine, request: Request, seq: int, policy=None) -> Done:
    generation = engine.start(request, policy)  # (the slot table gives it a free sequence)
    done = [event for event in generation.events() if isinstance(event, Done)]
    return done[0]


def test_the_draft_model_reads_a_long_prompt_a_batch_per_turn(pair) -> None:
    """What lets other answers step between the batches of a new answer's draft prefill."""
    from edgespec.decoding.drafters import AnswerSetup
    from edgespec.decoding.drafters.model import ModelDrafter

    draft = pair.draft.sequence(0)
    draft.reset()
    drafter = ModelDrafter(pair.draft, pair.target)
    drafter.begin(
        AnswerSetup(
            prompt=[],
            prediction=[],
            constraint=None,
            cancel=threading.Event(),
            clock=time.perf_counter,
            sequence=draft.seq,
        )
    )
    context = pair.target.tokenize("Tell me about the sea. " * 40)
    turns = 1
    drafter.prefill(context, 128)
    while drafter.catch_up_tokens(context) > 1:
        assert len(draft.tokens) == 128 * turns
        drafter.prefill(context, 128)
        turns += 1
    assert turns == -(-(len(context) - 1) // 128) and draft.tokens == context[:-1]


def raw_turns(pair, answer) -> list[str]:
    """An unthreaded answer's steps as the engine thread would see them, each named:
    "token", "step", or "pause:N" (its turn ends, the draft model N tokens in)."""
    seen: list[str] = []
    steps, result = answer._run(), None
    while True:
        try:
            item = steps.send(result)
        except StopIteration:
            return seen
        result = None
        if item is PAUSE:
            seen.append(f"pause:{len(pair.draft.sequence(answer.sequence).tokens)}")
        elif isinstance(item, Token | Step):
            seen.append(type(item).__name__.lower())
        elif isinstance(item, Pass | DraftPass):  # decoded as the loop decodes them
            model = pair.target if isinstance(item, Pass) else pair.draft
            rows = model.decode_passes([(answer.sequence, item.tokens)], last=isinstance(item, DraftPass))
            result = Passed(rows[0], 0.0)


def batches(context: int, leave: int) -> list[int]:
    """The draft model's length after each batch of 128 until ``leave`` tokens are left."""
    read, lengths = 0, []
    while context - read > leave:
        read = min(read + 128, context - 1)
        lengths.append(read)
    return lengths


# Long enough for the draft model to read it in more than two batches of 128. The two
# tests below read it from an empty draft model; the target keeps it between them (its
# prefill costs more than the rest of both, and neither test is about the target's).
HILLS = "Tell me about the hills. " * 50


def test_the_first_token_ends_its_turn_before_the_draft_model_reads_the_prompt(pair) -> None:
    """So a new answer's first token reaches its reader after the target's prefill alone."""
    pair.draft.sequence(0).reset()
    request = pair.request(HILLS, drafter="model", gamma=3, max_tokens=4)
    answer = pair.submit(request)
    seen = raw_turns(pair, answer)
    seen = seen[seen.index("token") :]  # (before it, the target's batches of the prompt)
    context = len(answer.request.prompt) + 1
    assert seen[:2] == ["token", "pause:0"]
    reads = [int(item.split(":")[1]) for item in seen if item.startswith("pause:")]
    assert reads == [0, *batches(context, leave=1)] and len(reads) > 2
    assert "step" in seen


def test_a_draft_model_chosen_late_catches_up_a_batch_per_turn(pair) -> None:
    """What lets other answers step while the draft model reads a context it was not
    reading (``auto`` chooses it after plain steps)."""
    pair.draft.sequence(0).reset()
    request = pair.request(HILLS, drafter="model", gamma=3, max_tokens=4)
    answer = pair.submit(request)
    answer.policy.prefill_draft = False  # as ``auto``: the draft model is not read ahead
    seen = raw_turns(pair, answer)
    seen = seen[seen.index("token") :]
    context = len(answer.request.prompt) + 1
    reads = [int(item.split(":")[1]) for item in seen if item.startswith("pause:")]
    # Batches while more than one is left; the rest is read as it drafts, in the step.
    assert seen[0] == "token" and reads == batches(context, leave=128) and len(reads) > 1
    assert seen[1 + len(reads)] == "step"


def test_a_prompt_batch_yields_to_an_arrival_and_reads_the_same_again(target: Model) -> None:
    """A batch given an arrival stops once it is set, keeping nothing; read again, it gives
    the state it would have given; a decode with outputs never yields."""
    arrival = threading.Event()
    tokens = target.tokenize("The lighthouse keeper counted the ships. " * 12)[:128]
    sequence = target.sequence(0)
    sequence.reset()
    sequence.decode(tokens[:-1], 0)
    reference = sequence.decode(tokens[-1:], 1).copy()
    sequence.reset()
    arrival.set()
    with pytest.raises(DecodeYielded):
        sequence.decode(tokens[:-1], 0, arrival=arrival)
    assert sequence.tokens == [] and sequence.cache_span() == (-1, -1)
    sequence.decode(tokens[:-1], 0)  # none given: read whole, whatever arrived
    again = sequence.decode(tokens[-1:], 1, arrival=arrival)  # outputs: it never yields
    assert sequence.tokens == tokens
    assert np.array_equal(again, reference)


def test_a_long_decode_stops_with_the_cancel_token_given_with_it_only(target: Model) -> None:
    """The abort callback reads the token of the decode in flight: a set one stops it,
    nothing kept, and no other sequence is touched; the next decode, given none, runs
    whole (the model remembers no token)."""
    tokens = target.tokenize("The lighthouse keeper counted the ships. " * 12)[:100]
    cancel = threading.Event()
    first, second = target.sequence(0), target.sequence(1)
    first.reset()
    second.reset()
    first.decode(tokens, 0, cancel=cancel)
    cancel.set()
    with pytest.raises(DecodeAborted):
        second.decode(tokens, 0, cancel=cancel)
    assert second.tokens == [] and second.cache_span() == (-1, -1)
    assert first.tokens == tokens and first.cache_span() == (0, len(tokens) - 1)
    second.decode(tokens, 0)
    assert second.cache_span() == (0, len(tokens) - 1)


def test_an_answer_whose_batches_yield_reads_each_again_and_answers_the_same(pair) -> None:
    """Every batch of the prompt yields once (an arrival that stays set), is read again the
    next turn, and the answer is the one it gives without arrivals."""
    text = "Tell me about the forest. " * 45  # three batches of 128 tokens
    fresh(pair)
    plain = pair.submit(pair.request(text, drafter="none", max_tokens=8))
    expected = raw_turns(pair, plain)
    expected_text = plain.text.text
    fresh(pair)
    arrival = pair.engine.turn.arrival  # (unthreaded, nothing else sets it)
    arrival.set()
    try:
        answer = pair.submit(pair.request(text, drafter="none", max_tokens=8))
        seen = raw_turns(pair, answer)
    finally:
        arrival.clear()
    batches_read = expected.index("token")  # a pause after each batch but the last
    assert seen[: 2 * batches_read] == ["pause:0"] * (2 * batches_read) and batches_read >= 2
    assert seen[2 * batches_read :] == expected[batches_read:]
    assert answer.text.text == expected_text

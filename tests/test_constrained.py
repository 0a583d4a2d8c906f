"""Constrained decoding through the real engine: under a grammar (a JSON schema's, or
GBNF), every drafter gives target-only's constrained answer token for token, the answer
follows the grammar, and a draft token the grammar forbids is never verified."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import NEAR_TIE
from states import start_from_prefill

from edgespec.api import settings_from
from edgespec.decoding.constrained import Constraint, best_allowed
from edgespec.decoding.events import Done, Token
from edgespec.decoding.grammar import GrammarSpec, GrammarState, constrained_argmax, schema_grammar
from edgespec.errors import EdgespecError

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "city": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "city", "age", "tags"],
}
PROMPT = (
    "Extract the person as JSON with keys name, city, age and tags.\n\n"
    "Margaret Okafor, 41, moved from Leeds to Porto last spring; she teaches cello and "
    "runs a small bakery. Tags: musician, baker, teacher."
)


def answer(pair, drafter, gamma, **settings) -> Done:
    return stream(pair, drafter, gamma, **settings)[-1]


def stream(pair, drafter, gamma, **settings) -> list:
    # Every answer starts from the prompt's one saved state: the KV bytes every drafter
    # verifies against are then the same as target-only's.
    tokens = pair.prompt_tokens(PROMPT, chat=True)
    start_from_prefill(pair, tokens)
    return list(pair.stream(tokens, drafter=drafter, gamma=gamma, max_tokens=64, **settings))


_constrained_target: list[tuple[Done, list[dict[int, float]]]] = []


def constrained_target(pair) -> tuple[Done, list[dict[int, float]]]:
    """Target-only's answer under the schema and, at each token, the log-probabilities of
    its best five: decoded once, every drafter's test compares with it."""
    if not _constrained_target:
        _constrained_target.append(with_tops(stream(pair, "none", 0, json_schema=SCHEMA, logprobs=5)))
    return _constrained_target[0]


@pytest.mark.parametrize(
    ("drafter", "gamma"), [("ngram", 8), ("copy", 12), ("grammar", 8), ("model", 3), ("auto", "auto")]
)
def test_every_drafter_gives_the_constrained_target_answer(pair, drafter, gamma):
    want, tops = constrained_target(pair)
    got = answer(pair, drafter, gamma, json_schema=SCHEMA)
    assert_the_targets_own(got, want, tops, drafter)
    for done in (want, got):
        record = json.loads(done.text)
        assert set(record) == {"name", "city", "age", "tags"} and isinstance(record["age"], int)
        assert done.text == json.dumps(record, separators=(",", ":"), ensure_ascii=False)  # compact


def with_tops(events: list) -> tuple[Done, list[dict[int, float]]]:
    """An answer streamed with ``logprobs`` and, at each token, its best log-probabilities."""
    return events[-1], [dict(event.top_logprobs) for event in events if isinstance(event, Token)]


def assert_the_targets_own(got: Done, want: Done, tops: list[dict[int, float]], label) -> None:
    """``got`` is target-only's ``want`` token for token, or parts from it where the
    target's two choices were within the rounding by which a verification pass of several
    tokens differs from one token alone (seen here: ' baker' against 'b'+'aker')."""
    pairs = zip(want.token_ids, got.token_ids, strict=False)
    split = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    if split is None:
        assert got.token_ids == want.token_ids, label
        return
    chosen, other = want.token_ids[split], got.token_ids[split]
    assert other in tops[split], (label, split, "a token target-only ranked below its best five")
    assert tops[split][chosen] - tops[split][other] < NEAR_TIE, (label, split)


def test_json_object_mode_and_the_length_limit(pair):
    done = answer(pair, "auto", "auto", json_object=True)
    assert isinstance(json.loads(done.text), dict)
    cut = list(pair.stream(PROMPT, chat=True, max_tokens=5, json_schema=SCHEMA))[-1]
    assert cut.stop_reason == "max_tokens" and cut.text.startswith("{")


def test_a_draft_stops_at_its_first_forbidden_token(pair):
    constraint = Constraint(pair.target, GrammarSpec(schema_grammar(SCHEMA)))
    good = pair.target.tokenize('{"name":"Margaret', add_special=False)
    prose = pair.target.tokenize("Margaret Okafor", add_special=False)
    assert constraint.allowed_prefix(good) == len(good)
    assert constraint.allowed_prefix(prose) == 0
    assert constraint.allowed_prefix(good[:2] + prose) == 2
    constraint.commit(good[:1])  # the state moves with the committed text only
    assert constraint.allowed_prefix(good[1:]) == len(good) - 1


def test_best_allowed_is_the_masked_argmax(pair):
    state = GrammarState(pair.target, GrammarSpec(schema_grammar(SCHEMA)))
    rng = np.random.default_rng(5)
    for _ in range(20):
        row = rng.normal(0, 3, pair.target.n_vocab).astype(np.float32)
        assert best_allowed(state, row) == constrained_argmax(state, row) == int(np.argmax(state.mask(row)))


def test_one_constraint_at_a_time():
    with pytest.raises(EdgespecError, match="one constraint"):
        settings_from(json_object=True, json_schema=SCHEMA)


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def test_answers_with_tools_are_the_targets_own_for_every_drafter(pair):
    """Tools offered (the model chooses) and a call required (a grammar from the tools'
    schemas, in the model's Hermes format): every drafter gives target-only's tokens."""
    from edgespec.server.tools import call_grammar

    messages = [{"role": "user", "content": "What is the weather in Porto and in Lyon? Use the tool."}]
    tokens = pair.prompt_tokens(messages, chat=True, tools=WEATHER)
    required = call_grammar("hermes", {"get_weather": WEATHER[0]["function"]["parameters"]}, parallel=True)
    for grammar in (None, required):
        # Every answer reads the prompt's last token on the state the first one left.
        events = pair.stream(tokens, drafter="none", gamma=0, max_tokens=32, grammar=grammar, logprobs=5)
        want, tops = with_tops(list(events))
        # (The copy drafter under a grammar: test_every_drafter_gives_the_constrained_target_answer.)
        for drafter, gamma in (("ngram", 8), ("model", 3), ("auto", "auto")):
            got = list(pair.stream(tokens, drafter=drafter, gamma=gamma, max_tokens=32, grammar=grammar))[-1]
            assert_the_targets_own(got, want, tops, (drafter, grammar is not None))
    assert want.text.startswith("<tool_call>\n{") and "get_weather" in want.text

"""Constrained decoding on llama.cpp's grammar engine: GBNF and JSON-schema grammars checked
against the real default target's vocabulary (151,936 tokens), and a greedy decode through
a grammar with the real model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from edgespec.decoding.grammar import (
    GrammarError,
    GrammarState,
    compile_grammar,
    constrained_argmax,
    incomplete_utf8_tail,
    json_object_grammar,
    schema_grammar,
)
from edgespec.errors import EdgespecError
from edgespec.runtime.model import LoadOptions, Model

YES_NO = 'root ::= "yes" | "no"'
SCHEMA_A = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


# --- without models ----------------------------------------------------------------------


def test_compile_accepts_a_grammar_and_keeps_its_root() -> None:
    spec = compile_grammar('answer ::= "ok"', root="answer")
    assert (spec.text, spec.root) == ('answer ::= "ok"', "answer")


@pytest.mark.parametrize(
    ("gbnf", "reason"),
    [
        ('root := "yes"', "expecting ::= at"),
        ("root ::= maybe", "Undefined rule identifier 'maybe'"),
        ('answer ::= "ok"', "does not contain a 'root' symbol"),
        ('root ::= root "a" | "b"', "left recursion"),
        ("   ", "the grammar is empty"),
    ],
)
def test_a_grammar_llama_cpp_rejects_is_one_error_with_its_reason(gbnf: str, reason: str) -> None:
    with pytest.raises(GrammarError) as caught:
        compile_grammar(gbnf)
    assert reason in str(caught.value)
    assert caught.value.param == "grammar"
    assert isinstance(caught.value, EdgespecError)
    assert "\n" not in str(caught.value)


def test_schema_grammar_is_compact() -> None:
    compact = schema_grammar(SCHEMA_A)
    assert 'space ::= ""' in compact.splitlines()
    assert '" "' not in compact
    loose = schema_grammar(SCHEMA_A, compact=False)
    assert 'space ::= " "?' in loose.splitlines()


def test_json_strings_exclude_control_characters() -> None:
    (char,) = [line for line in json_object_grammar().splitlines() if line.startswith("char ::= ")]
    assert char.startswith('char ::= [^"\\\\\\x7F\\x00-\\x1F]')
    compile_grammar(json_object_grammar())


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "tensor"}, "tensor"),
        ({"type": "string", "pattern": "abc"}, "Pattern must start with"),
        ({"$ref": "https://example.com/s.json"}, "Fetching remote schemas is not allowed"),
        ([{"type": "integer"}], "must be an object"),
    ],
)
def test_a_schema_the_converter_cannot_handle_names_response_format(schema: object, named: str) -> None:
    with pytest.raises(GrammarError) as caught:
        schema_grammar(schema)  # type: ignore[arg-type]
    assert caught.value.param == "response_format"
    assert named in str(caught.value)


def test_incomplete_utf8_tail() -> None:
    e_acute = "é".encode()
    ri = "日".encode()
    assert incomplete_utf8_tail(b"abc") == b""
    assert incomplete_utf8_tail(b"a" + e_acute[:1]) == e_acute[:1]
    assert incomplete_utf8_tail(b"a" + e_acute) == b""
    assert incomplete_utf8_tail(ri[:2]) == ri[:2]
    assert incomplete_utf8_tail(ri) == b""
    assert incomplete_utf8_tail(b"") == b""


# --- with the real vocabulary --------------------------------------------------------------


@pytest.fixture(scope="module")
def model(target_path: Path) -> Model:
    loaded = Model(target_path, LoadOptions(n_ctx=256, max_outputs=2))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def pieces(model: Model) -> list[bytes]:
    return [model.piece(token) for token in range(model.n_vocab)]


def allowed(state: GrammarState) -> set[int]:
    row = np.zeros(state._scratch.n_vocab, dtype=np.float32)
    return {int(t) for t in np.flatnonzero(state.mask(row) != -np.inf)}


def token(model: Model, text: str) -> int:
    (only,) = model.tokenize(text, add_special=False)
    return only


@pytest.mark.needs_models
def test_mask_allows_exactly_the_tokens_that_start_yes_or_no(model: Model, pieces: list[bytes]) -> None:
    expected = {t for t, p in enumerate(pieces) if p and (b"yes".startswith(p) or b"no".startswith(p))}
    with GrammarState(model, compile_grammar(YES_NO)) as state:
        assert allowed(state) == expected
        assert token(model, "yes") in expected and token(model, "n") in expected
        row = np.random.default_rng(1).standard_normal(model.n_vocab).astype(np.float32)
        masked = state.mask(row)
        kept = sorted(expected)
        assert np.array_equal(masked[kept], row[kept])  # a copy: the allowed logits untouched
        assert state.allows(token(model, "yes")) and not state.allows(token(model, "maybe"))
        assert not state.done() and state.forced() is None


@pytest.mark.needs_models
def test_after_ye_only_s_remains_and_is_forced(model: Model, pieces: list[bytes]) -> None:
    with GrammarState(model, compile_grammar(YES_NO)) as state:
        state.accept(token(model, "ye"))
        s = token(model, "s")
        assert allowed(state) == {s}
        assert state.forced() == s
        state.accept(s)
        assert state.done() and state.allows(model.eos)
        assert all(model.is_eog(t) for t in allowed(state))  # only the end remains


@pytest.mark.needs_models
def test_a_refused_token_raises_instead_of_aborting_llama_cpp(model: Model) -> None:
    with GrammarState(model, compile_grammar(YES_NO)) as state:
        with pytest.raises(ValueError):
            state.accept(model.eos)  # llama.cpp aborts the process on an EOG it cannot end at
        with pytest.raises(ValueError):
            state.accept(token(model, "maybe"))
        state.accept(token(model, "no"))  # the state is still usable
        assert state.done()
    with pytest.raises(ValueError):
        state.allows(0)  # closed


@pytest.mark.needs_models
def test_a_clone_moves_on_alone(model: Model) -> None:
    yes, no = token(model, "yes"), token(model, "no")
    with GrammarState(model, compile_grammar(YES_NO)) as state:
        with state.clone() as branch:
            branch.accept(token(model, "ye"))
            assert not branch.allows(no) and not branch.allows(yes)
            assert state.allows(no) and state.allows(yes) and not state.done()
            deeper = branch.clone()
        deeper.accept(token(model, "s"))  # its parent is closed: the copy owns its stacks
        assert deeper.done()
        deeper.close()
        state.accept(no)
        assert state.done()


@pytest.mark.needs_models
def test_constrained_argmax_falls_back_only_when_the_argmax_is_refused(model: Model) -> None:
    yes, no, maybe = token(model, "yes"), token(model, "no"), token(model, "maybe")
    with GrammarState(model, compile_grammar(YES_NO)) as state:
        row = np.zeros(model.n_vocab, dtype=np.float32)
        row[[maybe, no, yes]] = [9.0, 5.0, 3.0]
        assert constrained_argmax(state, row) == no
        row[yes] = 12.0
        assert constrained_argmax(state, row) == yes


@pytest.mark.needs_models
def test_a_schema_forces_the_brace_and_then_the_key(model: Model, pieces: list[bytes]) -> None:
    with GrammarState(model, compile_grammar(schema_grammar(SCHEMA_A))) as state:
        first = allowed(state)
        assert first and all(pieces[t].startswith(b"{") for t in first)
        assert token(model, "{") in first and token(model, "{}") not in first  # "a" is required
        state.accept(token(model, '{"'))
        assert state.forced() == token(model, "a")  # the only key there is
        state.accept(token(model, "a"))
        after_key = {pieces[t] for t in allowed(state)}
        assert b'":' in after_key and all(re.fullmatch(rb'":?|":[-0-9]+', p) for p in after_key)
        state.accept(token(model, '":'))
        assert not state.allows(token(model, " "))  # compact: no space before the value
        assert state.allows(token(model, "5"))


@pytest.mark.needs_models
def test_token_references_need_the_model(model: Model) -> None:
    gbnf = 'root ::= "ok" <|im_start|>'
    with pytest.raises(GrammarError, match="no vocab to parse token"):
        compile_grammar(gbnf)
    (im_start,) = model.tokenize("<|im_start|>", add_special=False, parse_special=True)
    with GrammarState(model, compile_grammar(gbnf, model=model)) as state:
        state.accept(token(model, "ok"))
        assert state.forced() == im_start
        state.accept(im_start)
        assert state.done()


@pytest.mark.needs_models
def test_a_character_split_across_tokens(model: Model, pieces: list[bytes]) -> None:
    lead, rest = "é".encode()
    lead_token, rest_token = pieces.index(bytes([lead])), pieces.index(bytes([rest]))
    with GrammarState(model, compile_grammar('root ::= "a" "é"?')) as state:
        state.accept(token(model, "a"))
        assert state.done()
        assert state.allows(lead_token)  # half a character: allowed, it can complete to é
        state.accept(lead_token)
        # llama.cpp would let the text end here, on a broken character.
        assert not state.done() and model.eos not in allowed(state)
        assert allowed(state) == {t for t, p in enumerate(pieces) if p == bytes([rest])} == {rest_token}
        state.accept(rest_token)
        assert state.done()


@pytest.mark.needs_models
def test_greedy_decode_through_a_schema_gives_json_that_matches_it(model: Model) -> None:
    sequence = model.sequence(0)
    sequence.reset()
    prompt = model.tokenize("Give a JSON object with key a set to 5\n")
    row = sequence.decode(prompt)[-1]
    out: list[int] = []
    with GrammarState(model, compile_grammar(schema_grammar(SCHEMA_A))) as state:
        for _ in range(24):
            chosen = constrained_argmax(state, row)
            state.accept(chosen)
            out.append(chosen)
            if state.done():
                break
            row = sequence.decode([chosen])[-1]
        assert state.done()
    value = json.loads(model.detokenize(out))
    assert list(value) == ["a"] and isinstance(value["a"], int)

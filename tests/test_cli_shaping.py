"""``edgespec generate`` with penalties, a JSON schema or a GBNF grammar, and
log-probabilities: the answer follows the constraint, and bad input is one line (exit 2)
before any model is loaded."""

from __future__ import annotations

import json

import pytest

from edgespec.errors import RequestError
from tests.conftest import run_cli

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.mark.needs_models
def test_schema_penalties_and_logprobs(tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(SCHEMA))
    result = run_cli(
        "generate", "--chat", "--prompt", "Ana Lima is 34. Give her as JSON.", "--json", "--json-schema",
        str(schema), "--logprobs", "2", "--presence-penalty", "0.3", "--max-tokens", "32", "--ctx", "512",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    record = json.loads(out["text"])
    assert set(record) == {"name", "age"} and record["age"] == 34
    assert len(out["logprobs"]) == out["stats"]["tokens"]
    assert all(entry["logprob"] <= 0 and len(entry["top"]) == 2 for entry in out["logprobs"])


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--logit-bias", "oops"], "ID=BIAS"),
        (["--presence-penalty", "5"], "presence_penalty"),
        (["--logprobs", "3"], "needs --json"),
        (["--json", "--logprobs", "40"], "from 0 to 20"),
        (["--json-schema", "/nonexistent/schema.json"], "cannot read"),
    ],
)
def test_bad_shaping_flags_are_one_line(args, words):
    result = run_cli("generate", "--prompt", "hi", *args)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_grammar_that_does_not_parse_names_the_reason(tmp_path):
    grammar = tmp_path / "bad.gbnf"
    grammar.write_text('root ::= "a" maybe\n')
    result = run_cli("generate", "--prompt", "hi", "--grammar", str(grammar))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "maybe" in result.stderr


@pytest.mark.needs_models
def test_a_logit_bias_outside_the_vocabulary_is_refused_alike_by_cli_and_api(pair):
    """The command and the Python API go through one request builder: a token id past the
    target's vocabulary is the same one-line refusal, never a bias silently dropped."""
    result = run_cli(
        "generate", "--prompt", "hi", "--logit-bias", "99999999=5", "--draft", "none", "--drafter", "none",
        "--gamma", "0", "--max-tokens", "1", "--ctx", "512",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    n_vocab = pair.target.n_vocab
    assert "99999999" in lines[0] and f"vocabulary of {n_vocab} tokens" in lines[0]
    with pytest.raises(RequestError) as made:
        pair.request("hi", logit_bias={99999999: 5.0})
    assert made.value.param == "logit_bias"
    assert lines[0] == f"edgespec: error: {made.value}"
    with pytest.raises(RequestError, match="outside the vocabulary"):
        next(pair.stream("hi", logit_bias={n_vocab: 5.0}, max_tokens=1))
    # The last id of the vocabulary is one: banned, it is never the answer.
    last = n_vocab - 1
    assert last not in pair.generate("hi", logit_bias={last: -100.0}, max_tokens=2).token_ids

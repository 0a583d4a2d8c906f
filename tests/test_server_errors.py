"""Bad requests against a real ``edgespec serve`` started with an API key: each gets its
status code and an OpenAI error body, and the server goes on answering afterwards."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest
from conftest import SERVER_KEY, run_cli
from test_models_cli import one_error_line

from tests.server_fixtures import REPO, Server

pytestmark = [pytest.mark.slow, pytest.mark.needs_models]  # every test here has the served pair

KEY = SERVER_KEY
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(keyed_server: Server) -> Server:
    return keyed_server


def post(server: Server, body: object | bytes, path: str = "/chat/completions", **headers: str):
    content = body if isinstance(body, bytes) else None
    return httpx.post(
        f"{server.base_url}{path}",
        json=None if content is not None else body,
        content=content,
        headers={**server.headers(), "Content-Type": "application/json", **headers},
        timeout=120,
    )


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_health_needs_no_key(server: Server) -> None:
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}


def test_health_says_loading_until_ready(server: Server) -> None:
    # The port opens before the pair is loaded: the first answers were 503 "loading".
    assert server.health_seen[0] == (503, {"status": "loading"})
    assert server.health_seen[-1] == (200, {"status": "ok"})
    assert {status for status, _ in server.health_seen} == {503, 200}


def test_api_key_is_required(server: Server) -> None:
    without = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HELLO, "max_tokens": 4})
    assert assert_error(without, 401)["code"] == "invalid_api_key"
    assert_error(httpx.get(f"{server.base_url}/models"), 401)
    wrong = httpx.get(f"{server.base_url}/models", headers={"Authorization": "Bearer nope"})
    assert_error(wrong, 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key="nope", max_retries=0).models.list()


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": []}, "messages", "empty"),
        ({}, "messages", "required"),
        ({"messages": "hi"}, "messages", "list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0]", "role"),
        ({"messages": [{"role": "user", "content": "   "}]}, "messages", "no user message"),
        ({"messages": HELLO, "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"messages": HELLO, "max_completion_tokens": -3}, "max_completion_tokens", "at least 1"),
        ({"messages": HELLO, "max_tokens": "ten"}, "max_tokens", "integer"),
        ({"messages": HELLO, "temperature": "hot"}, "temperature", "number"),
        ({"messages": HELLO, "temperature": 3}, "temperature", "[0, 2]"),
        ({"messages": HELLO, "stream": "yes"}, "stream", "true or false"),
        ({"messages": HELLO, "stop": 5}, "stop", "string"),
        ({"messages": HELLO, "seed": 1.5}, "seed", "integer"),
        ({"messages": HELLO, "n": 2}, "n", "must be 1"),
        ({"messages": HELLO, "functions": [{"name": "f"}]}, "functions", "not supported"),
        ({"messages": HELLO, "audio": {"voice": "alloy"}}, "audio", "not supported"),
        ({"messages": HELLO, "echo": True}, "echo", "not supported"),
        ({"messages": HELLO, "best_of": 3}, "best_of", "not supported"),
        ({"messages": HELLO, "drafter": "wizard"}, "drafter", "unknown drafter 'wizard'; choose one"),
        ({"messages": HELLO, "drafter": 7}, "drafter", "unknown drafter 7"),
        ({"messages": HELLO, "gamma": -1}, "gamma", "gamma must be 'auto' or from 0 to 64 (got -1)"),
        ({"messages": HELLO, "gamma": 100}, "gamma", "gamma 100 is more than the 64 tokens"),
        ({"messages": HELLO, "gamma": 1000}, "gamma", "the 64 tokens"),
        ({"messages": HELLO, "gamma": "lots"}, "gamma", "'auto' or a whole number (got 'lots')"),
        ({"messages": HELLO, "gamma": 2.5}, "gamma", "'auto' or a whole number"),
        ({"messages": HELLO, "gamma": True}, "gamma", "'auto' or a whole number"),
        ({"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options", "stream"),
        ({"messages": HELLO, "prediction": {"type": "image"}}, "prediction", "content"),
        ({"messages": HELLO, "logit_bias": {"99999999": 5}}, "logit_bias", "token 99999999, outside"),
        ({"messages": HELLO, "logit_bias": {"-3": 5}}, "logit_bias", "token ids"),
        ({"messages": HELLO, "repeat_penalty": 0}, "repeat_penalty", "positive"),
        ({"messages": HELLO, "presence_penalty": 10**400}, "presence_penalty", "[-2, 2]"),
        ({"messages": HELLO, "grammar": 'root ::= "a"', "json_schema": {}}, "json_schema", "one constraint"),
        ({"messages": HELLO, "top_p": 0}, "top_p", "top"),
        ({"messages": HELLO, "lenience": 2}, "lenience", "lenience"),
        ({"messages": HELLO, "verify": "maybe"}, "verify", "verify"),
    ],
)
def test_bad_field_is_a_400(server: Server, body: dict, param: str | None, words: str) -> None:
    error = assert_error(post(server, body), 400, param)
    assert words in error["message"]
    assert error["type"] == "invalid_request_error"


def test_malformed_json_is_a_400(server: Server) -> None:
    assert "not valid JSON" in assert_error(post(server, b"{'messages': oops"), 400)["message"]
    assert_error(post(server, b""), 400)
    assert_error(post(server, b'{"messages": NaN}'), 400)
    assert "JSON object" in assert_error(post(server, [1, 2]), 400)["message"]
    assert_error(post(server, b'{"prompt": [[1, 2], [3]]}', "/completions"), 400, "prompt")
    # a text completion asks for its most likely tokens with ``logprobs``: a refusal names it
    assert_error(post(server, {"prompt": "a", "logprobs": 99}, "/completions"), 400, "logprobs")


def test_deep_huge_and_mistyped_bodies_are_400s(server: Server) -> None:
    """Bodies nested too deep, numbers too large, and wrong types in the new fields: each a
    400 in OpenAI's error shape."""
    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert "too deep" in assert_error(post(server, deep), 400)["message"]
    value: list = []
    for _ in range(70):  # deeper than any request, far from Python's recursion limit
        value = [value]
    nested = {"messages": HELLO, "metadata": {"a": value}}
    assert_error(post(server, nested), 400)
    assert_error(post(server, b'{"messages": [], "max_tokens": 1' + b"0" * 5000 + b"}"), 400)
    bad = [
        ({"tools": "get_weather"}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"},
            "tool_choice",
        ),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 99}, "top_logprobs"),
        ({"presence_penalty": 9}, "presence_penalty"),
        ({"frequency_penalty": "lots"}, "frequency_penalty"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 1000}}, "logit_bias"),
        ({"repeat_last_n": -7}, "repeat_last_n"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "tensor"}}}},
            "response_format",
        ),
        ({"grammar": 'root ::= "a" maybe'}, "grammar"),
        ({"messages": [{"role": "tool", "content": "18"}], "tools": None}, "messages[0]"),
        ({"messages": [*HELLO, {"role": "assistant", "tool_calls": "f()"}]}, "messages[1].tool_calls"),
    ]
    for fields, param in bad:
        assert_error(post(server, {"messages": HELLO, **fields}), 400, param)


def test_half_a_surrogate_pair_is_read_as_the_replacement_character(server: Server) -> None:
    """A client that cuts a string between the two halves of a pair sends one alone, which
    JSON allows and no tokenizer takes: it is read as U+FFFD, never refused or a 500."""
    tokenized = [
        httpx.post(f"{server.url}/tokenize", content=body, headers=server.headers()).json()["tokens"]
        for body in (b'{"content": "caf\\ud83d au lait"}', '{"content": "caf\ufffd au lait"}'.encode())
    ]
    assert tokenized[0] == tokenized[1]
    chat = b'{"messages": [{"role": "user", "content": "Say \\udc00 hello."}], "max_tokens": 1}'
    assert post(server, chat).status_code == 200
    anthropic = b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "\\ud800"}]}'
    assert post(server, anthropic, "/messages").status_code == 200


def test_any_model_name_and_unknown_fields_are_answered(server: Server) -> None:
    """Agents name their own models and front ends add vendor fields: the loaded target
    answers, and the ignored fields are named in a header."""
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=HELLO,
        max_tokens=4,
        extra_body={"colour": "red", "cache_prompt": True, "chat_template_kwargs": {}},
    )
    assert raw.headers["x-edgespec-ignored-fields"] == "colour, cache_prompt"
    answer = raw.parse()
    assert answer.model == "qwen2.5-coder-1.5b" and answer.choices[0].message.content
    plain = post(server, {"model": "qwen2.5-coder-0.5b", "messages": HELLO, "max_tokens": 4})
    assert plain.status_code == 200 and "x-edgespec-ignored-fields" not in plain.headers
    # A wrong value of a known field stays a 400 naming it.
    assert_error(post(server, {"model": 7, "messages": HELLO}), 400, "model")


def test_anthropic_key_header_is_accepted(server: Server) -> None:
    ok = httpx.post(
        f"{server.base_url}/chat/completions",
        json={"messages": HELLO, "max_tokens": 2},
        headers={"x-api-key": KEY},
        timeout=120,
    )
    assert ok.status_code == 200, ok.text
    wrong = httpx.post(
        f"{server.base_url}/chat/completions", json={"messages": HELLO}, headers={"x-api-key": "no"}
    )
    assert_error(wrong, 401)


def test_prompt_longer_than_the_context_names_both_sizes(server: Server) -> None:
    long = [{"role": "user", "content": "apple " * 3000}]
    error = assert_error(post(server, {"messages": long, "max_tokens": 4}), 400, "messages")
    assert "2048" in error["message"]
    tokens = int(error["message"].split("the prompt is ")[1].split(" tokens")[0])
    assert tokens > 2048
    text = assert_error(post(server, {"prompt": "apple " * 3000}, "/completions"), 400, "prompt")
    assert "2048" in text["message"]


def test_unknown_route_and_method(server: Server) -> None:
    assert_error(httpx.get(f"{server.base_url}/nothing", headers=server.headers()), 404)
    assert_error(httpx.get(f"{server.base_url}/chat/completions", headers=server.headers()), 405)


def test_server_still_answers_after_bad_requests(server: Server) -> None:
    for _ in range(3):
        post(server, b"{broken")
        post(server, {"messages": []})
    answer = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0).chat.completions.create(
        model="qwen2.5-coder-1.5b", messages=HELLO, max_tokens=4, extra_body={"drafter": "none"}
    )
    assert answer.choices[0].message.content
    assert answer.usage.completion_tokens <= 4


def test_drafter_and_gamma_default_to_auto(server: Server) -> None:
    # Absent or null, both are auto; γ as a string of digits is a number, as on the CLI.
    for extra in ({}, {"drafter": None, "gamma": None}, {"drafter": "ngram", "gamma": "2"}):
        response = post(server, {"messages": HELLO, "max_tokens": 3, **extra})
        assert response.status_code == 200, response.text
        speculation = response.json()["speculation"]
        if extra.get("drafter"):
            assert (speculation["drafter"], speculation["gamma"]) == ("ngram", 2)
        else:
            assert (speculation["drafter"], speculation["gamma"]) == ("auto", "auto")


def test_taken_port_is_one_line_and_exit_2(server: Server) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edgespec", "serve", "--port", str(server.port)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgespec: error: cannot serve on 127.0.0.1:")


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--port", "99999"], "port must be in 1..65535 (got 99999)"),
        (["--parallel", "0"], "--parallel must be in 1..64 (got 0)"),
        (["--max-queue", "-1"], "--max-queue must be >= 0 (got -1)"),
        (["--cache-ram", "-1"], "--cache-ram must be >= 0 GiB"),
        (["--cache-dir", "{file}"], "is not a directory"),
        (["--cache-dir", "{file}/states"], "--cache-dir: cannot make"),
        (["--ctx", "10"], "at least 16 tokens"),
        (["--threads", "0"], "threads must be >= 1 (got 0)"),
    ],
)
def test_bad_flags_are_one_line_before_any_model_loads(tmp_path, flags: list[str], fragment: str) -> None:
    (tmp_path / "file").write_text("not a directory")
    flags = [flag.format(file=tmp_path / "file") for flag in flags]
    one_error_line(run_cli("serve", *flags, timeout=60), fragment)


def test_public_host_without_key_warns(server: Server) -> None:
    # The port is taken, so the command stops right after the warning, before loading anything.
    result = subprocess.run(
        [sys.executable, "-m", "edgespec", "serve", "--host", "0.0.0.0", "--port", str(server.port)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2
    warning, error = result.stderr.strip().splitlines()
    assert warning.startswith("edgespec: warning: serving on 0.0.0.0 without --api-key")
    assert error.startswith("edgespec: error: cannot serve on 0.0.0.0:")

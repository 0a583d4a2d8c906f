"""Anthropic's Messages API and OpenAI's Responses API against a real ``edgespec serve``
over loopback, through the clients agents use, unchanged: the ``anthropic`` SDK (create,
stream, a tool round trip, count_tokens), the ``openai`` SDK's ``responses`` (text, stream,
a function-call round trip, ``text.format`` json_schema) and litellm's ``openai/`` and
``anthropic/`` providers; bodies shaped like Claude Code's and Codex CLI's; greedy answers
equal across the three endpoints; no body gets a 500.

The server needs an API key here, so Anthropic's ``x-api-key`` and OpenAI's bearer token
are both exercised.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.server_fixtures import Server, serve

pytestmark = [pytest.mark.needs_models, pytest.mark.slow]

KEY = "wire-key-1"
SYSTEM = "You are a terse assistant."
QUESTION = "Name three primary colors."
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = "What is the weather in Porto right now? Use the tool."
# For answers compared across requests: see the test of the three endpoints.
ONE_TOKEN_A_PASS = {"drafter": "none"}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve("--parallel", "1", api_key=KEY) as running:
        yield running


def claude(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=300)


def gpt(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=300)


# -- Anthropic Messages ----------------------------------------------------------------------


def test_anthropic_create_stream_and_count_tokens(server: Server) -> None:
    client = claude(server)
    ask = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 24,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": QUESTION}],
        "extra_body": ONE_TOKEN_A_PASS,
    }
    client.messages.create(**ask)  # the compared answers start from the state it leaves
    message = client.messages.create(**ask)
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens")
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text.strip()
    with client.messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text
    assert final.usage.output_tokens == message.usage.output_tokens
    counted = client.messages.count_tokens(
        model="claude-sonnet-4-6", system=SYSTEM, messages=[{"role": "user", "content": QUESTION}]
    )
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_anthropic_stop_sequence_and_max_tokens(server: Server) -> None:
    client = claude(server)
    cut = client.messages.create(
        model="x", max_tokens=3, messages=[{"role": "user", "content": "Count from 1 to 20."}]
    )
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    full = client.messages.create(
        model="x",
        max_tokens=40,
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
    )
    text = full.content[0].text
    stop = next(n for n in ("5", "4", "3") if n in text)
    stopped = client.messages.create(
        model="x",
        max_tokens=40,
        stop_sequences=[stop],
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert text.startswith(stopped.content[0].text)


def test_anthropic_tool_round_trip(server: Server) -> None:
    client = claude(server)
    first = client.messages.create(
        model="claude-x",
        max_tokens=60,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": ASK}],
    )
    assert first.stop_reason == "tool_use"
    call = next(block for block in first.content if block.type == "tool_use")
    assert call.name == "get_weather" and isinstance(call.input, dict) and "city" in call.input
    # The streamed call is the same call, its input rebuilt from input_json_delta events.
    with client.messages.stream(
        model="claude-x",
        max_tokens=60,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": ASK}],
    ) as stream:
        streamed = stream.get_final_message()
    streamed_call = next(block for block in streamed.content if block.type == "tool_use")
    assert (streamed_call.name, streamed_call.input) == (call.name, call.input)
    answer = client.messages.create(
        model="claude-x",
        max_tokens=40,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call.id,
                        "content": '{"temperature_c": 18, "sky": "clear"}',
                    }
                ],
            },
        ],
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert "18" in answer.content[0].text


def test_anthropic_errors_in_anthropics_shape(server: Server) -> None:
    client = claude(server)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            model="x",
            max_tokens=8,
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "hi"}]}],
        )
    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in raised.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model="x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    missing = httpx.post(
        f"{server.url}/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]


def test_a_claude_code_shaped_request(server: Server) -> None:
    """What Claude Code sends: a beta query, its headers, system blocks with cache control,
    tools (server tools among them), thinking, metadata and fields we do not know."""
    tools = [
        WEATHER,
        {
            "name": "Read",
            "description": "Read a file",
            "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
        },
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ]
    body = {
        "model": "claude-sonnet-4-6-20250929",
        "max_tokens": 32,
        "stream": True,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Say hi.", "cache_control": {"type": "ephemeral"}}],
            }
        ],
        "tools": tools,
        "thinking": {"type": "disabled"},
        "metadata": {"user_id": "user_abc"},
        "context_management": {"edits": []},
        "output_config": {"effort": "low"},
        "temperature": 1,
    }
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"}
    with httpx.stream(
        "POST", f"{server.url}/v1/messages?beta=true", json=body, headers=headers, timeout=300
    ) as r:
        assert r.status_code == 200
        names = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert "message_delta" in names and "error" not in names


# -- OpenAI Responses ------------------------------------------------------------------------


def test_responses_text_and_stream(server: Server) -> None:
    client = gpt(server)
    ask = {
        "model": "gpt-5",
        "instructions": SYSTEM,
        "input": QUESTION,
        "max_output_tokens": 24,
        "extra_body": ONE_TOKEN_A_PASS,
    }
    client.responses.create(**ask)  # the compared answers start from the state it leaves
    response = client.responses.create(**ask)
    assert response.status in ("completed", "incomplete") and response.output_text.strip()
    with client.responses.stream(**ask) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == response.output_text == final.output_text
    assert final.usage.output_tokens == response.usage.output_tokens


def test_responses_function_call_round_trip(server: Server) -> None:
    client = gpt(server)
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    }
    first = client.responses.create(
        model="gpt-5", input=ASK, tools=[tool], tool_choice="required", max_output_tokens=60
    )
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    answer = client.responses.create(
        model="gpt-5",
        tools=[tool],
        tool_choice="none",
        max_output_tokens=40,
        input=[
            {"role": "user", "content": ASK},
            call.model_dump(),
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": '{"temperature_c": 18, "sky": "clear"}',
            },
        ],
    )
    assert "18" in answer.output_text


def test_responses_json_schema(server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    response = gpt(server).responses.create(
        model="gpt-5",
        input="Extract the person: Ana Lima is 34.",
        max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
    )
    person = json.loads(response.output_text)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)


def test_a_codex_shaped_request(server: Server) -> None:
    body = {
        "model": "gpt-5-codex",
        "instructions": "You are Codex, a coding agent.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}
        ],
        "tools": [
            {
                "type": "function",
                "name": "shell",
                "description": "Run a command",
                "strict": False,
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                    "required": ["command"],
                },
            },
            {"type": "web_search"},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "session-1",
        "client_metadata": {"originator": "codex_exec"},
        "max_output_tokens": 24,
    }
    with httpx.stream(
        "POST",
        f"{server.base_url}/responses",
        json=body,
        timeout=300,
        headers={"Authorization": f"Bearer {KEY}"},
    ) as r:
        assert r.status_code == 200
        names = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert names[0] == "response.created" and names[-1] in ("response.completed", "response.incomplete")


# -- across endpoints --------------------------------------------------------------------------


def test_greedy_answers_are_equal_across_the_three_endpoints(server: Server) -> None:
    """The same conversation, greedy, from the same cache state (a first request leaves
    the prompt in the slot; each later one starts from it): the same text everywhere.

    Decoded without drafting: how many tokens ``auto`` drafts depends on this machine's
    load at the moment, and a verification batch of another size can tip a near-tie."""
    chat = {
        "model": "x",
        "max_tokens": 32,
        "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        "extra_body": ONE_TOKEN_A_PASS,
    }
    client = gpt(server)
    client.chat.completions.create(**chat)  # the shared starting state
    expected = client.chat.completions.create(**chat).choices[0].message.content
    message = claude(server).messages.create(
        model="x",
        max_tokens=32,
        extra_body={"temperature": 0, **ONE_TOKEN_A_PASS},  # this SDK has no temperature argument
        system=SYSTEM,
        messages=[{"role": "user", "content": QUESTION}],
    )
    response = client.responses.create(
        model="x",
        max_output_tokens=32,
        temperature=0,
        instructions=SYSTEM,
        input=QUESTION,
        extra_body=ONE_TOKEN_A_PASS,
    )
    assert message.content[0].text == expected
    assert response.output_text == expected


def test_litellm_openai_and_anthropic_providers(server: Server) -> None:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of the price list
    import litellm

    messages = [{"role": "user", "content": QUESTION}]
    # Each answer compared starts from the state this one leaves (see the test above).
    gpt(server).chat.completions.create(
        model="x", messages=messages, max_tokens=16, temperature=0, extra_body=ONE_TOKEN_A_PASS
    )

    def ask(model: str, base: str, **extra):
        return litellm.completion(
            model=model,
            api_base=base,
            api_key=KEY,
            messages=messages,
            max_tokens=16,
            temperature=0,
            extra_body=ONE_TOKEN_A_PASS,
            **extra,
        )

    via_openai = ask("openai/anything", server.base_url)
    via_anthropic = ask("anthropic/claude-sonnet-4-6", server.url)
    assert via_openai.choices[0].message.content.strip()
    assert via_anthropic.choices[0].message.content == via_openai.choices[0].message.content
    streamed = ask("anthropic/claude-sonnet-4-6", server.url, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed)
    assert text == via_openai.choices[0].message.content


def test_no_body_gets_a_500(server: Server) -> None:
    bodies = [
        b"",
        b"[]",
        b"{",
        b'{"messages": 5}',
        b'{"max_tokens": "x", "messages": []}',
        b'{"model": "x", "max_tokens": 8, '
        b'"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}',
        b'{"model": "x", "max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]}',
        b'{"model": "x", "max_tokens": 8, "system": 5, "messages": [{"role": "user", "content": "hi"}]}',
        b'{"input": 5}',
        b'{"input": [{"type": "function_call_output"}]}',
        b'{"input": [7]}',
        b'{"input": "hi", "text": {"format": {"type": "json_schema", "schema": 5}}}',
        b'{"input": "hi", "tools": [{"type": "function"}]}',
        b'{"input": "hi", "max_output_tokens": -1}',
    ]
    headers = {"x-api-key": KEY, "Content-Type": "application/json"}
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses"):
        for body in bodies:
            r = httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=120)
            assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)

"""The Anthropic Messages wire format (``server.anthropic``), model-free: requests become
chat bodies, chat answers become Messages and stream events. Every produced body and
event is checked against the official ``anthropic`` SDK's own types, and each stream is
read back by the SDK's own client (its SSE parser and accumulator, over a mock transport)
and must rebuild the Message the non-streaming path makes from the same answer."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import pydantic
import pytest
from anthropic.types import ErrorResponse, Message, MessageTokensCount, RawMessageStreamEvent

from edgespec.runtime.chat_template import render_template
from edgespec.runtime.messages import normalise_messages
from edgespec.server import anthropic as wire
from edgespec.server.errors import ApiError

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
MODEL = "claude-sonnet-4-6"
MSG_ID = "msg_0123456789abcdef01234567"
CHAT_ID = "chatcmpl-0123456789abcdef01234567"
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
WEATHER_FN = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": WEATHER["input_schema"],
        "description": "The weather in a city.",
    },
}


def body(**fields: Any) -> dict:
    return {"model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": "Hi"}], **fields}


def turn(role: str, *blocks: dict) -> dict:
    return {"role": role, "content": list(blocks)}


def call(call_id: str, arguments: str, name: str = "get_weather") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def rendered(template: str, chat: dict) -> str:
    """The chat body's messages through a real chat template (a test fixture)."""
    return render_template(
        (TEMPLATES / f"{template}.jinja").read_text(), chat["messages"], tools=chat["tools"]
    )


def refused(request: Any, *, counting: bool = False) -> ApiError:
    with pytest.raises(ApiError) as caught:
        (wire.count_tokens_body if counting else wire.chat_body)(request)
    assert caught.value.status == 400
    return caught.value


# -- requests ------------------------------------------------------------------------------


def test_system_blocks_and_text_blocks_become_one_message_each():
    system = [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be terse."},
    ]
    user = [
        {"type": "text", "text": "<system-reminder>cwd: /src</system-reminder>"},
        {"type": "text", "text": "List the files.", "cache_control": {"type": "ephemeral"}},
    ]
    chat, ignored = wire.chat_body(body(system=system, messages=[{"role": "user", "content": user}]))
    assert chat == {
        "model": MODEL,
        "max_tokens": 256,
        "messages": [
            {"role": "system", "content": "You are Claude Code.\n\nBe terse."},
            {"role": "user", "content": "<system-reminder>cwd: /src</system-reminder>\n\nList the files."},
        ],
    }
    assert ignored == []
    assert wire.chat_body(body(system="Plain."))[0]["messages"][0] == {"role": "system", "content": "Plain."}
    assert wire.chat_body(body(system=""))[0]["messages"] == [{"role": "user", "content": "Hi"}]


CONVERSATION = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two cities: two calls.", "signature": "c2ln"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Checking both."},
            {"type": "tool_use", "id": "toolu_call12345", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_01Rome", "name": "get_weather", "input": {"city": "Rome é"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_call12345", "content": '{"temp": 21}'},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01Rome",
                "content": [{"type": "text", "text": "unknown city"}],
                "is_error": True,
            },
            {"type": "text", "text": "Summarise."},
        ],
    },
]


def test_tool_use_and_tool_results_round_trip_their_ids():
    chat, _ = wire.chat_body(body(messages=CONVERSATION, tools=[WEATHER]))
    assert chat["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "reasoning_content": "Two cities: two calls.",
            "tool_calls": [call("call12345", '{"city":"Paris"}'), call("01Rome", '{"city":"Rome é"}')],
        },
        {"role": "tool", "tool_call_id": "call12345", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "01Rome", "content": "Error: unknown city"},
        {"role": "user", "content": "Summarise."},
    ]
    assert chat["tools"] == [WEATHER_FN]
    calls = chat["messages"][1]["tool_calls"]
    assert [m["tool_call_id"] for m in chat["messages"][2:4]] == [c["id"] for c in calls]
    # The runtime's one message check takes it as it is.
    checked = normalise_messages(chat["messages"])[1]["tool_calls"][0]
    assert checked["function"]["arguments"] == {"city": "Paris"}


def test_an_answered_call_comes_back_with_the_id_the_model_gave_it():
    # whole() shows call "call12345" as "toolu_call12345"; the next request turns it back, so
    # Mistral's template (nine-character ids) renders the conversation.
    answer = chat_answer(
        Answer(calls=[("call12345", "get_weather", ['{"city":"Paris"}'])], finish="tool_calls")
    )
    message = wire.whole(answer, MODEL)
    assert message["content"][0]["id"] == "toolu_call12345"
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": message["content"]},
        turn("user", {"type": "tool_result", "tool_use_id": "toolu_call12345", "content": "21"}),
    ]
    chat, _ = wire.chat_body(body(messages=history, tools=[WEATHER]))
    assert chat["messages"][1]["tool_calls"][0]["id"] == "call12345"
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "call12345", "content": "21"}
    mistral = rendered("mistral", chat)
    assert '"id": "call12345"' in mistral and '"call_id": "call12345"' in mistral
    qwen = rendered("qwen3", chat)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in qwen
    assert "<tool_response>\n21\n</tool_response>" in qwen


@pytest.mark.parametrize(
    ("thinking", "expected"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, {"chat_template_kwargs": {"enable_thinking": True}}),
        ({"type": "disabled"}, {"chat_template_kwargs": {"enable_thinking": False}}),
        ({"type": "adaptive"}, {}),
        (None, {}),
    ],
)
def test_thinking_switch(thinking: dict | None, expected: dict):
    chat, _ = wire.chat_body(body(thinking=thinking))
    assert {k: v for k, v in chat.items() if k in ("chat_template_kwargs", "reasoning_effort")} == expected


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "get_weather"},
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        ),
        (
            {"type": "any", "disable_parallel_tool_use": True},
            {"tool_choice": "required", "parallel_tool_calls": False},
        ),
        ({"type": "auto", "disable_parallel_tool_use": False}, {"tool_choice": "auto"}),
    ],
)
def test_tool_choice_mapping(choice: dict, expected: dict):
    chat, _ = wire.chat_body(body(tools=[WEATHER], tool_choice=choice))
    assert {k: v for k, v in chat.items() if k in ("tool_choice", "parallel_tool_calls")} == expected


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (
            [turn("user", {"type": "text", "text": "What is this?"}, {"type": "image"})],
            "messages[0].content[1]",
        ),
        ([turn("user"), turn("assistant"), turn("user", {"type": "document"})], "messages[2].content[0]"),
        ([turn("assistant", {"type": "image"})], "messages[0].content[0]"),
        (
            [turn("user", {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "image"}]})],
            "messages[0].content[0].content[0]",
        ),
    ],
)
def test_images_and_documents_are_refused_naming_the_block(messages: list, param: str):
    error = refused(body(messages=messages))
    kind = "document" if "document" in json.dumps(messages) else "image"
    assert error.message == f"{kind} blocks are not supported: this server's models read text only"
    assert error.param == param


def test_unknown_fields_are_listed_and_known_ones_accepted_silently():
    quiet = {
        "metadata": {"user_id": "u"},
        "service_tier": "auto",
        "container": None,
        "mcp_servers": [],
        "context_management": {"edits": []},
        "output_config": {"effort": "high"},
        "betas": ["x"],
    }
    chat, ignored = wire.chat_body(body(**quiet, frequency_penalty=1, surprise={"a": 1}))
    assert ignored == ["frequency_penalty", "surprise"]
    assert chat == {"model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": "Hi"}]}


def test_server_tools_are_dropped_and_named():
    tools = [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {**WEATHER, "cache_control": {"type": "ephemeral"}},
        {"type": "bash_20250124", "name": "bash"},
        {**WEATHER, "name": "get_time", "type": "custom"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]
    chat, ignored = wire.chat_body(body(tools=tools))
    assert ignored == ["tools[0]", "tools[2]", "tools[4]"]
    assert [t["function"]["name"] for t in chat["tools"]] == ["get_weather", "get_time"]
    only_server = wire.chat_body(body(tools=tools[:1]))
    assert "tools" not in only_server[0] and only_server[1] == ["tools[0]"]


def test_max_tokens_is_required_except_for_counting():
    request = body()
    del request["max_tokens"]
    error = refused(request)
    assert error.param == "max_tokens" and "'max_tokens' is required" in error.message
    assert refused({**request, "max_tokens": 0}).param == "max_tokens"
    assert refused({**request, "max_tokens": True}).param == "max_tokens"
    counted, ignored = wire.count_tokens_body({**request, "stream": True, "tools": [WEATHER]})
    assert counted == {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [WEATHER_FN],
    }
    assert ignored == []
    assert MessageTokensCount.model_validate(wire.count_tokens_response(42)).input_tokens == 42
    assert wire.count_tokens_response(42) == {"input_tokens": 42}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"stream": "yes"}, "stream"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
        (
            {"tool_choice": {"type": "any", "disable_parallel_tool_use": 1}},
            "tool_choice.disable_parallel_tool_use",
        ),
        ({"thinking": "on"}, "thinking"),
        ({"tools": [{"name": "f", "input_schema": "object"}]}, "tools[0].input_schema"),
        ({"tools": [{"description": "no name"}]}, "tools[0].name"),
        ({"system": [{"type": "tool_use"}]}, "system[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [turn("user", {"text": "untyped"})]}, "messages[0].content[0]"),
        ({"messages": [turn("user", {"type": "tool_use"})]}, "messages[0].content[0]"),
        ({"messages": [turn("assistant", {"type": "tool_result"})]}, "messages[0].content[0]"),
        (
            {"messages": [turn("assistant", {"type": "tool_use", "id": "t", "name": "f", "input": []})]},
            "messages[0].content[0]",
        ),
        ({"messages": [turn("user", {"type": "tool_result", "tool_use_id": ""})]}, "messages[0].content[0]"),
        ({"messages": [turn("user", {"type": "server_tool_use"})]}, "messages[0].content[0]"),
        ({"messages": "Hi"}, "messages"),
        ({"output_config": {"format": {"type": "regex"}}}, "output_config.format"),
    ],
)
def test_wrong_values_are_refused_naming_the_field(fields: dict, param: str):
    assert refused(body(**fields)).param == param


def test_sampling_streaming_structured_output_and_edgespec_fields_pass_through():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    request = body(
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        stop_sequences=["\n\nHuman:"],
        stream=True,
        output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}},
        drafter="suffix",
        gamma=4,
        verify="block",
        lenience=0.5,
        seed=7,
    )
    chat, ignored = wire.chat_body(request)
    assert ignored == []
    assert {k: v for k, v in chat.items() if k not in ("model", "messages", "max_tokens")} == {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["\n\nHuman:"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema, "strict": True},
        },
        "drafter": "suffix",
        "gamma": 4,
        "verify": "block",
        "lenience": 0.5,
        "seed": 7,
    }
    assert wire.chat_body(body(stream=False))[0]["stream"] is False
    assert "stream_options" not in wire.chat_body(body(stream=False))[0]


def sdk_client(handler: Callable[[Any], Any]) -> anthropic.Anthropic:
    """The SDK's own client over a mock transport of the HTTP library it is built on."""
    http = sys.modules[anthropic.DefaultHttpxClient.__mro__[1].__module__.split(".")[0]]
    client = http.Client(transport=http.MockTransport(handler))
    return anthropic.Anthropic(
        api_key="test", base_url="http://edgespec.test", http_client=client, max_retries=0
    )


def test_the_sdks_own_request_translates():
    sent: list[dict] = []
    answer = wire.whole(chat_answer(Answer(text=["Sunny."])), MODEL)

    def respond(request: Any) -> Any:
        sent.append(json.loads(request.content))
        http = sys.modules[type(request).__module__.split(".")[0]]
        return http.Response(200, json=answer)

    client = sdk_client(respond)
    message = client.messages.create(
        model=MODEL,
        max_tokens=100,
        system=[{"type": "text", "text": "Terse.", "cache_control": {"type": "ephemeral"}}],
        messages=CONVERSATION,
        tools=[WEATHER],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        stop_sequences=["STOP"],
        metadata={"user_id": "someone"},
    )
    assert message.content[0].type == "text" and message.content[0].text == "Sunny."
    chat, ignored = wire.chat_body(sent[0])
    assert ignored == []
    assert chat["messages"][0] == {"role": "system", "content": "Terse."}
    assert chat["messages"][1:] == wire.chat_body(body(messages=CONVERSATION))[0]["messages"]
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["stop"]) == ("auto", False, ["STOP"])


def tool(name: str, description: str, *required: str, **extra: Any) -> dict:
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in required}, "required": required}
    return {"name": name, "description": description, "input_schema": schema, **extra}


CLAUDE_CODE_TOOLS = [
    tool("Bash", "Executes a given bash command.", "command"),
    tool("Read", "Reads a file from the local filesystem.", "file_path"),
    tool("Edit", "Performs exact string replacements.", "file_path", "old_string", "new_string"),
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
]
CLAUDE_CODE_TOOLS[2]["cache_control"] = {"type": "ephemeral"}
CLAUDE_CODE_TOOLS[0]["input_schema"] |= {
    "additionalProperties": False,
    "$schema": "http://json-schema.org/draft-07/schema#",
}


def test_a_claude_code_shaped_request_translates():
    cached = {"cache_control": {"type": "ephemeral"}}
    request = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": "Use the tools.", **cached},
        ],
        "messages": [
            turn(
                "user",
                {"type": "text", "text": "<system-reminder>Context.</system-reminder>"},
                {"type": "text", "text": "Run the tests.", **cached},
            ),
            turn(
                "assistant",
                {"type": "thinking", "thinking": "Run pytest.", "signature": wire.SIGNATURE},
                {"type": "tool_use", "id": "toolu_call_1", "name": "Bash", "input": {"command": "pytest -q"}},
            ),
            turn(
                "user",
                {"type": "tool_result", "tool_use_id": "toolu_call_1", "content": "3 passed", **cached},
            ),
        ],
        "tools": CLAUDE_CODE_TOOLS,
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "metadata": {"user_id": "user_abc_account__session_1"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "temperature": 1,
    }
    chat, ignored = wire.chat_body(request)
    assert ignored == ["tools[3]"]
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][2]["tool_calls"][0]["id"] == chat["messages"][3]["tool_call_id"] == "call_1"
    assert [t["function"]["name"] for t in chat["tools"]] == ["Bash", "Read", "Edit"]
    assert chat["tools"][0]["function"]["parameters"] == CLAUDE_CODE_TOOLS[0]["input_schema"]
    assert chat["chat_template_kwargs"] == {"enable_thinking": True}
    assert (chat["stream"], chat["stream_options"]) == (True, {"include_usage": True})
    assert (chat["model"], chat["max_tokens"], chat["temperature"]) == (
        "claude-sonnet-4-5-20250929",
        32000,
        1,
    )
    text = rendered("qwen3", chat)
    assert '"name": "Edit"' in text and "<tool_response>\n3 passed\n</tool_response>" in text


# -- answers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One chat answer, as the pieces its stream carries."""

    thinking: Sequence[str] = ()
    text: Sequence[str] = ()
    calls: Sequence[tuple[str, str, list[str]]] = ()  # (id, name, argument pieces)
    finish: str = "stop"
    stop: str = "eos"
    stop_sequence: str | None = None


def chat_answer(answer: Answer) -> dict:
    """The whole chat.completion body of the answer."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(answer.text) or None}
    if answer.thinking:
        message["reasoning_content"] = "".join(answer.thinking)
    if answer.calls:
        message["tool_calls"] = [call(i, "".join(pieces), name) for i, name, pieces in answer.calls]
    choice = {"index": 0, "message": message, "finish_reason": answer.finish, "stop_reason": answer.stop}
    choice["stop_sequence"] = answer.stop_sequence
    head = {"id": CHAT_ID, "object": "chat.completion", "created": 1700000000, "model": "qwen3-8b"}
    return {**head, "choices": [choice], "usage": USAGE, "timings": TIMINGS, "speculation": SPECULATION}


USAGE = {"prompt_tokens": 120, "completion_tokens": 9, "total_tokens": 129}
USAGE |= {"prompt_tokens_details": {"cached_tokens": 100}, "completion_tokens_details": {}}
ANTHROPIC_USAGE = {"input_tokens": 20, "output_tokens": 9, "cache_read_input_tokens": 100}
ANTHROPIC_USAGE |= {"cache_creation_input_tokens": 0}
TIMINGS = {"prompt_n": 20, "cache_n": 100, "predicted_n": 9, "decode_per_second": 41.5}
SPECULATION = {"drafter": "auto", "gamma": "auto", "steps": 4, "tau": 2.0}


def chat_chunks(answer: Answer) -> list[dict]:
    """The same answer as the chat stream's chunks, in the contract's order."""
    head = {"id": CHAT_ID, "object": "chat.completion.chunk", "created": 1700000000, "model": "qwen3-8b"}

    def chunk(delta: dict, finish: str | None = None, **extra: Any) -> dict:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"reasoning_content": piece}) for piece in answer.thinking]
    out += [chunk({"content": piece}) for piece in answer.text]
    for index, (call_id, name, pieces) in enumerate(answer.calls):
        function = {"name": name, "arguments": ""}
        out.append(
            chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function", "function": function}]})
        )
        out += [chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]}) for p in pieces]
    out.append(chunk({}, answer.finish, stop_reason=answer.stop, stop_sequence=answer.stop_sequence))
    out.append({**head, "choices": [], "usage": USAGE, "timings": TIMINGS, "speculation": SPECULATION})
    return out


def translate(chunks: list[dict]) -> list[str]:
    stream = wire.MessageStream(MODEL, MSG_ID)
    texts: list[str] = []
    for chunk in chunks:
        texts += stream.feed(chunk)
    texts += stream.finish()
    assert stream.finish() == [] and stream.feed(chat_chunks(Answer(text=["late"]))[1]) == []  # (it is over)
    return texts


def events(texts: list[str]) -> list[dict]:
    """Each SSE text parsed and checked: ``event: NAME``, ``data: JSON`` naming the same
    type, and (but for ``ping`` and ``error``) valid as the SDK's stream event."""
    found = []
    for text in texts:
        head, data, rest = text.split("\n", 2)
        assert rest == "\n" and head.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == head.removeprefix("event: ")
        if payload["type"] == "error":
            ErrorResponse.model_validate(payload)
        elif payload["type"] != "ping":
            EVENT.validate_python(payload)
        found.append(payload)
    return found


def sdk_stream(texts: list[str]) -> Any:
    """The Message the SDK's own client accumulates from the stream."""

    def respond(request: Any) -> Any:
        http = sys.modules[type(request).__module__.split(".")[0]]
        return http.Response(
            200, headers={"content-type": "text/event-stream"}, content="".join(texts).encode()
        )

    client = sdk_client(respond)
    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
    ) as s:
        return s.get_final_message()


SHORT = {"content_block_start": "start", "content_block_stop": "stop", "message_start": "begin"}
SHORT |= {"message_delta": "end", "message_stop": "over", "ping": "ping", "error": "error"}
SHORT |= {"text_delta": "text", "thinking_delta": "think", "signature_delta": "sign"}
SHORT |= {"input_json_delta": "json"}


def names(found: list[dict]) -> str:
    """The events in short: a block delta by its delta's type."""
    return " ".join(
        SHORT[e["delta"]["type"] if e["type"] == "content_block_delta" else e["type"]] for e in found
    )


PARIS = ("call_1", "get_weather", ['{"city":"Paris"}'])
CASES = {
    "text": Answer(text=["Hel", "lo."]),
    "thinking then text": Answer(thinking=["Let me ", "think."], text=["Hi!"]),
    "text then a call": Answer(
        text=["Checking."], calls=[("call_abc", "get_weather", ['{"city":', '"Paris"}'])], finish="tool_calls"
    ),
    "empty": Answer(),
    "cut": Answer(thinking=["Still thin"], finish="length", stop="max_tokens"),
    "stop string": Answer(text=["Done"], stop="stop_string", stop_sequence="END"),
    "two calls": Answer(calls=[PARIS, ("call_2", "get_weather", [])], finish="tool_calls"),
}
EVENT_NAMES = {
    "text": "start text text stop",
    "thinking then text": "start think think sign stop start text stop",
    "text then a call": "start text stop start json json stop",
    "empty": "",
    "cut": "start think sign stop",
    "stop string": "start text stop",
    "two calls": "start json stop start stop",
}
CONTENT = {
    "text": [{"type": "text", "text": "Hello."}],
    "thinking then text": [
        {"type": "thinking", "thinking": "Let me think.", "signature": wire.SIGNATURE},
        {"type": "text", "text": "Hi!"},
    ],
    "text then a call": [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_call_abc", "name": "get_weather", "input": {"city": "Paris"}},
    ],
    "empty": [],
    "cut": [{"type": "thinking", "thinking": "Still thin", "signature": wire.SIGNATURE}],
    "stop string": [{"type": "text", "text": "Done"}],
    "two calls": [
        {"type": "tool_use", "id": "toolu_call_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_call_2", "name": "get_weather", "input": {}},
    ],
}
STOPS = {
    "text then a call": ("tool_use", None),
    "two calls": ("tool_use", None),
    "cut": ("max_tokens", None),
    "stop string": ("stop_sequence", "END"),
}


def blocks(message: Any) -> list[dict]:
    return [block.to_dict() for block in message.content]


@pytest.mark.parametrize("case", list(CASES))
def test_whole_answer_is_a_valid_message(case: str):
    out = wire.whole(chat_answer(CASES[case]), MODEL)
    message = Message.model_validate(out)
    assert (out["id"], message.model, message.type, message.role) == (MSG_ID, MODEL, "message", "assistant")
    assert out["content"] == CONTENT[case] and blocks(message) == CONTENT[case]
    assert (message.stop_reason, message.stop_sequence) == STOPS.get(case, ("end_turn", None))
    assert out["usage"] == ANTHROPIC_USAGE
    assert (out["timings"], out["speculation"]) == (TIMINGS, SPECULATION)


@pytest.mark.parametrize("case", list(CASES))
def test_stream_rebuilds_the_whole_message(case: str):
    texts = translate(chat_chunks(CASES[case]))
    found = events(texts)
    assert names(found) == " ".join(filter(None, ["begin ping", EVENT_NAMES[case], "end over"]))
    start = found[0]["message"]
    assert (start["id"], start["model"], start["content"], start["stop_reason"]) == (MSG_ID, MODEL, [], None)
    indexes = [e["index"] for e in found if "index" in e]
    assert indexes == sorted(indexes) and sorted(set(indexes)) == list(range(len(CONTENT[case])))
    stop_reason, stop_sequence = STOPS.get(case, ("end_turn", None))
    assert found[-2]["delta"] == {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
    assert found[-2]["usage"] == ANTHROPIC_USAGE
    assert (found[-2]["timings"], found[-2]["speculation"]) == (TIMINGS, SPECULATION)

    final = sdk_stream(texts)
    whole = Message.model_validate(wire.whole(chat_answer(CASES[case]), MODEL))
    assert blocks(final) == blocks(whole) == CONTENT[case]
    assert (final.id, final.model, final.stop_reason, final.stop_sequence) == (
        MSG_ID,
        MODEL,
        stop_reason,
        stop_sequence,
    )
    assert (whole.id, whole.stop_reason, whole.stop_sequence) == (MSG_ID, stop_reason, stop_sequence)
    assert final.usage.to_dict() == whole.usage.to_dict() == ANTHROPIC_USAGE


def test_call_arguments_stream_as_partial_json_pieces():
    found = events(translate(chat_chunks(CASES["text then a call"])))
    block = {"type": "tool_use", "id": "toolu_call_abc", "name": "get_weather", "input": {}}
    assert found[5] == {"type": "content_block_start", "index": 1, "content_block": block}
    assert [e["delta"] for e in found[6:8]] == [
        {"type": "input_json_delta", "partial_json": '{"city":'},
        {"type": "input_json_delta", "partial_json": '"Paris"}'},
    ]
    assert found[8] == {"type": "content_block_stop", "index": 1}


def test_a_stream_without_usage_chunk_still_closes():
    chunks = chat_chunks(Answer(text=["Hi"]))[:-1]  # (no usage chunk: the finish chunk is the last)
    found = events(translate(chunks))
    end = {"stop_reason": "end_turn", "stop_sequence": None}
    assert found[-2:] == [
        {"type": "message_delta", "delta": end, "usage": {"output_tokens": 0}},
        {"type": "message_stop"},
    ]
    assert names(events(translate([]))) == "begin ping end over"  # (no chunk at all)
    # The prompt's size, where the server knows it at the start, survives to the end.
    stream = wire.MessageStream(MODEL, MSG_ID, input_tokens=50)
    texts = [text for chunk in chunks for text in stream.feed(chunk)] + stream.finish()
    assert events(texts)[0]["message"]["usage"]["input_tokens"] == 50
    assert sdk_stream(texts).usage.input_tokens == 50


def test_thinking_tokens_are_reported_apart():
    usage = {**USAGE, "completion_tokens_details": {"reasoning_tokens": 6}}
    out = wire.whole({**chat_answer(CASES["cut"]), "usage": usage}, MODEL)
    assert out["usage"] == {**ANTHROPIC_USAGE, "output_tokens_details": {"thinking_tokens": 6}}
    assert Message.model_validate(out).usage.output_tokens_details.thinking_tokens == 6


def test_an_error_chunk_ends_the_stream_with_an_error_event():
    failure = {
        "message": "generation failed: RuntimeError",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    chunks = [
        *chat_chunks(Answer(text=["Hel", "lo"]))[:2],
        {"error": failure},
        *chat_chunks(Answer(text=["more"])),
    ]
    texts = translate(chunks)  # (nothing after the error is sent)
    found = events(texts)
    assert names(found) == "begin ping start text error"
    assert found[-1] == {"type": "error", "error": {"type": "api_error", "message": failure["message"]}}
    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk_stream(texts)
    assert caught.value.body == found[-1]
    bad = wire.MessageStream(MODEL, MSG_ID).feed(
        {"error": {"message": "bad", "type": "invalid_request_error"}}
    )
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert bad == [f"event: error\ndata: {json.dumps(error)}\n\n"]
    busy = wire.MessageStream(MODEL, MSG_ID).feed({"error": {"message": "busy", "code": "server_busy"}})
    assert events(busy)[-1]["error"] == {"type": "overloaded_error", "message": "busy"}


ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}
ERRORS |= {404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error"}
ERRORS |= {503: "overloaded_error", 529: "overloaded_error", 422: "invalid_request_error", 502: "api_error"}


@pytest.mark.parametrize(("status", "kind"), ERRORS.items())
def test_error_body_types_follow_the_status(status: int, kind: str):
    out = wire.error_body(status, "something went wrong")
    assert out == {"type": "error", "error": {"type": kind, "message": "something went wrong"}}
    if kind != "request_too_large":  # (a type Anthropic documents that the SDK's union lacks)
        assert ErrorResponse.model_validate(out).error.type == kind


def test_claude_codes_system_message_and_deferred_tools() -> None:
    """Claude Code puts its environment in a ``system`` message inside ``messages`` and
    offers tools its tool search loads later (``defer_loading``): the first joins the
    system prompt, the second is not shown to the model."""
    chat, ignored = wire.chat_body(
        {
            "model": "claude-sonnet-4-6",
            "max_tokens": 8,
            "system": "You are Claude Code.",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": "cwd: /tmp"}]},
                {"role": "user", "content": "again"},
            ],
            "tools": [
                {"name": "Read", "input_schema": {"type": "object"}},
                {"name": "Later", "input_schema": {"type": "object"}, "defer_loading": True},
            ],
        }
    )
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "user"]
    assert chat["messages"][0]["content"] == "You are Claude Code.\n\ncwd: /tmp"
    assert [t["function"]["name"] for t in chat["tools"]] == ["Read"]
    assert ignored == ["tools[1]"]

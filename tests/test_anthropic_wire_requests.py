"""The Anthropic Messages wire format (``server.anthropic``), model-free: requests become
chat bodies (checked through real chat templates and against the ``anthropic`` SDK's own
requests), and what cannot be translated is refused or listed by name."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import MessageTokensCount

from edgespec.runtime.chat_template import render_template
from edgespec.runtime.messages import normalise_messages
from edgespec.server import anthropic as wire
from edgespec.server.errors import ApiError
from tests.anthropic_wire_cases import MODEL, Answer, call, chat_answer, sdk_client

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
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

"""The OpenAI Responses wire format (``edgespec.server.responses``), without a model: requests
translated to chat bodies, refusals naming their field, and the conversations kept for
``previous_response_id``."""

from __future__ import annotations

import pytest

from edgespec.server.errors import ApiError
from edgespec.server.responses import ResponseStore, chat_body, whole
from tests.responses_wire_cases import RID, WEATHER, chat_answer, user

CHAT_WEATHER = {
    "type": "function",
    "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
}


def refused(body: dict, store: ResponseStore | None = None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        chat_body(body, store)
    return caught.value


# -- requests ------------------------------------------------------------------------------


def test_string_input_with_instructions_and_sampling() -> None:
    body = {
        "model": "qwen3-0.6b",
        "instructions": "Answer in one word.",
        "input": "Capital of France?",
        "max_output_tokens": 64,
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 7,
        "drafter": "ngram",
        "gamma": 4,
    }
    chat, ignored = chat_body(body)
    assert chat == {
        "model": "qwen3-0.6b",
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 7,
        "drafter": "ngram",
        "gamma": 4,
        "messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Capital of France?"},
        ],
        "max_tokens": 64,
    }
    assert ignored == []


def test_stream_asks_for_usage() -> None:
    chat, _ = chat_body({"input": "hi", "stream": True})
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    chat, _ = chat_body({"input": "hi", "stream": False})
    assert "stream" not in chat and "stream_options" not in chat
    assert refused({"input": "hi", "stream": "yes"}).param == "stream"


def test_function_call_round_trip_keeps_call_ids() -> None:
    items = [
        user("Weather in Porto and Lisbon?"),
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Two"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_a",
            "name": "get_weather",
            "arguments": '{"city":"Porto"}',
        },
        {
            "type": "function_call",
            "call_id": "call_b",
            "name": "get_weather",
            "arguments": '{"city":"Lisbon"}',
        },
        {"type": "function_call_output", "call_id": "call_a", "output": "21 C"},
        {
            "type": "function_call_output",
            "call_id": "call_b",
            "output": [{"type": "input_text", "text": "18 C"}],
        },
        {"role": "user", "content": "Thanks"},
    ]
    chat, ignored = chat_body({"input": items, "tools": [WEATHER]})
    assert chat["messages"] == [
        {"role": "user", "content": "Weather in Porto and Lisbon?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Porto"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Lisbon"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "21 C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "18 C"},
        {"role": "user", "content": "Thanks"},
    ]
    assert chat["tools"] == [CHAT_WEATHER]
    assert ignored == []


def test_calls_without_text_and_reasoning_placement() -> None:
    items = [
        {"role": "developer", "content": "Be terse."},
        user("Go"),
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "call it"}],
            "encrypted_content": "x",
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "lost"}]},
        user("Again"),
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
    ]
    chat, _ = chat_body({"input": items})
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert chat["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Go"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "call it",
            "tool_calls": [{"id": "c1", **call}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "No.", "tool_calls": [{"id": "c2", **call}]},
    ]


def test_text_format_becomes_response_format() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "name": "count", "schema": schema, "strict": True}
    chat, _ = chat_body({"input": "x", "text": {"format": fmt, "verbosity": "low"}})
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "count", "schema": schema, "strict": True},
    }
    chat, _ = chat_body({"input": "x", "text": {"format": {"type": "json_object"}}})
    assert chat["response_format"] == {"type": "json_object"}
    chat, ignored = chat_body({"input": "x", "text": {"format": {"type": "text"}, "verbosity": "high"}})
    assert "response_format" not in chat and ignored == []
    assert refused({"input": "x", "text": {"format": {"type": "xml"}}}).param == "text.format.type"
    no_schema = {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}
    assert refused(no_schema).param == "text.format.schema"


def test_tools_flat_to_chat_and_hosted_tools_dropped() -> None:
    tools = [
        {"type": "web_search"},
        WEATHER,
        {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "text"}},
        {"type": "function", "name": "noop", "parameters": None, "strict": False},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
    ]
    body = {"input": "x", "tools": tools, "tool_choice": {"type": "function", "name": "get_weather"}}
    chat, ignored = chat_body({**body, "parallel_tool_calls": False})
    assert chat["tools"] == [CHAT_WEATHER, {"type": "function", "function": {"name": "noop"}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["parallel_tool_calls"] is False
    assert ignored == ["tools[0]", "tools[2]", "tools[4]"]
    for choice in ("auto", "none", "required"):
        assert chat_body({**body, "tool_choice": choice})[0]["tool_choice"] == choice
    chat, ignored = chat_body({**body, "tool_choice": {"type": "web_search_preview"}})
    assert "tool_choice" not in chat and ignored[-1] == "tool_choice"
    only_hosted, ignored = chat_body({"input": "x", "tools": [{"type": "local_shell"}]})
    assert "tools" not in only_hosted and ignored == ["tools[0]"]
    assert refused({"input": "x", "tools": [{"type": "function"}]}).param == "tools[0].name"
    assert refused({"input": "x", "tool_choice": 3}).param == "tool_choice"


@pytest.mark.parametrize(
    ("part", "medium"),
    [({"type": "input_image", "image_url": "data:,"}, "image"), ({"type": "input_file"}, "file")],
)
def test_image_and_file_parts_are_refused(part: dict, medium: str) -> None:
    item = {"role": "user", "content": [{"type": "input_text", "text": "What is this?"}, part]}
    error = refused({"input": [user("hi"), item]})
    assert (error.status, error.param) == (400, "input[1].content[1]")
    assert error.message == f"{medium} input is not supported: this server's models read text only"
    output = {"type": "function_call_output", "call_id": "c", "output": [part]}
    assert refused({"input": [output]}).param == "input[0].output[0]"


def test_unknown_fields_and_items_are_listed_silent_ones_not() -> None:
    body = {
        "input": [
            user("hi"),
            {"type": "local_shell_call", "call_id": "s", "action": {}},
            {"type": "web_search_call", "id": "ws", "status": "completed"},
            {"type": "custom_tool_call", "call_id": "p", "name": "apply_patch", "input": "*** Begin"},
        ],
        "frobnicate": 1,
        "top_logprobs": 3,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
        "client_metadata": {"a": "b"},
        "metadata": {"m": "1"},
        "user": "u",
        "service_tier": "auto",
        "truncation": "disabled",
        "safety_identifier": "s",
        "prompt_cache_retention": "24h",
        "background": False,
        "conversation": "conv_1",
    }
    chat, ignored = chat_body(body)
    assert ignored == ["frobnicate", "top_logprobs", "conversation", "input[1]", "input[2]", "input[3]"]
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert set(chat) == {"messages"}


def test_wrong_values_are_refused_with_their_field() -> None:
    assert refused({"input": "x", "background": True}).param == "background"
    assert refused({"input": "x", "max_output_tokens": 0}).param == "max_output_tokens"
    assert refused({"input": "x", "reasoning": {"effort": "extreme"}}).param == "reasoning.effort"
    assert refused({"input": [{"role": "robot", "content": "x"}]}).param == "input[0].role"
    assert refused({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}).param == (
        "input[0].arguments"
    )
    assert refused({"input": 5}).param == "input"
    assert refused({}).param == "input"
    assert refused({"input": "x", "instructions": ["a"]}).param == "instructions"
    error = refused([])  # type: ignore[arg-type]
    assert (error.status, error.param) == (400, None)


@pytest.mark.parametrize(
    ("effort", "chat"),
    [("none", "none"), ("minimal", "low"), ("low", "low"), ("medium", "medium"), ("high", "high")],
)
def test_reasoning_effort(effort: str, chat: str) -> None:
    body, _ = chat_body({"input": "x", "reasoning": {"effort": effort, "summary": "auto"}})
    assert body["reasoning_effort"] == chat
    assert "reasoning_effort" not in chat_body({"input": "x", "reasoning": {"summary": "auto"}})[0]


# -- stored conversations ------------------------------------------------------------------


def test_previous_response_id_continues_the_conversation() -> None:
    store = ResponseStore()
    first = {"model": "m", "instructions": "Old rules.", "input": "Weather in Porto?", "tools": [WEATHER]}
    chat, _ = chat_body(first, store)
    answer, _ = chat_answer(
        reasoning=["Use the tool."], calls=[("call_9", "get_weather", ['{"city":"Porto"}'])]
    )
    response = whole(answer, first, RID)
    assert store.keep(first, chat, response) is True
    output = {"type": "function_call_output", "call_id": "call_9", "output": "21 C"}
    second = {"instructions": "New rules.", "previous_response_id": RID, "input": [output]}
    chat, ignored = chat_body(second, store)
    call = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Porto"}'},
    }
    assert chat["messages"] == [
        {"role": "system", "content": "New rules."},
        {"role": "user", "content": "Weather in Porto?"},
        {"role": "assistant", "content": None, "reasoning_content": "Use the tool.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_9", "content": "21 C"},
    ]
    assert ignored == []
    # The second turn, kept too, carries the whole conversation on.
    answer, _ = chat_answer(content=["21 C in Porto."])
    assert store.keep(second, chat, whole(answer, second, "resp_2"))
    assert store.get("resp_2")[-1] == {"role": "assistant", "content": "21 C in Porto."}  # type: ignore[index]
    assert len(store.get("resp_2") or []) == 4
    # Without a store the field changes nothing, and says so.
    assert chat_body(second)[1] == ["previous_response_id"]


def test_unknown_previous_response_is_a_404() -> None:
    error = refused({"input": "x", "previous_response_id": "resp_gone"}, ResponseStore(capacity=3))
    assert (error.status, error.param, error.code) == (
        404,
        "previous_response_id",
        "previous_response_not_found",
    )
    assert error.message == (
        "no stored response 'resp_gone' (responses are kept in memory, at most 3, until the server stops)"
    )


def test_store_false_and_failures_are_not_kept() -> None:
    store = ResponseStore()
    request = {"input": "x", "store": False}
    chat, _ = chat_body(request)
    answer, _ = chat_answer(content=["y"])
    assert store.keep(request, chat, whole(answer, request, RID)) is False
    assert store.keep({"input": "x"}, chat, {"id": RID, "status": "failed", "output": []}) is False
    assert store.get(RID) is None


def test_store_keeps_the_most_recently_used() -> None:
    store = ResponseStore(capacity=2)
    for name in ("a", "b"):
        store.put(name, [{"role": "user", "content": name}])
    assert store.get("a") == [{"role": "user", "content": "a"}]  # "a" is now the most recent
    store.put("c", [{"role": "user", "content": "c"}])
    assert store.get("b") is None
    assert store.get("a") is not None and store.get("c") is not None
    store.put("d", [])
    assert store.get("a") is None  # ...and then the oldest again
    kept = store.get("c")
    kept[0]["content"] = "changed"  # type: ignore[index]
    assert store.get("c") == [{"role": "user", "content": "c"}]

"""The OpenAI Responses wire format (``edgespec.server.responses``), without a model: requests
translated to chat bodies, chat answers translated back, every body and stream event checked
against the ``openai`` SDK's own types, and the SDK's own client (over a mock transport)
reading the answers the way ``client.responses.create`` and ``.stream`` do."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from edgespec.server.errors import ApiError
from edgespec.server.responses import ResponseStore, ResponseStream, chat_body, whole

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
RID = "resp_5e1f"
CREATED = 1_760_000_000
USAGE = {
    "prompt_tokens": 12,
    "completion_tokens": 7,
    "total_tokens": 19,
    "prompt_tokens_details": {"cached_tokens": 4},
    "completion_tokens_details": {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
}
TIMINGS = {"prompt_n": 8, "cache_n": 4, "predicted_n": 7}
SPECULATION = {"drafter": "auto", "gamma": "auto", "steps": 3}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
CHAT_WEATHER = {
    "type": "function",
    "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
}


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def refused(body: dict, store: ResponseStore | None = None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        chat_body(body, store)
    return caught.value


def chat_answer(
    *,
    reasoning: list[str] | tuple[()] = (),
    content: list[str] | tuple[()] = (),
    calls: list[tuple[str, str, list[str]]] | tuple[()] = (),
    finish: str = "stop",
) -> tuple[dict, list[dict]]:
    """One answer as the chat pipeline gives it: whole, and as its stream of chunks."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": CREATED, "model": "qwen3"}

    def chunk(delta: dict, **end: Any) -> dict:
        return {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **end}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": piece}) for piece in reasoning]
    chunks += [chunk({"content": piece}) for piece in content]
    for i, (call_id, name, pieces) in enumerate(calls):
        header = {"index": i, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        chunks.append(chunk({"tool_calls": [header]}))
        chunks += [chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}) for p in pieces]
    stop = "max_tokens" if finish == "length" else "eos"
    chunks.append(chunk({}, finish_reason=finish, stop_reason=stop, stop_sequence=None))
    chunks.append({**head, "choices": [], "usage": USAGE, "timings": TIMINGS, "speculation": SPECULATION})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": n, "arguments": "".join(p)}}
            for c, n, p in calls
        ]
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": finish,
        "stop_reason": stop,
        "stop_sequence": None,
    }
    body = {
        **head,
        "object": "chat.completion",
        "choices": [choice],
        "usage": USAGE,
        "timings": TIMINGS,
        "speculation": SPECULATION,
    }
    return body, chunks


REQUEST = {"model": "qwen3-0.6b", "input": "hi", "tools": [WEATHER], "max_output_tokens": 50, "stream": True}


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


# -- answers -------------------------------------------------------------------------------


def test_whole_text_answer() -> None:
    answer, _ = chat_answer(reasoning=["Greet."], content=["Hello", " there."])
    body = whole(answer, REQUEST, RID)
    assert body["output"] == [
        {
            "type": "reasoning",
            "id": "rs_5e1f_0",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Greet."}],
        },
        {
            "type": "message",
            "id": "msg_5e1f_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello there.", "annotations": []}],
        },
    ]
    assert body["usage"] == {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 19,
    }
    assert (body["id"], body["object"], body["created_at"], body["status"]) == (
        RID,
        "response",
        CREATED,
        "completed",
    )
    assert (body["model"], body["max_output_tokens"], body["tools"]) == ("qwen3-0.6b", 50, [WEATHER])
    assert (body["timings"], body["speculation"]) == (TIMINGS, SPECULATION)
    parsed = Response.model_validate(body)
    assert parsed.output_text == "Hello there."
    assert parsed.incomplete_details is None and parsed.tool_choice == "auto" and parsed.store is True


def test_whole_tool_call_and_length_cut() -> None:
    answer, _ = chat_answer(calls=[("call_1", "get_weather", ['{"city":', '"Porto"}'])], finish="tool_calls")
    parsed = Response.model_validate(whole(answer, REQUEST, RID))
    call = parsed.output[0]
    assert call.type == "function_call"
    assert (call.id, call.call_id, call.name, call.arguments) == (
        "fc_5e1f_0",
        "call_1",
        "get_weather",
        '{"city":"Porto"}',
    )
    assert parsed.output_text == ""
    answer, _ = chat_answer(content=["Once upon"], finish="length")
    body = whole(answer, REQUEST, RID)
    assert (body["status"], body["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert body["output"][0]["status"] == "incomplete"
    assert Response.model_validate(body).output_text == "Once upon"


# -- streams -------------------------------------------------------------------------------


def parse_sse(text: str) -> dict:
    head, data = text.removesuffix("\n\n").split("\n")
    assert head.startswith("event: ") and data.startswith("data: ") and text.endswith("\n\n")
    event = json.loads(data.removeprefix("data: "))
    assert event["type"] == head.removeprefix("event: ")
    return event


def run_stream(chunks: list[dict], request: dict = REQUEST) -> tuple[ResponseStream, list[str], list[dict]]:
    stream = ResponseStream(request, RID)
    texts = [text for chunk in chunks for text in stream.feed(chunk)] + stream.finish()
    events = [parse_sse(text) for text in texts]
    for event in events:
        EVENTS.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert stream.finish() == [] and stream.feed(chunks[-1] if chunks else {}) == []
    return stream, texts, events


def sdk_client(body: Callable[[], bytes | dict], seen: list[dict] | None = None) -> openai.OpenAI:
    """The official client, answered by a mock transport instead of a server."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        if seen is not None:
            seen.append(json.loads(request.content))
        given = body()
        if isinstance(given, bytes):
            return httpx2.Response(200, content=given, headers={"content-type": "text/event-stream"})
        return httpx2.Response(200, json=given)

    transport = httpx2.Client(transport=httpx2.MockTransport(answer))
    return openai.OpenAI(
        api_key="k",
        base_url="http://edgespec.test/v1",
        http_client=transport,
        max_retries=0,
        _strict_response_validation=True,
    )


STREAMS = {
    "text": dict(content=["Hel", "lo", "!"]),
    "reasoning_then_text": dict(reasoning=["Think", "ing."], content=["Done."]),
    "call_in_two_pieces": dict(
        calls=[("call_7", "get_weather", ['{"city":', '"Porto"}'])], finish="tool_calls"
    ),
    "text_then_two_calls": dict(
        content=["Both:"],
        calls=[("call_a", "get_weather", ['{"city":"A"}']), ("call_b", "get_weather", ['{"city":"B"}'])],
        finish="tool_calls",
    ),
    "empty": dict(),
    "only_thinking": dict(reasoning=["Hmm"]),
}


@pytest.mark.parametrize("case", list(STREAMS))
def test_stream_rebuilds_the_whole_answer(case: str) -> None:
    answer, chunks = chat_answer(**STREAMS[case])
    stream, texts, events = run_stream(chunks)
    expected = whole(answer, REQUEST, RID)
    assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress"
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[-1] == {
        "type": "response.completed",
        "response": expected,
        "sequence_number": len(events) - 1,
    }
    assert stream.response == expected
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == expected["output"]
    # The SDK's stream helper accumulates the same response from the SSE bytes.
    client = sdk_client(lambda: "".join(texts).encode())
    with client.responses.stream(model="qwen3-0.6b", input="hi") as sdk_stream:
        seen = list(sdk_stream)
        final = sdk_stream.get_final_response()
    assert [e.type for e in seen] == [e["type"] for e in events]
    assert final.model_dump(exclude={"output"}) == Response.model_validate(expected).model_dump(
        exclude={"output"}
    )
    assert [item.model_dump(exclude_none=True) for item in final.output] == [
        Response.model_validate(expected).output[i].model_dump(exclude_none=True)
        for i in range(len(final.output))
    ]
    assert final.output_text == "".join(STREAMS[case].get("content", []))
    deltas = [e for e in seen if e.type == "response.output_text.delta"]
    if deltas:
        assert deltas[-1].snapshot == final.output_text  # type: ignore[union-attr]


def test_stream_events_in_order_for_reasoning_then_text() -> None:
    _, chunks = chat_answer(reasoning=["A", "B"], content=["C"])
    _, _, events = run_stream(chunks)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[4] == {
        "type": "response.reasoning_text.delta",
        "item_id": "rs_5e1f_0",
        "output_index": 0,
        "content_index": 0,
        "delta": "A",
        "sequence_number": 4,
    }
    assert events[6]["text"] == "AB" and events[7]["part"] == {"type": "reasoning_text", "text": "AB"}
    assert events[11] == {
        "type": "response.output_text.delta",
        "item_id": "msg_5e1f_1",
        "output_index": 1,
        "content_index": 0,
        "delta": "C",
        "logprobs": [],
        "sequence_number": 11,
    }
    assert events[9]["item"] == {
        "type": "message",
        "id": "msg_5e1f_1",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }


def test_stream_call_arguments_in_two_pieces() -> None:
    _, chunks = chat_answer(calls=[("call_7", "get_weather", ['{"city":', '"Porto"}'])], finish="tool_calls")
    _, _, events = run_stream(chunks)
    calls = [
        e for e in events if "function_call" in e["type"] or e["type"].startswith("response.output_item")
    ]
    assert [(e["type"], e.get("delta", e.get("arguments"))) for e in calls] == [
        ("response.output_item.added", None),
        ("response.function_call_arguments.delta", '{"city":'),
        ("response.function_call_arguments.delta", '"Porto"}'),
        ("response.function_call_arguments.done", '{"city":"Porto"}'),
        ("response.output_item.done", None),
    ]
    assert calls[0]["item"] == {
        "type": "function_call",
        "id": "fc_5e1f_0",
        "status": "in_progress",
        "call_id": "call_7",
        "name": "get_weather",
        "arguments": "",
    }
    assert calls[3]["name"] == "get_weather" and calls[4]["item"]["status"] == "completed"


def test_stream_cut_by_length_is_incomplete() -> None:
    answer, chunks = chat_answer(reasoning=["Let me"], content=["Once", " upon"], finish="length")
    _, texts, events = run_stream(chunks)
    expected = whole(answer, REQUEST, RID)
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"] == expected
    assert expected["status"] == "incomplete" and expected["output"][1]["status"] == "incomplete"
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == [
        "reasoning",
        "message",
    ]
    client = sdk_client(lambda: "".join(texts).encode())
    with client.responses.create(model="qwen3-0.6b", input="hi", stream=True) as raw:
        last = list(raw)[-1]
    assert last.type == "response.incomplete"
    assert last.response.status == "incomplete" and last.response.output_text == "Once upon"  # type: ignore[union-attr]
    assert last.response.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]


def test_stream_without_usage_chunk_ends_at_finish() -> None:
    _, chunks = chat_answer(content=["ok"])
    stream = ResponseStream(REQUEST, RID)
    texts = [t for c in chunks[:-1] for t in stream.feed(c)]
    assert parse_sse(texts[-1])["type"] == "response.output_item.done"
    last = parse_sse(stream.finish()[-1])
    assert last["type"] == "response.completed" and last["response"]["usage"] is None
    assert Response.model_validate(last["response"]).output_text == "ok"


def test_stream_error_chunk_fails_the_response() -> None:
    _, chunks = chat_answer(content=["Par", "tial"])
    error = {"error": {"message": "the engine stopped", "type": "server_error", "param": None, "code": None}}
    _, texts, events = run_stream([*chunks[:2], error, chunks[2]])
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "error",
        "response.failed",
    ]
    assert events[5] == {
        "type": "error",
        "code": None,
        "message": "the engine stopped",
        "param": None,
        "sequence_number": 5,
    }
    failed = events[6]["response"]
    assert (failed["status"], failed["error"]) == (
        "failed",
        {"code": "server_error", "message": "the engine stopped"},
    )
    assert failed["output"][0]["status"] == "incomplete"
    assert Response.model_validate(failed).output_text == "Par"
    client = sdk_client(lambda: "".join(texts).encode())
    with client.responses.create(model="qwen3-0.6b", input="hi", stream=True) as raw:
        assert [e.type for e in raw][-2:] == ["error", "response.failed"]


def test_stream_error_before_anything_still_opens_the_response() -> None:
    _, _, events = run_stream(
        [{"error": {"message": "queue full", "type": "x", "param": None, "code": "rate_limit_exceeded"}}]
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    assert events[3]["response"]["error"] == {"code": "rate_limit_exceeded", "message": "queue full"}


def test_empty_stream_still_completes() -> None:
    _, _, events = run_stream([])
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]
    assert events[-1]["response"]["output"] == []


# -- the SDK as a client -------------------------------------------------------------------


def test_sdk_request_translates_and_reads_the_whole_answer() -> None:
    seen: list[dict] = []
    answer, _ = chat_answer(content=["It is 21 C."])
    client = sdk_client(lambda: whole(answer, seen[-1], RID), seen)
    response = client.responses.create(
        model="qwen3-0.6b",
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "Weather in Porto?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Porto"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
        reasoning={"effort": "low"},
        text={"format": {"type": "json_object"}},
        max_output_tokens=32,
        metadata={"run": "1"},
    )
    assert response.output_text == "It is 21 C." and response.id == RID
    assert response.metadata == {"run": "1"} and response.reasoning.effort == "low"  # type: ignore[union-attr]
    chat, ignored = chat_body(seen[0])
    assert ignored == []
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][2]["tool_calls"][0]["id"] == "call_1"
    assert (chat["reasoning_effort"], chat["max_tokens"], chat["response_format"]) == (
        "low",
        32,
        {"type": "json_object"},
    )


CODEX_PARAMETERS = {
    "type": "object",
    "properties": {"command": {"type": "array", "items": {"type": "string"}}},
}


def codex_body() -> dict:
    """A request shaped like Codex CLI's: its instructions, a developer message, context in
    user messages, function tools beside hosted and custom ones, encrypted reasoning."""
    function = {"type": "function", "strict": False, "parameters": CODEX_PARAMETERS}
    tools = [
        {**function, "name": "shell", "description": "Runs a shell command and returns its output."},
        {**function, "name": "update_plan", "description": "Updates the task plan."},
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Edit files.",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
        },
        {"type": "web_search"},
        {"type": "local_shell"},
        {**function, "name": "view_image", "description": "Attach a local image."},
        {**function, "name": "list_mcp_resources", "description": "Lists resources."},
        {**function, "name": "read_mcp_resource", "description": "Reads a resource."},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
    ]
    return {
        "model": "gpt-5-codex",
        "instructions": "You are Codex, a coding agent.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "<permissions>"}],
            },
            user("<environment_context><cwd>/repo</cwd></environment_context>"),
            user("Fix the failing test."),
            {
                "type": "reasoning",
                "id": "rs_x",
                "summary": [{"type": "summary_text", "text": "**Run tests**"}],
                "content": None,
                "encrypted_content": "gAAAA",
            },
            {
                "type": "function_call",
                "id": "fc_x",
                "call_id": "call_1",
                "name": "shell",
                "arguments": '{"command":["pytest"]}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "1 failed"},
            {
                "type": "custom_tool_call",
                "call_id": "call_2",
                "name": "apply_patch",
                "input": "*** Begin Patch",
            },
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done"},
        ],
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1b2-c3d4",
        "text": {"verbosity": "medium"},
        "client_metadata": {"originator": "codex_cli_rs"},
    }


def test_codex_shaped_request() -> None:
    body = codex_body()
    chat, ignored = chat_body(body, ResponseStore())
    assert ignored == ["input[6]", "input[7]", "tools[2]", "tools[3]", "tools[4]", "tools[8]"]
    assert [t["function"]["name"] for t in chat["tools"]] == [
        "shell",
        "update_plan",
        "view_image",
        "list_mcp_resources",
        "read_mcp_resource",
    ]
    assert [m["role"] for m in chat["messages"]] == ["system", "system", "user", "user", "assistant", "tool"]
    assert chat["messages"][4]["reasoning_content"] == "**Run tests**"
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["reasoning_effort"]) == (
        "auto",
        False,
        "medium",
    )
    assert chat["stream"] is True and "response_format" not in chat
    # Its answer, echoing those tools, still reads as the SDK's Response.
    answer, chunks = chat_answer(
        reasoning=["Patch it."], calls=[("call_3", "shell", ['{"command":["ls"]}'])], finish="tool_calls"
    )
    assert Response.model_validate(whole(answer, body, RID)).output[1].type == "function_call"
    assert run_stream(chunks, body)[0].response == whole(answer, body, RID)

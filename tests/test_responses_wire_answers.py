"""The OpenAI Responses wire format (``edgespec.server.responses``), without a model: chat
answers translated back, whole and as stream events checked against the ``openai`` SDK's
own types, and the SDK's own client (over a mock transport) reading the answers the way
``client.responses.create`` and ``.stream`` do."""

from __future__ import annotations

import pytest
from openai.types.responses import Response

from edgespec.server.responses import ResponseStore, ResponseStream, chat_body, whole
from tests.responses_wire_cases import (
    CREATED,
    REQUEST,
    RID,
    SPECULATION,
    STREAMS,
    TIMINGS,
    WEATHER,
    chat_answer,
    parse_sse,
    run_stream,
    sdk_client,
    user,
)

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

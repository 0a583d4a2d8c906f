"""The Anthropic Messages wire format (``server.anthropic``), model-free: chat answers become
Messages and stream events, each checked against the official ``anthropic`` SDK's own
types; each stream is read back by the SDK's own client (its SSE parser and accumulator,
over a mock transport) and must rebuild the Message the non-streaming path makes from the
same answer."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pydantic
import pytest
from anthropic.types import ErrorResponse, Message, RawMessageStreamEvent

from edgespec.server import anthropic as wire
from tests.anthropic_wire_cases import (
    ANTHROPIC_USAGE,
    MODEL,
    MSG_ID,
    SPECULATION,
    TIMINGS,
    USAGE,
    Answer,
    chat_answer,
    chat_chunks,
    sdk_stream,
    translate,
)

EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


# -- answers -------------------------------------------------------------------------------


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

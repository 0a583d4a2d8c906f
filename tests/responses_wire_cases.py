"""Shared cases for the Responses wire tests: the constants, chat answers as whole bodies and
streams of chunks, a stream runner that checks every event against the ``openai`` SDK's
types, and the SDK's client over a mock transport."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2
import openai
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from edgespec.server.responses import ResponseStream

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


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


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

"""Shared cases for the Anthropic Messages wire tests: the constants, chat answers as whole
bodies and streams of chunks, their translation to Anthropic stream events, and the
``anthropic`` SDK's own client over a mock transport."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anthropic

from edgespec.server import anthropic as wire

MODEL = "claude-sonnet-4-6"
MSG_ID = "msg_0123456789abcdef01234567"
CHAT_ID = "chatcmpl-0123456789abcdef01234567"


def call(call_id: str, arguments: str, name: str = "get_weather") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def sdk_client(handler: Callable[[Any], Any]) -> anthropic.Anthropic:
    """The SDK's own client over a mock transport of the HTTP library it is built on."""
    http = sys.modules[anthropic.DefaultHttpxClient.__mro__[1].__module__.split(".")[0]]
    client = http.Client(transport=http.MockTransport(handler))
    return anthropic.Anthropic(
        api_key="test", base_url="http://edgespec.test", http_client=client, max_retries=0
    )


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

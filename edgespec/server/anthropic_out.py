"""Anthropic Messages answers: a chat answer (whole, or its stream chunks) as a Message or
as Anthropic's stream events, and Anthropic's error bodies. The rules are in the docstring
of ``server.anthropic``, which translates the requests."""

from __future__ import annotations

import json
import uuid
from typing import Any

SIGNATURE = "edgespec-unsigned"  # the thinking blocks' placeholder signature
TOOLU = "toolu_"

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}
ERROR_TYPES |= {404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}
ERROR_TYPES |= {500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def tool_use_id(call_id: str) -> str:
    return f"{TOOLU}{call_id}"


# -- answers -------------------------------------------------------------------------------


def message_id(chat_id: str | None = None) -> str:
    """A Message id: the chat answer's own hex part where there is one."""
    rest = chat_id.removeprefix("chatcmpl-") if chat_id else ""
    return f"msg_{rest or uuid.uuid4().hex[:24]}"


def stop_reason(choice: dict) -> str:
    """Anthropic's stop reason for a chat choice (or a stream's finish chunk's choice)."""
    if choice.get("finish_reason") == "tool_calls":
        return "tool_use"
    if choice.get("finish_reason") == "length":
        return "max_tokens"
    if isinstance(choice.get("stop_sequence"), str) or choice.get("stop_reason") == "stop_string":
        return "stop_sequence"
    return "end_turn"


def usage(chat_usage: dict | None) -> dict:
    """Anthropic's usage from the chat usage: cache reads apart from the input."""
    chat_usage = chat_usage or {}
    prompt = chat_usage.get("prompt_tokens", 0)
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    out = {
        "input_tokens": max(0, prompt - cached),
        "output_tokens": chat_usage.get("completion_tokens", 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }
    thinking = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    if thinking is not None:
        out["output_tokens_details"] = {"thinking_tokens": thinking}
    return out


def _arguments(text: str) -> dict:
    """A call's arguments as an object; anything else shows as none rather than failing."""
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool_block(call_id: str, name: str, arguments: dict) -> dict:
    return {"type": "tool_use", "id": tool_use_id(call_id), "name": name, "input": arguments}


def whole(chat: dict, model: str) -> dict:
    """A chat.completion body as a Message, for the model name the client asked for."""
    choice = chat["choices"][0]
    message = choice.get("message") or {}
    content: list[dict] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": SIGNATURE})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        content.append(_tool_block(call["id"], function["name"], _arguments(function.get("arguments", ""))))
    out = {
        "id": message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice),
        "stop_sequence": choice.get("stop_sequence"),
        "usage": usage(chat.get("usage")),
    }
    for extra in ("timings", "speculation"):
        if extra in chat:
            out[extra] = chat[extra]
    return out


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> dict:
    """Anthropic's error body for an HTTP status."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def _stream_error_type(error: dict) -> str:
    """Anthropic's error type for a chat stream's error object (which has no status)."""
    kind, code = error.get("type"), error.get("code")
    if kind in ERROR_TYPES.values():
        return kind
    if code in ("overloaded", "server_busy"):
        return "overloaded_error"
    return "api_error"


def event(name: str, data: dict) -> str:
    """One server-sent event in Anthropic's shape: the event's name, then its data."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class MessageStream:
    """Chat stream chunks → Anthropic stream events, for one answer."""

    def __init__(self, model: str, message_id: str, *, input_tokens: int = 0):
        self.model = model
        self.id = message_id
        self.input_tokens = input_tokens  # shown at the start; the end's usage corrects it
        self.started = False
        self.ended = False
        self.block: str | None = None  # the open block's type
        self.index = -1  # the open (or last) block's index
        self.stop: dict = {}  # the finish chunk's choice

    def feed(self, chunk: dict) -> list[str]:
        if self.ended:
            return []
        error = chunk.get("error")
        if isinstance(error, dict):
            self.ended = True
            body = {"type": _stream_error_type(error), "message": str(error.get("message", "error"))}
            return [event("error", {"type": "error", "error": body})]
        out = self._start()
        for choice in chunk.get("choices") or []:
            out += self._delta(choice.get("delta") or {})
            if choice.get("finish_reason") is not None:
                out += self._close()
                self.stop = choice
        if chunk.get("usage") is not None:
            out += self._end(chunk)
        return out

    def finish(self) -> list[str]:
        if self.ended:
            return []
        return self._start() + self._close() + self._end({})

    def _start(self) -> list[str]:
        if self.started:
            return []
        self.started = True
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage(None), "input_tokens": self.input_tokens},
        }
        return [event("message_start", {"type": "message_start", "message": message}), _PING]

    def _delta(self, delta: dict) -> list[str]:
        out: list[str] = []
        if delta.get("reasoning_content"):
            out += self._piece("thinking", {"type": "thinking_delta", "thinking": delta["reasoning_content"]})
        if delta.get("content"):
            out += self._piece("text", {"type": "text_delta", "text": delta["content"]})
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id"):
                out += self._close()
                out += self._open(_tool_block(call["id"], function.get("name", ""), {}))
            if function.get("arguments") and self.block == "tool_use":
                out.append(
                    self._block_delta({"type": "input_json_delta", "partial_json": function["arguments"]})
                )
        return out

    def _piece(self, kind: str, delta: dict) -> list[str]:
        """A thinking or text piece: in the open block of its kind, or a new one."""
        out: list[str] = []
        if self.block != kind:
            out += self._close()
            out += self._open(dict(_EMPTY[kind]))
        out.append(self._block_delta(delta))
        return out

    def _open(self, block: dict) -> list[str]:
        self.index += 1
        self.block = block["type"]
        data = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [event("content_block_start", data)]

    def _block_delta(self, delta: dict) -> str:
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}
        )

    def _close(self) -> list[str]:
        if self.block is None:
            return []
        out = []
        if self.block == "thinking":
            out.append(self._block_delta({"type": "signature_delta", "signature": SIGNATURE}))
        self.block = None
        return [*out, event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _end(self, chunk: dict) -> list[str]:
        """``message_delta`` (with the usage chunk's figures, where it came) and ``message_stop``."""
        self.ended = True
        found = chunk.get("usage")
        figures = usage(found) if found is not None else {"output_tokens": 0}
        data: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(self.stop), "stop_sequence": self.stop.get("stop_sequence")},
            "usage": figures,
        }
        for extra in ("timings", "speculation"):
            if extra in chunk:
                data[extra] = chunk[extra]
        return [*self._close(), event("message_delta", data), event("message_stop", {"type": "message_stop"})]


_PING = event("ping", {"type": "ping"})
_EMPTY = {
    "thinking": {"type": "thinking", "thinking": "", "signature": ""},
    "text": {"type": "text", "text": ""},
}

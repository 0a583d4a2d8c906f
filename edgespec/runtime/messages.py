"""Chat messages checked once, for every front end, and brought to the shape chat
templates read: OpenAI's message format (roles ``system``, ``developer``, ``user``,
``assistant``, ``tool``; text or a list of text parts; assistant ``tool_calls`` with
arguments as a JSON string or an object; a ``tool`` result naming its call). A refusal is
a ``RequestError`` whose ``param`` names the message and field (``messages[2].content``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from edgespec.errors import RequestError

ROLES = ("system", "user", "assistant", "tool")  # what chat templates know
ALIASES = {"developer": "system"}  # OpenAI's newer name for the system role
ACCEPTED_ROLES = ("system", "developer", "user", "assistant", "tool")


def normalise_messages(messages: Any) -> list[dict[str, Any]]:
    """Check chat messages and bring them to the shape templates read; one line naming
    the message for anything a template could not render."""
    if messages is None:
        raise RequestError("'messages' is required", "messages")
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise RequestError("'messages' must be a list of messages", "messages")
    if not messages:
        raise RequestError("'messages' is empty", "messages")
    return [_message(message, f"messages[{i}]") for i, message in enumerate(messages)]


def check_conversation(messages: list[dict[str, Any]]) -> None:
    """A conversation to answer: at least one user message with text."""
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        raise RequestError("'messages' holds no user message with text", "messages")


def _message(message: Any, param: str) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise RequestError(f"'{param}' must be an object with 'role' and 'content'", param)
    given = message.get("role")
    role = ALIASES.get(given, given) if isinstance(given, str) else None
    if role not in ROLES:
        raise RequestError(
            f"'{param}.role': each chat message needs a role ({', '.join(ACCEPTED_ROLES)}; got {given!r})",
            param,
        )
    item = {**message, "role": role}
    calls = item.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, Sequence) or isinstance(calls, str):
            raise RequestError(
                f"'{param}.tool_calls': only an assistant message can carry tool_calls, as a list",
                f"{param}.tool_calls",
            )
        item["tool_calls"] = [_tool_call(c, f"{param}.tool_calls[{i}]") for i, c in enumerate(calls)]
        if not item["tool_calls"]:
            del item["tool_calls"]
    if item.get("content") is None and role != "assistant":
        raise RequestError(f"'{param}.content': a {role} message needs text content", param)
    item["content"] = _text(item.get("content"), role, f"{param}.content")
    for key in ("tool_call_id", "name"):
        if key in item and not isinstance(item[key], str):
            raise RequestError(f"'{param}.{key}': a message's {key} must be a string", param)
    if role == "tool" and "tool_call_id" not in item:
        raise RequestError(f"'{param}.tool_call_id' must name the call this result answers", param)
    return item


def _text(content: Any, role: str, param: str) -> str:
    """A message's content as text: a string, nothing (an assistant turn that only calls
    tools), or OpenAI's list of text parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, Sequence) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise RequestError(
        f"'{param}': a {role} message's content must be text (a string or a list of parts of type 'text')",
        param,
    )


def _tool_call(call: Any, param: str) -> dict[str, Any]:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise RequestError(f"'{param}': each tool call needs a function with a name and arguments", param)
    function = dict(call["function"])
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise RequestError(f"'{param}': each tool call needs a function name", param)
    if not isinstance(function.get("arguments", {}), str | Mapping):
        raise RequestError(f"'{param}.function.arguments' must be a JSON string", param)
    if not isinstance(call.get("id", ""), str):
        raise RequestError(f"'{param}.id' must be a string", param)
    function["arguments"] = _arguments(function.get("arguments", {}))
    return {**call, "type": call.get("type", "function"), "function": function}


def _arguments(value: Any) -> Any:
    """Tool-call arguments as the templates expect them: an object, not OpenAI's JSON
    string (a string that is not a JSON object is passed on as it is)."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return value

"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) as a
translation over the chat pipeline: a request becomes an OpenAI chat body, the chat
answer (whole, or its stream chunks) becomes a Message or Anthropic's stream events.
Pure: no web framework, no model.

Requests, the rules followed:

* ``system`` (a string or text blocks) is one system message, first, joined by any
  ``system`` message inside ``messages`` (not Anthropic's; Claude Code's); ``cache_control``
  on any block means nothing here (the prompt cache is automatic) and is dropped.
* Text blocks of one message are joined with a blank line, so separate blocks (Claude
  Code's reminders beside the user's words) never run into one another.
* An assistant's ``tool_use`` blocks are its ``tool_calls`` (arguments: compact JSON of
  ``input``), its ``thinking`` its ``reasoning_content``; ``redacted_thinking`` holds
  nothing a local model can read and is dropped. A user's ``tool_result`` blocks are
  ``tool`` messages in their order, then the message's text blocks one user message, so
  the results follow the calls they answer as chat templates expect.
* Tool ids round-trip: a call ``X`` is shown as ``toolu_X`` and ``toolu_X`` comes back as
  ``X``, so the ids the model's template checks (Mistral's nine characters) survive.
* Images and documents are refused (the models read text only); server tools (any tool
  with a ``type`` other than ``custom``) are dropped and named in the ignored list.
* ``thinking`` enabled / disabled is the template's ``enable_thinking`` switch; adaptive
  or absent leaves the model's default. ``output_config.format`` (a JSON schema) is the
  chat ``response_format``.
* Unknown top-level fields are ignored and listed; fields Anthropic knows that change
  nothing here are accepted silently. Wrong values of translated fields are a 400 whose
  ``param`` is the field's path in the Anthropic request (``messages[1].content[0]``).

Answers: ``stop_reason`` is ``tool_use`` for calls, ``max_tokens`` for a cut answer
(the request's limit or the context's), ``stop_sequence`` for a stop string, else
``end_turn``. ``usage.input_tokens`` excludes the prompt tokens read from the cache,
which are ``cache_read_input_tokens``, as Anthropic counts. edgespec's ``timings`` and
``speculation`` ride along as extra fields (on the Message; in a stream on
``message_delta``). A thinking block carries a fixed placeholder ``signature``: nothing is
signed here, and a signature that comes back is not checked.

A stream is ``message_start``, ``ping``, then per content block ``content_block_start``,
its deltas (``thinking_delta`` closed by a ``signature_delta``, ``text_delta``,
``input_json_delta``) and ``content_block_stop``, blocks indexed from 0, then
``message_delta`` (stop reason and usage) and ``message_stop``. An error ends the stream
with an ``error`` event. Each event is ``event: NAME`` and ``data: JSON`` lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from edgespec.server.anthropic_out import (  # noqa: F401 (the answers' side, re-exported)
    ERROR_TYPES,
    SIGNATURE,
    TOOLU,
    MessageStream,
    error_body,
    message_id,
    tool_use_id,
    whole,
)
from edgespec.server.errors import bad_request

# Fields translated into the chat body.
_TRANSLATED = {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p"}
_TRANSLATED |= {"top_k", "stream", "tools", "tool_choice", "thinking", "output_config"}
# edgespec's own fields, copied as they are.
_OWN = ("drafter", "gamma", "verify", "lenience", "grammar", "seed")
# Fields Anthropic knows that change nothing for a local model: accepted without a word.
_NO_EFFECT = {"metadata", "service_tier", "container", "mcp_servers", "context_management", "betas"}
_NO_EFFECT |= {"cache_control", "inference_geo", "speed"}
_KNOWN = _TRANSLATED | set(_OWN) | _NO_EFFECT

_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


_JOIN = "\n\n"


# -- requests ------------------------------------------------------------------------------


def chat_body(body: Any) -> tuple[dict, list[str]]:
    """A ``/v1/messages`` request as an OpenAI chat body, and the top-level fields (and
    dropped server tools, ``tools[i]``) it ignored."""
    return _translate(body, counting=False)


def count_tokens_body(body: Any) -> tuple[dict, list[str]]:
    """A ``/v1/messages/count_tokens`` request as the chat body whose prompt is counted
    (``max_tokens`` is not needed), and the fields it ignored."""
    return _translate(body, counting=True)


def count_tokens_response(n: int) -> dict:
    return {"input_tokens": n}


def _translate(body: Any, *, counting: bool) -> tuple[dict, list[str]]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    ignored = [name for name in body if name not in _KNOWN]
    chat: dict[str, Any] = {}
    if "model" in body:
        chat["model"] = body["model"]
    chat["messages"] = _with_system(body.get("system"), _messages(body.get("messages")))
    _limits(body, chat, counting)
    tools, dropped = _tools(body.get("tools"))
    ignored += dropped
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), chat)
    _thinking(body.get("thinking"), chat)
    _output_format(body.get("output_config"), chat)
    for name in _OWN:
        if body.get(name) is not None:
            chat[name] = body[name]
    if counting:
        chat.pop("stream", None)
        chat.pop("stream_options", None)
    return chat, ignored


def _limits(body: dict, chat: dict, counting: bool) -> None:
    """``max_tokens``, stop sequences, sampling and streaming."""
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not counting:
        raise bad_request("'max_tokens' is required: the most tokens the answer may have", "max_tokens")
    if max_tokens is not None:
        if not _is_int(max_tokens) or max_tokens < 1:
            raise bad_request(f"'max_tokens' must be a positive integer (got {max_tokens!r})", "max_tokens")
        chat["max_tokens"] = max_tokens
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise bad_request("'stop_sequences' must be a list of non-empty strings", "stop_sequences")
        if stop:
            chat["stop"] = list(stop)
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]  # (their types and ranges: the chat parser checks them)
    stream = body.get("stream")
    if stream is not None:
        if not isinstance(stream, bool):
            raise bad_request(f"'stream' must be true or false (got {stream!r})", "stream")
        chat["stream"] = stream
        if stream:
            chat["stream_options"] = {"include_usage": True}


def _with_system(system: Any, messages: list[dict]) -> list[dict]:
    """``system`` first, joined by the text of any system message inside ``messages``:
    Claude Code sends its environment that way, after the user's question, where a small
    model would read it as the turn to answer (and echo it)."""
    texts = [] if system is None else [_texts(system, "system")]
    texts += [m["content"] for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    text = _JOIN.join(t for t in texts if t)
    return [{"role": "system", "content": text}, *rest] if text else rest


def _texts(content: Any, param: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{param}' must be a string or a list of text blocks", param)
    texts = []
    for j, block in enumerate(content):
        at = f"{param}[{j}]"
        kind = _block_type(block, at)
        if kind != "text":
            _refuse_media(kind, at)
            raise bad_request(f"'{at}' must be a text block (got type {kind!r})", at)
        texts.append(_text_of(block, at))
    return _JOIN.join(texts)


def _block_type(block: Any, param: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise bad_request(f"'{param}' must be a content block: an object with a 'type'", param)
    return block["type"]


def _text_of(block: dict, param: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad_request(f"'{param}.text' must be a string", param)
    return text


def _refuse_media(kind: str, param: str) -> None:
    if kind in ("image", "document"):
        raise bad_request(f"{kind} blocks are not supported: this server's models read text only", param)


def _messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list):
        raise bad_request("'messages' must be a list of messages", "messages")
    out: list[dict] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"'{param}' must be an object with 'role' and 'content'", param)
        role = message.get("role")
        content = message.get("content")
        if role not in ("user", "assistant", "system"):
            raise bad_request(f"'{param}.role' must be 'user' or 'assistant' (got {role!r})", f"{param}.role")
        if role == "system":
            # Not Anthropic's, but Claude Code sends its environment this way.
            out.append({"role": "system", "content": _texts(content, f"{param}.content")})
        elif isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out += _user(content, param) if role == "user" else [_assistant(content, param)]
        else:
            raise bad_request(f"'{param}.content' must be a string or a list of blocks", f"{param}.content")
    return out


def _blocks(blocks: list, param: str) -> Iterator[tuple[str, str, dict]]:
    """A message's content blocks, each with its path and type."""
    for j, block in enumerate(blocks):
        at = f"{param}.content[{j}]"
        yield at, _block_type(block, at), block


def _user(blocks: list, param: str) -> list[dict]:
    """A user turn: its tool results as ``tool`` messages in order, then its text."""
    results: list[dict] = []
    texts: list[str] = []
    for at, kind, block in _blocks(blocks, param):
        if kind == "text":
            texts.append(_text_of(block, at))
        elif kind == "tool_result":
            results.append(_tool_result(block, at))
        else:
            _refuse_media(kind, at)
            raise bad_request(f"'{at}': a user message cannot hold a {kind!r} block", at)
    if texts or not results:
        return [*results, {"role": "user", "content": _JOIN.join(texts)}]
    return results


def _tool_result(block: dict, param: str) -> dict:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"'{param}.tool_use_id' must name the tool_use this result answers", param)
    content = block.get("content")
    text = "" if content is None else _texts(content, f"{param}.content")
    if block.get("is_error") is True:
        # The chat format has no error flag: the model reads it in the text.
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": _call_id(call_id), "content": text}


def _assistant(blocks: list, param: str) -> dict:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict] = []
    for at, kind, block in _blocks(blocks, param):
        if kind == "text":
            texts.append(_text_of(block, at))
        elif kind == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise bad_request(f"'{at}.thinking' must be a string", at)
            thoughts.append(thinking)
        elif kind == "tool_use":
            calls.append(_tool_use(block, at))
        elif kind != "redacted_thinking":
            _refuse_media(kind, at)
            raise bad_request(f"'{at}': an assistant message cannot hold a {kind!r} block", at)
    text = _JOIN.join(texts) if texts or not calls else None  # (None: a turn that only calls)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thoughts:
        message["reasoning_content"] = _JOIN.join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_use(block: dict, param: str) -> dict:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"'{param}.id' must be a non-empty string", param)
    if not isinstance(name, str) or not name:
        raise bad_request(f"'{param}.name' must be a non-empty string", param)
    if not isinstance(arguments, dict):
        raise bad_request(f"'{param}.input' must be an object", param)
    function = {"name": name, "arguments": _compact(arguments)}
    return {"id": _call_id(call_id), "type": "function", "function": function}


def _call_id(use_id: str) -> str:
    """The chat call id of a ``tool_use`` id (the inverse of ``tool_use_id``)."""
    rest = use_id.removeprefix(TOOLU)
    return rest or use_id


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _tools(tools: Any) -> tuple[list[dict], list[str]]:
    """Client tools as chat functions; server tools dropped, named as ``tools[i]``."""
    if tools is None:
        return [], []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of tools", "tools")
    kept: list[dict] = []
    dropped: list[str] = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"'{param}' must be a tool object", param)
        if tool.get("type") not in (None, "custom") or tool.get("defer_loading") is True:
            # Anthropic's own tools (web search, bash…) run on its side; a deferred tool is
            # one its tool search would load later, not one to show the model now.
            dropped.append(param)
            continue
        name, schema = tool.get("name"), tool.get("input_schema", {"type": "object", "properties": {}})
        if not isinstance(name, str) or not name:
            raise bad_request(f"'{param}.name' must be a non-empty string", f"{param}.name")
        if not isinstance(schema, dict):
            raise bad_request(f"'{param}.input_schema' must be a JSON schema object", f"{param}.input_schema")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        kept.append({"type": "function", "function": function})
    return kept, dropped


def _tool_choice(choice: Any, chat: dict) -> None:
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in _TOOL_CHOICES:
        chat["tool_choice"] = _TOOL_CHOICES[kind]
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request("'tool_choice.name' must name one of the tools", "tool_choice.name")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise bad_request(
            "'tool_choice' must be {'type': 'auto' | 'any' | 'tool' | 'none'} (with 'name' for 'tool')",
            "tool_choice",
        )
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        param = "tool_choice.disable_parallel_tool_use"
        raise bad_request(f"'{param}' must be true or false", param)
    if single:
        chat["parallel_tool_calls"] = False


def _thinking(thinking: Any, chat: dict) -> None:
    if thinking is None:
        return
    if not isinstance(thinking, dict) or not isinstance(thinking.get("type"), str):
        raise bad_request("'thinking' must be an object with a 'type'", "thinking")
    switch = {"enabled": True, "disabled": False}.get(thinking["type"])
    if switch is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": switch}


def _output_format(config: Any, chat: dict) -> None:
    """``output_config.format`` (structured output); ``effort`` changes nothing here."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise bad_request("'output_config' must be an object", "output_config")
    fmt = config.get("format")
    if fmt is None:
        return
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise bad_request(
            "'output_config.format' must be {'type': 'json_schema', 'schema': {...}}", "output_config.format"
        )
    chat["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True},
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

"""OpenAI's Responses API (``POST /v1/responses``) as a translation over the chat pipeline:
a Responses request → a chat-completions body; the chat answer (a whole body, or its
stream of chunk dicts) → a Response object, or the Responses stream's events. Pure.

* Input: ``instructions`` is a system message ahead of all; ``input`` a string (one user
  message) or items: messages (``developer`` read as ``system``; text parts only: images,
  files and audio are refused), ``function_call`` items (consecutive ones, and an
  assistant message right before them, make one assistant message with ``tool_calls``),
  ``function_call_output`` (a ``tool`` message) and ``reasoning`` (the next assistant
  message's ``reasoning_content``). Other items (hosted tools' calls) are dropped and
  named in the ignored list as ``input[i]``, hosted tools as ``tools[i]``, other unknown
  fields by name; bookkeeping fields (``store``, ``include``, ...) pass silently.
* ``previous_response_id`` puts a kept conversation (``ResponseStore``: its input, then
  its output) before the new input; the earlier ``instructions`` are not carried over.
* Output items, in the answer's order: ``reasoning`` (the thinking as ``reasoning_text``),
  ``message`` (``output_text``), one ``function_call`` per call (``call_id``: the chat
  call id). Item ids derive from the response id and the item's index, so a stream and a
  whole answer name them alike. A ``length`` finish makes the response and its last item
  ``incomplete``. edgespec's ``timings`` and ``speculation`` ride along at the top level.
* Stream: ``response.created``, ``response.in_progress``; per item ``output_item.added``,
  its content part, deltas, ``.done`` events and ``output_item.done``; lastly
  ``response.completed`` or ``response.incomplete`` with the whole response. An error
  chunk ends it with an ``error`` event and ``response.failed``.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from edgespec.server.errors import ApiError, bad_request

DEFAULT_STORED = 256

# Fields that change nothing about the answer here: accepted without a word.
_SILENT = frozenset({"store", "include", "prompt_cache_key", "prompt_cache_retention", "metadata"})
_SILENT |= {"client_metadata", "prompt_cache_options", "user", "service_tier", "truncation"}
_SILENT |= {"safety_identifier", "stream_options"}
# Fields copied into the chat body as they are: sampling, and edgespec's own.
_PASSED = ("model", "temperature", "top_p", "top_k", "stop", "seed", "parallel_tool_calls", "grammar")
_PASSED += ("drafter", "gamma", "verify", "lenience")
_TRANSLATED = frozenset({"input", "instructions", "tools", "tool_choice", "text", "max_output_tokens"})
_TRANSLATED |= {"stream", "reasoning", "background", "previous_response_id"}
# The API's efforts → chat's (``server.reasoning``, where none and low turn thinking off).
_EFFORTS = {"none": "none", "minimal": "low", "low": "low", "medium": "medium", "high": "high"}
_EFFORTS |= {"xhigh": "high", "max": "high"}
_TEXT_PARTS = ("input_text", "output_text", "text")
_MEDIA_PARTS = {"input_image": "image", "input_file": "file", "input_audio": "audio"}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# The codes a failed response's ``error`` may carry (the SDK's ``ResponseError.code``).
_FAILURE_CODES = ("server_error", "rate_limit_exceeded", "invalid_prompt")
_FUNCTION_KEYS = ("name", "description", "parameters")
_ECHOED = ("instructions", "temperature", "top_p", "max_output_tokens", "reasoning", "previous_response_id")


def chat_body(body: Any, store: ResponseStore | None = None) -> tuple[dict, list[str]]:
    """The chat-completions body a Responses request asks for, and what it ignored: top-level
    field names, ``input[i]`` items and ``tools[i]`` tools dropped."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    known = _SILENT | _TRANSLATED | set(_PASSED)
    ignored = [name for name in body if name not in known]
    chat: dict[str, Any] = {name: body[name] for name in _PASSED if name in body}
    chat["messages"] = _messages(body, store, ignored)
    tools = _tools(body.get("tools"), ignored)
    choice = _tool_choice(body.get("tool_choice"), ignored)
    chat |= ({"tools": tools} if tools else {}) | ({"tool_choice": choice} if choice is not None else {})
    _options(body, chat)
    return chat, ignored


def _options(body: dict, chat: dict) -> None:
    """The answer's shape and length, streaming and reasoning, into ``chat``."""
    response_format = _text_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    limit = body.get("max_output_tokens")
    if limit is not None:
        ok = isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1
        _require(ok, f"'max_output_tokens' must be a positive integer (got {limit!r})", "max_output_tokens")
        chat["max_tokens"] = limit
    stream = body.get("stream")
    _require(stream is None or isinstance(stream, bool), "'stream' must be true or false", "stream")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    effort = _effort(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    background = body.get("background") in (None, False)
    _require(background, "'background' is not supported: answers come within the request", "background")


def _require(ok: bool, message: str, param: str) -> None:
    """A refusal naming ``param`` unless ``ok``."""
    if not ok:
        raise bad_request(message, param)


def _instructions(body: dict) -> str | None:
    value = body.get("instructions")
    _require(value is None or isinstance(value, str), "'instructions' must be a string", "instructions")
    return value or None


def _messages(body: dict, store: ResponseStore | None, ignored: list[str]) -> list[dict]:
    """System message from ``instructions``, the earlier response's conversation, the input."""
    instructions = _instructions(body)
    messages = [{"role": "system", "content": instructions}] if instructions else []
    previous = body.get("previous_response_id")
    if previous is not None:
        _require(isinstance(previous, str), "'previous_response_id' must be a string", "previous_response_id")
        if store is None:
            ignored.append("previous_response_id")
        else:
            messages += store.recall(previous)
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        messages += input_messages(given, ignored)
    elif given is not None:
        raise bad_request("'input' must be a string or a list of input items", "input")
    _require(bool(messages), "'input' is required: a string or a list of input items", "input")
    return messages


def input_messages(items: list, ignored: list[str] | None = None) -> list[dict]:
    """Responses input items (or output items, read back) → chat messages."""
    builder = _Conversation()
    for i, item in enumerate(items):
        _require(isinstance(item, dict), f"'input[{i}]' must be an object", f"input[{i}]")
        if not builder.add(item, f"input[{i}]") and ignored is not None:
            ignored.append(f"input[{i}]")
    return builder.messages


class _Conversation:
    """Chat messages built item by item: calls join the assistant message just before them,
    reasoning waits for the next assistant message."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.thinking: list[str] = []  # reasoning items not yet given to a message
        self.joinable: dict | None = None  # the assistant message a call joins

    def add(self, item: dict, param: str) -> bool:
        """Whether the item was used (false: a type this server drops)."""
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item, param)
        elif kind == "function_call":
            self._call(item, param)
        elif kind == "function_call_output":
            output = _text(item.get("output"), f"{param}.output")
            call_id = _string(item, "call_id", param)
            self._append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            self.joinable = None
            thought = _reasoning_text(item)
            if thought:
                self.thinking.append(thought)
        else:
            return False
        return True

    def _append(self, message: dict) -> None:
        if message["role"] == "assistant":
            if self.thinking:
                message["reasoning_content"] = "\n\n".join(self.thinking)
            self.joinable = message
        else:
            self.joinable = None
        self.thinking = []  # thinking before a user or tool turn belongs to no answer
        self.messages.append(message)

    def _message(self, item: dict, param: str) -> None:
        given = item.get("role")
        role = _ROLES.get(given) if isinstance(given, str) else None
        roles = f"'{param}.role' must be one of {', '.join(_ROLES)} (got {given!r})"
        _require(role is not None, roles, f"{param}.role")
        _require(item.get("content") is not None, f"'{param}.content' is required", f"{param}.content")
        self._append({"role": role, "content": _text(item["content"], f"{param}.content")})

    def _call(self, item: dict, param: str) -> None:
        function = {key: _string(item, key, param) for key in ("name", "arguments")}
        call = {"id": _string(item, "call_id", param), "type": "function", "function": function}
        if self.joinable is None:
            self._append({"role": "assistant", "content": None})
        assert self.joinable is not None
        self.joinable.setdefault("tool_calls", []).append(call)


def _string(item: dict, key: str, param: str) -> str:
    value = item.get(key)
    _require(isinstance(value, str), f"'{param}.{key}' must be a string", f"{param}.{key}")
    return value


def _text(content: Any, param: str) -> str:
    """A message's content or a call's output: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    _require(isinstance(content, list), f"'{param}' must be a string or a list of text parts", param)
    return "".join(_part(part, f"{param}[{j}]") for j, part in enumerate(content))


def _part(part: Any, param: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in _MEDIA_PARTS:
        refusal = f"{_MEDIA_PARTS[kind]} input is not supported: this server's models read text only"
        raise ApiError(400, refusal, param=param)
    key = "refusal" if kind == "refusal" else "text"
    text = part.get(key) if kind in (*_TEXT_PARTS, "refusal") else None
    _require(isinstance(text, str), f"'{param}' must be a text part ({', '.join(_TEXT_PARTS)})", param)
    return text


def _reasoning_text(item: dict) -> str:
    """A reasoning item's thinking: its ``reasoning_text`` content, else its summary."""
    for key in ("content", "summary"):
        parts = item.get(key) if isinstance(item.get(key), list) else []
        texts = [p.get("text") for p in parts if isinstance(p, dict)]
        texts = [text for text in texts if isinstance(text, str) and text]
        if texts:
            return "\n\n".join(texts)
    return ""


def _tools(tools: Any, ignored: list[str]) -> list[dict]:
    """Function tools in the chat shape; hosted tools dropped and named."""
    if tools is None:
        return []
    _require(isinstance(tools, list), "'tools' must be a list of tools", "tools")
    out = []
    for i, tool in enumerate(tools):
        _require(isinstance(tool, dict), f"'tools[{i}]' must be an object with a 'type'", f"tools[{i}]")
        if tool.get("type") != "function":
            ignored.append(f"tools[{i}]")
            continue
        # A chat-shaped tool sent here by mistake is read as it is meant.
        flat = tool["function"] if isinstance(tool.get("function"), dict) else tool
        name = flat.get("name")
        _require(isinstance(name, str) and bool(name), f"'tools[{i}].name' is required", f"tools[{i}].name")
        function = {key: flat[key] for key in _FUNCTION_KEYS if flat.get(key) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, ignored: list[str]) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        _require(isinstance(choice.get("name"), str), "'tool_choice.name' is required", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, dict) and isinstance(choice.get("type"), str):
        ignored.append("tool_choice")  # a hosted tool, or an allowed-tools list: the model chooses
        return None
    choices = "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'name': …}"
    raise bad_request(choices, "tool_choice")


def _text_format(text: Any) -> dict | None:
    """``text.format`` as chat's ``response_format`` (``text.verbosity`` changes nothing)."""
    if text is None:
        return None
    _require(isinstance(text, dict), "'text' must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    types = "'text.format.type' must be 'text', 'json_object' or 'json_schema'"
    _require(kind == "json_schema", types, "text.format.type")
    schema = fmt.get("schema")
    _require(isinstance(schema, dict), "'text.format.schema' must be a JSON schema", "text.format.schema")
    spec = {"name": fmt.get("name") or "response", "schema": schema}
    spec |= {key: fmt[key] for key in ("description", "strict") if fmt.get(key) is not None}
    return {"type": "json_schema", "json_schema": spec}


def _effort(reasoning: Any) -> str | None:
    if reasoning is None:
        return None
    _require(isinstance(reasoning, dict), "'reasoning' must be an object", "reasoning")
    effort = reasoning.get("effort")
    known = effort is None or (isinstance(effort, str) and effort in _EFFORTS)
    efforts = f"'reasoning.effort' must be one of {', '.join(_EFFORTS)} (got {effort!r})"
    _require(known, efforts, "reasoning.effort")
    return _EFFORTS.get(effort) if effort is not None else None


class ResponseStore:
    """Responses' conversations as chat messages, by response id, for
    ``previous_response_id``: in memory, the ``capacity`` most recently used, safe to share
    between threads."""

    def __init__(self, capacity: int = DEFAULT_STORED):
        self.capacity = capacity
        self._kept: OrderedDict[str, list[dict]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, messages: list[dict]) -> None:
        kept = copy.deepcopy(messages)
        with self._lock:
            self._kept[response_id] = kept
            self._kept.move_to_end(response_id)
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)

    def get(self, response_id: str) -> list[dict] | None:
        with self._lock:
            kept = self._kept.get(response_id)
            if kept is not None:
                self._kept.move_to_end(response_id)
        return copy.deepcopy(kept) if kept is not None else None

    def recall(self, response_id: str) -> list[dict]:
        """The conversation, or OpenAI's 404 for an id not (or no longer) kept."""
        kept = self.get(response_id)
        if kept is None:
            kept_for = f"kept in memory, at most {self.capacity}, until the server stops"
            missing = f"no stored response '{response_id}' (responses are {kept_for})"
            raise ApiError(404, missing, param="previous_response_id", code="previous_response_not_found")
        return kept

    def keep(self, request: dict, chat: dict, response: dict) -> bool:
        """Keep a finished response's conversation: ``chat``'s messages (the body
        ``chat_body`` made, without the instructions) and the response's output read back
        as messages. A request with ``store: false`` and a failed response are not kept."""
        if request.get("store") is False or response.get("status") == "failed":
            return False
        skip = 1 if _instructions(request) else 0
        self.put(response["id"], chat["messages"][skip:] + input_messages(response["output"]))
        return True


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


@dataclass
class _Item:
    """One output item while it is written: ``text`` is the thinking, the message's text or
    the call's arguments."""

    kind: str  # "reasoning", "message" or "function_call"
    id: str
    text: str = ""
    call_id: str = ""
    name: str = ""
    status: str = "in_progress"

    def part(self) -> dict:
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": self.text}
        return {"type": "output_text", "text": self.text, "annotations": []}

    def render(self) -> dict:
        content = [self.part()] if self.status != "in_progress" else []
        if self.kind == "reasoning":
            return {"type": "reasoning", "id": self.id, "summary": [], "content": content}
        head = {"type": self.kind, "id": self.id, "status": self.status}
        if self.kind == "message":
            return head | {"role": "assistant", "content": content}
        return head | {"call_id": self.call_id, "name": self.name, "arguments": self.text}


def _item_id(kind: str, response_id: str, index: int) -> str:
    prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
    return f"{prefix}_{response_id.removeprefix('resp_')}_{index}"


def whole(chat: dict, request: dict, response_id: str) -> dict:
    """The Response object for a whole ``chat.completion`` body."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    items: list[_Item] = []

    def add(kind: str, text: str, **call: str) -> None:
        items.append(_Item(kind, _item_id(kind, response_id, len(items)), text, status="completed", **call))

    if message.get("reasoning_content"):
        add("reasoning", message["reasoning_content"])
    if message.get("content"):
        add("message", message["content"])
    for call in message.get("tool_calls") or []:
        function = {"name": "", "arguments": ""} | (call.get("function") or {})
        add("function_call", function["arguments"], call_id=call.get("id", ""), name=function["name"])
    cut = choice.get("finish_reason") == "length"
    if cut and items:
        items[-1].status = "incomplete"
    head = _Head(request, response_id, chat.get("created") or int(time.time()), chat.get("model"))
    return head.response("incomplete" if cut else "completed", items, chat.get("usage"), chat)


@dataclass
class _Head:
    """What every Response object of one answer repeats."""

    request: dict
    id: str
    created_at: int
    model: Any

    def response(
        self, status: str, items: list[_Item], usage: dict | None, extras: dict, error: dict | None = None
    ) -> dict:
        body = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.request.get("model") or self.model or "default",
            "output": [item.render() for item in items],
            "usage": _usage(usage),
            **_echo(self.request),
        }
        return body | {key: extras[key] for key in ("timings", "speculation") if key in extras}


def _echo(request: dict) -> dict:
    """The request's settings, as a Response repeats them."""
    parallel = request.get("parallel_tool_calls")
    return {key: request.get(key) for key in _ECHOED} | {
        "tools": request.get("tools") or [],
        "tool_choice": request.get("tool_choice") or "auto",
        "parallel_tool_calls": parallel if isinstance(parallel, bool) else True,
        "text": request.get("text") or {"format": {"type": "text"}},
        "store": request.get("store") is not False,
        "metadata": request.get("metadata") or {},
    }


def _usage(usage: dict | None) -> dict | None:
    if not usage:
        return None
    prompt = usage.get("prompt_tokens", 0)
    completion = usage.get("completion_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    thinking = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    return {
        "input_tokens": prompt,
        # ``cache_write_tokens``: the SDK requires it; the prompt cache is not billed apart
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": thinking},
        "total_tokens": usage.get("total_tokens", prompt + completion),
    }


class ResponseStream:
    """chat.completion.chunk dicts → the Responses stream's events, as SSE texts. After the
    last event, ``response`` holds the final Response object (what ``whole`` gives for the
    same answer)."""

    def __init__(self, request: dict, response_id: str | None = None):
        self.id = response_id or new_response_id()
        self.head = _Head(request, self.id, 0, None)
        self.sequence = 0
        self.items: list[_Item] = []
        self.open: _Item | None = None
        self.calls: dict[int, _Item] = {}  # chat tool-call index → its item
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.extras: dict = {}
        self.response: dict | None = None

    def feed(self, chunk: dict) -> list[str]:
        if self.response is not None:
            return []
        out = self._start(chunk)
        if chunk.get("error") is not None:
            return out + self._fail(chunk["error"])
        self.extras |= {key: chunk[key] for key in ("timings", "speculation") if key in chunk}
        self.usage = chunk.get("usage") or self.usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._write("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                out += self._write("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                out += self._close()
        if not chunk.get("choices") and chunk.get("usage"):
            out += self._end()  # the usage chunk is the chat stream's last
        return out

    def finish(self) -> list[str]:
        if self.response is not None:
            return []
        return self._start({}) + self._end()

    def _event(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    def _start(self, chunk: dict) -> list[str]:
        if self.sequence:  # events were sent: the response is open
            return []
        self.head.created_at = chunk.get("created") or int(time.time())
        self.head.model = chunk.get("model")
        response = self.head.response("in_progress", [], None, {})
        return [self._event(f"response.{kind}", response=response) for kind in ("created", "in_progress")]

    def _at(self, item: _Item) -> dict:
        """Where an item's content events point."""
        at = {"item_id": item.id, "output_index": self.items.index(item)}
        return at if item.kind == "function_call" else {**at, "content_index": 0}

    def _open(self, kind: str, **call: str) -> list[str]:
        out = self._close()
        item = _Item(kind, _item_id(kind, self.id, len(self.items)), **call)
        self.items.append(item)
        self.open = item
        index = len(self.items) - 1
        out.append(self._event("response.output_item.added", output_index=index, item=item.render()))
        if kind != "function_call":
            blank = _Item(kind, item.id).part()
            out.append(self._event("response.content_part.added", **self._at(item), part=blank))
        return out

    def _write(self, kind: str, text: str) -> list[str]:
        out = self._open(kind) if self.open is None or self.open.kind != kind else []
        item = self.items[-1]
        item.text += text
        if kind == "reasoning":
            return [*out, self._event("response.reasoning_text.delta", **self._at(item), delta=text)]
        return [*out, self._event("response.output_text.delta", **self._at(item), delta=text, logprobs=[])]

    def _call(self, call: dict) -> list[str]:
        function, index = call.get("function") or {}, call.get("index", 0)
        out: list[str] = []
        if index not in self.calls:
            call_id = call.get("id") or f"call_{uuid.uuid4().hex[:24]}"
            out = self._open("function_call", call_id=call_id, name=function.get("name", ""))
            self.calls[index] = self.items[-1]
        item, delta = self.calls[index], function.get("arguments")
        if delta:
            item.text += delta
            out.append(self._event("response.function_call_arguments.delta", **self._at(item), delta=delta))
        return out

    def _close(self) -> list[str]:
        """The open item's closing events; an item cut by the token limit is incomplete."""
        item, self.open = self.open, None
        if item is None:
            return []
        item.status = "incomplete" if self.finish_reason == "length" else "completed"
        at = self._at(item)
        if item.kind == "function_call":
            done = {"name": item.name, "arguments": item.text}
            out = [self._event("response.function_call_arguments.done", **at, **done)]
        else:
            name = "reasoning_text" if item.kind == "reasoning" else "output_text"
            extra = {} if item.kind == "reasoning" else {"logprobs": []}
            out = [
                self._event(f"response.{name}.done", **at, text=item.text, **extra),
                self._event("response.content_part.done", **at, part=item.part()),
            ]
        index = at["output_index"]
        return [*out, self._event("response.output_item.done", output_index=index, item=item.render())]

    def _end(self) -> list[str]:
        out = self._close()
        cut = self.finish_reason == "length"
        status = "incomplete" if cut else "completed"
        self.response = self.head.response(status, self.items, self.usage, self.extras)
        kind = "response.incomplete" if cut else "response.completed"
        return [*out, self._event(kind, response=self.response)]

    def _fail(self, error: Any) -> list[str]:
        """An ``error`` event and the failed response; the item being written, if any,
        stays in its output as incomplete."""
        error = error if isinstance(error, dict) else {"message": str(error)}
        message = error.get("message") or "the answer failed"
        code = error.get("code")
        out = [self._event("error", code=code, message=message, param=error.get("param"))]
        if self.open is not None:
            self.open.status, self.open = "incomplete", None
        failure = {"code": code if code in _FAILURE_CODES else "server_error", "message": message}
        self.response = self.head.response("failed", self.items, self.usage, self.extras, failure)
        return [*out, self._event("response.failed", response=self.response)]

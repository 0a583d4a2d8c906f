"""A model's answer text → OpenAI ``tool_calls``, whole or while it streams.

Models do not return tool calls as structure; they write them as text in their family's
format, which the GGUF's chat template teaches them (the template also names the format,
see ``detect_format``):

* ``hermes`` (Hermes, Qwen2.5, Qwen3): ``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``,
  one block per call, possibly after some text.
* ``llama3`` (Llama 3.1–3.3): the whole answer is ``{"name": …, "parameters": {…}}`` (an
  optional leading ``"type": "function"`` key), or ``<|python_tag|>`` followed by such
  objects; several are separated by ``;`` or whitespace.
* ``mistral``: ``[TOOL_CALLS][{"name": …, "arguments": {…}, "id": …}, …]`` (older
  tokenizers, possibly with a space after the marker), or ``[TOOL_CALLS]name[ARGS]{…}``
  per call (newer ones, possibly with ``[CALL_ID]id`` before ``[ARGS]``).

The markers ``<|python_tag|>`` and ``[TOOL_CALLS]`` are special tokens: the text parsed
must render special tokens, as ``Model.token_text`` does.

Every form also accepts ``arguments`` or ``parameters``, and arguments written as a JSON
string holding an object. Arguments come back re-serialized as compact JSON. Call ids are
``call_`` and 24 hex digits, except in the Mistral format: its templates refuse any id
but 9 letters or digits when the conversation comes back, so those calls keep the
model's id when it has that shape and get a new one of that shape otherwise.

A call is malformed when its JSON does not parse (a truncated answer included), it has no
name, its arguments are not an object, or it names a function the request did not offer.
One malformed call makes the whole answer plain text: ``Parsed.ok`` is false, the content
is the text exactly as generated and there are no calls. Half a set of parallel calls
would leave the client waiting on answers to calls the model never made correctly.

Content is the text outside the calls; whitespace that only separates text from a call is
dropped, and pieces on both sides of a call are joined by a newline.

Streaming (``StreamParser``) sends content as it comes, except what could be the start of
a call: the longest end of the text that begins the format's marker (``<tool``,
``[TOOL_``), whitespace at the end of the text (it would be dropped if a call follows),
and, for ``llama3``, an answer that begins with ``{`` until its first key shows whether it
is a call. From a complete marker on, the rest of the answer is held until ``finish``,
which parses the whole text with ``parse``, so that a stream and a whole answer always
agree. ``finish`` then sends any content after the calls and every call as OpenAI streams
them: one delta with ``index``, ``id``, ``type`` and the name with empty arguments, then
one delta with the arguments. If a call is malformed, the client sees the held text (from
the whitespace before the marker to the end) as one last content delta, and no tool
calls: the concatenated content is the answer's text, as in a whole answer.

What is not parsed (the text stays content): Llama's built-in tools written as Python
(``<|python_tag|>brave_search.call(…)``), Qwen3-Coder's XML calls, JSON calls inside
code fences, and a bare Llama JSON call that does not open the answer.

The finish reason is ``tool_calls`` when calls were parsed and generation stopped by
itself; an answer cut by its token limit keeps ``length`` (as llama-server does), so that
a client knows that what follows the calls is incomplete.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("hermes", "llama3", "mistral", "none")

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"

_MARKERS = {"hermes": HERMES_OPEN, "llama3": PYTHON_TAG, "mistral": MISTRAL_CALLS}

# A bare Llama call opens with one of these key sequences (whitespace between tokens).
_LLAMA_HEADS = (
    ("{", '"name"', ":"),
    ("{", '"type"', ":", '"function"', ",", '"name"', ":"),
)

_ALNUM = string.ascii_letters + string.digits
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_MISTRAL_NAMED = re.compile(
    r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9]+)\s*)?(?:\[ARGS\])?\s*(?=\{)"
)


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; a client's JSON parser would refuse the arguments.
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


class _Malformed(Exception):
    """A call that cannot be returned; its message says why."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # compact JSON of an object

    def as_dict(self) -> dict:
        """The call as an entry of a message's ``tool_calls``."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Parsed:
    """``content``: text outside the calls (None when there is none beside calls);
    ``ok``: false when a call was malformed (then ``content`` is the whole text and there
    are no calls); ``error``: why, in one sentence."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)
    ok: bool = True
    error: str | None = None

    def finish_reason(self, reason: str) -> str:
        return finish_reason(self.calls, reason)


@dataclass(frozen=True)
class Delta:
    """One piece of a streamed answer: content text, or one entry of OpenAI's
    ``delta.tool_calls``."""

    content: str | None = None
    tool_call: dict | None = None

    def as_dict(self) -> dict:
        """The chunk's ``delta`` object (without ``role``)."""
        if self.tool_call is not None:
            return {"tool_calls": [self.tool_call]}
        return {"content": self.content}


def call_deltas(calls: list[ToolCall]) -> list[Delta]:
    """Calls as OpenAI streams them: each call's index, id and name, then its arguments."""
    deltas = []
    for index, call in enumerate(calls):
        header = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        deltas.append(Delta(tool_call=header))
        deltas.append(Delta(tool_call={"index": index, "function": {"arguments": call.arguments}}))
    return deltas


def kept_calls(calls: list[ToolCall], parallel: bool) -> list[ToolCall]:
    """The calls an answer returns: all of them, or with ``parallel_tool_calls: false``
    only the first (whole or streamed alike)."""
    return calls if parallel else calls[:1]


def finish_reason(calls: list[ToolCall], reason: str) -> str:
    """``tool_calls`` when there are calls and generation stopped by itself, else
    ``reason`` (the caller's: ``stop`` or ``length``)."""
    return "tool_calls" if calls and reason == "stop" else reason


def detect_format(chat_template: str | None, model_name: str = "") -> str:
    """The tool call format a chat template teaches, from the markers it writes.

    ``none`` when there is no template or it never mentions tools: such a prompt cannot
    show the model the tools, so no call can be expected. A template that mentions tools
    without a known marker gets ``llama3`` or ``mistral`` when the model's name says so,
    else ``hermes``, the format most fine-tunes learn.
    """
    if not chat_template:
        return "none"
    if HERMES_OPEN in chat_template:
        return "hermes"
    if MISTRAL_CALLS in chat_template:
        return "mistral"
    if PYTHON_TAG in chat_template or "<|start_header_id|>ipython" in chat_template:
        return "llama3"
    if not re.search(r"\btools\b|tool_calls", chat_template):
        return "none"
    name = model_name.lower()
    if re.search(r"llama.?3", name):
        return "llama3"
    if re.search(r"mistral|mixtral|ministral|devstral|magistral|codestral", name):
        return "mistral"
    return "hermes"


def _head_state(text: str) -> str:
    """Whether ``text`` (no leading whitespace) opens a bare Llama call: ``match``,
    ``prefix`` (it may, once more text comes) or ``no``."""
    best = "no"
    for tokens in _LLAMA_HEADS:
        pos = 0
        state = "match"
        for n, token in enumerate(tokens):
            if n:
                while pos < len(text) and text[pos].isspace():
                    pos += 1
            rest = text[pos : pos + len(token)]
            if rest == token:
                pos += len(token)
                continue
            state = "prefix" if pos + len(rest) == len(text) and token.startswith(rest) else "no"
            break
        if state == "match":
            return "match"
        if state == "prefix":
            best = "prefix"
    return best


def _skip(text: str, pos: int, chars: str = "") -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] in chars):
        pos += 1
    return pos


def _decode(text: str, pos: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError as exc:
        raise _Malformed("a tool call is not valid JSON") from exc


def _decode_whole(text: str) -> Any:
    value, end = _decode(text, 0)
    if end != len(text):
        raise _Malformed("a tool call's arguments string holds more than JSON")
    return value


def _objects(text: str, pos: int, separators: str) -> tuple[list[Any], int]:
    """JSON objects from ``pos`` on, separated by whitespace or ``separators``; at least
    one. Returns them and where the text after them starts."""
    found = []
    while True:
        start = _skip(text, pos, separators if found else "")
        if start >= len(text) or text[start] != "{":
            break
        value, pos = _decode(text, start)
        found.append(value)
        pos = _skip(text, pos, separators)
    if not found:
        raise _Malformed("a tool call marker is not followed by a JSON object")
    return found, pos


def _read_hermes(text: str, pos: int) -> tuple[list[Any], int]:
    # The JSON is read before the closing tag is looked for: an argument may hold the tag.
    found, end = _objects(text, pos, "")
    if text.startswith(HERMES_CLOSE, end):
        return found, end + len(HERMES_CLOSE)
    if end == len(text):
        # A last block whose closing tag the model left out: its JSON is whole.
        return found, end
    raise _Malformed("a <tool_call> block holds more than JSON")


def _read_llama(text: str, pos: int) -> tuple[list[Any], int]:
    return _objects(text, pos, ";")


def _read_mistral(text: str, pos: int) -> tuple[list[Any], int]:
    start = _skip(text, pos)
    if text.startswith("[", start):
        calls, end = _decode(text, start)
        if not isinstance(calls, list) or not calls:
            raise _Malformed("[TOOL_CALLS] is not followed by a list of calls")
        return calls, end
    named = _MISTRAL_NAMED.match(text, pos)
    if named is None:
        raise _Malformed("[TOOL_CALLS] is not followed by a function name and arguments")
    arguments, end = _decode(text, named.end())
    call: dict[str, Any] = {"name": named.group(1), "arguments": arguments}
    if named.group(2):
        call["id"] = named.group(2)
    return [call], end


_READERS: dict[str, Callable[[str, int], tuple[list[Any], int]]] = {
    "hermes": _read_hermes,
    "llama3": _read_llama,
    "mistral": _read_mistral,
}


def _new_id(fmt: str, given: Any) -> str:
    if fmt == "mistral":
        if isinstance(given, str) and _MISTRAL_ID.fullmatch(given):
            return given
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(value: Any, fmt: str, allowed: set[str] | None) -> ToolCall:
    if not isinstance(value, dict):
        raise _Malformed("a tool call is not a JSON object")
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _Malformed("a tool call has no function name")
    if allowed is not None and name not in allowed:
        raise _Malformed(f"the model called {name!r}, which is not among the request's tools")
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        arguments = _decode_whole(arguments.strip()) if arguments.strip() else None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise _Malformed(f"the arguments of {name!r} are not a JSON object")
    compact = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return ToolCall(id=_new_id(fmt, value.get("id")), name=name, arguments=compact)


def _join(segments: list[str]) -> str | None:
    """Text between calls: each piece loses the whitespace on its sides that touch a call."""
    last = len(segments) - 1
    parts = []
    for n, piece in enumerate(segments):
        if n > 0:
            piece = piece.lstrip()
        if n < last:
            piece = piece.rstrip()
        if piece:
            parts.append(piece)
    return "\n".join(parts) or None


def parse(text: str, fmt: str, *, allowed: set[str] | None = None) -> Parsed:
    """The tool calls in a whole answer, in format ``fmt`` (see ``FORMATS``).

    ``allowed``: the names of the request's functions (None accepts any name). Never
    raises: a malformed call gives ``ok=False`` with the whole text as content.
    """
    marker = _MARKERS.get(fmt)
    if marker is None:
        return Parsed(content=text)
    read = _READERS[fmt]
    segments: list[str] = []
    values: list[Any] = []
    pos = 0
    try:
        body = text.lstrip()
        if fmt == "llama3" and _head_state(body) == "match":
            segments.append("")
            found, pos = read(text, len(text) - len(body))
            values += found
        while (start := text.find(marker, pos)) >= 0:
            segments.append(text[pos:start])
            found, pos = read(text, start + len(marker))
            values += found
        segments.append(text[pos:])
        calls = [_call(value, fmt, allowed) for value in values]
    except _Malformed as exc:
        return Parsed(content=text, ok=False, error=str(exc))
    if not calls:
        return Parsed(content=text)
    return Parsed(content=_join(segments), calls=calls)


def _marker_prefix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (shorter than it)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class StreamParser:
    """Tool calls from an answer fed piece by piece (see the module's docstring).

    ``feed`` returns the deltas the new text allows; ``finish`` the rest, once the
    answer is complete. After ``finish``, ``parsed`` holds ``parse``'s result.
    ``parallel=False`` (a request's ``parallel_tool_calls: false``): ``finish`` sends the
    first call only, as a whole answer keeps only its first.
    """

    def __init__(self, fmt: str, allowed: set[str] | None = None, *, parallel: bool = True) -> None:
        self.fmt = fmt
        self.allowed = allowed
        self.parallel = parallel
        self.parsed: Parsed | None = None
        self._marker = _MARKERS.get(fmt)
        self._pieces: list[str] = []  # the whole answer so far
        self._pending = ""  # the text after what was sent, while nothing is held
        self._sent = 0  # characters sent as content
        self._held = False  # a call has begun: hold everything until finish
        self._opening = fmt == "llama3"  # the answer may still open with a bare call

    def feed(self, piece: str) -> list[Delta]:
        self._pieces.append(piece)
        if self._held:
            return []
        self._pending += piece
        pending = self._pending
        if self._marker is None:
            return self._send(len(pending))
        if self._opening:
            # Nothing was sent yet: ``pending`` is the whole answer.
            body = pending.lstrip()
            state = _head_state(body) if body else "prefix"
            if state == "match":
                self._held = True
            if state != "no":
                return []
            self._opening = False
        start = pending.find(self._marker)
        if start >= 0:
            self._held = True
            end = start
        else:
            end = len(pending) - _marker_prefix(pending, self._marker)
        # Whitespace before a call is not content; hold it until what follows shows.
        while end > 0 and pending[end - 1].isspace():
            end -= 1
        return self._send(end)

    def _send(self, end: int) -> list[Delta]:
        if end <= 0:
            return []
        piece = self._pending[:end]
        self._pending = self._pending[end:]
        self._sent += end
        return [Delta(content=piece)]

    def finish(self) -> list[Delta]:
        text = "".join(self._pieces)
        parsed = parse(text, self.fmt, allowed=self.allowed)
        sent = text[: self._sent]
        content = parsed.content or ""
        if parsed.calls and not content.startswith(sent):
            # Unreachable by construction (content is sent only before the first call);
            # should it ever happen, the text stays text rather than a stream that
            # contradicts itself.
            parsed = Parsed(content=text, ok=False, error="the stream diverged from the answer")
        self.parsed = parsed
        self._pending = ""
        self._sent = len(text)
        if not parsed.calls:
            rest = text[len(sent) :]
            return [Delta(content=rest)] if rest else []
        deltas = [Delta(content=content[len(sent) :])] if len(content) > len(sent) else []
        return deltas + call_deltas(kept_calls(parsed.calls, self.parallel))

    def finish_reason(self, reason: str) -> str:
        """After ``finish``: ``tool_calls`` or ``reason`` (see ``finish_reason``)."""
        return finish_reason(self.parsed.calls if self.parsed else [], reason)

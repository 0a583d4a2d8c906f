"""Reasoning models: the template's thinking switch from a request, and the thinking text
told apart from the answer.

Thinking models (Qwen3, QwQ, DeepSeek-R1 and its distills) write their reasoning between
``<think>`` and ``</think>`` before the answer. Their chat templates decide where it
starts: Qwen3's leaves the model to open ``<think>`` itself (and with
``enable_thinking=false`` writes an empty ``<think></think>`` into the prompt, so the model
answers at once); DeepSeek-R1's ends the prompt with ``<think>`` already open.

Switches a request may carry, all ending as template keyword arguments:

* ``chat_template_kwargs``: an object handed to the template as it is (llama-server's and
  vLLM's field);
* ``enable_thinking``: a boolean, the same as ``chat_template_kwargs.enable_thinking``;
* ``reasoning_effort``: ``none``, ``minimal`` and ``low`` turn thinking off, ``medium`` and
  ``high`` on; the value itself is also handed to the template (gpt-oss reads it).

A template that never mentions ``<think>`` ignores them, as it ignores any name it does
not read.

Splitting: with a thinking template, a prompt that ends inside ``<think>``, or a request
that turns thinking on, an answer
that opens with ``<think>`` (whitespace before it allowed) or whose prompt left it open is
reasoning up to ``</think>``; the rest, its leading whitespace dropped, is the answer. An
answer cut before ``</think>`` is all reasoning, as llama-server reads it.
``reasoning_format: "none"`` keeps the thinking inside the content, as generated.
Splitting only reads the text: the tokens, and so speculation over the thinking, are the
same either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgespec.server.errors import bad_request

OPEN = "<think>"
CLOSE = "</think>"
EFFORTS = {"none": False, "minimal": False, "low": False, "medium": True, "high": True}
FORMATS = ("auto", "none", "deepseek")  # deepseek: llama-server's name for the same split


@dataclass(frozen=True)
class ReasoningSetup:
    """How one answer's text is read: ``parse`` whether thinking is split out at all,
    ``open`` whether the prompt left ``<think>`` open (the answer starts inside it)."""

    parse: bool = False
    open: bool = False


def template_switches(body: dict[str, Any]) -> dict[str, Any]:
    """The template keyword arguments a request's reasoning fields ask for."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise bad_request(
            "'chat_template_kwargs' must be an object of template variables", "chat_template_kwargs"
        )
    switches = dict(kwargs)
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise bad_request(
                f"'reasoning_effort' must be one of {', '.join(EFFORTS)} (got {effort!r})", "reasoning_effort"
            )
        switches.setdefault("enable_thinking", EFFORTS[effort])
        switches.setdefault("reasoning_effort", effort)
    enable = body.get("enable_thinking")
    if enable is not None:
        if not isinstance(enable, bool):
            raise bad_request("'enable_thinking' must be true or false", "enable_thinking")
        switches["enable_thinking"] = enable
    return switches


def reasoning_setup(
    body: dict[str, Any], template: str | None, prompt_end: str, switches: dict[str, Any]
) -> ReasoningSetup:
    """``prompt_end``: the rendered prompt's last characters (special tokens as text);
    ``switches``: what ``template_switches`` made of the request (a request that turns
    thinking on is read for it whatever the template)."""
    fmt = body.get("reasoning_format", "auto")
    if fmt is None:
        fmt = "auto"
    if fmt not in FORMATS:
        raise bad_request(
            f"'reasoning_format' must be one of {', '.join(FORMATS)} (got {fmt!r})", "reasoning_format"
        )
    tail = prompt_end.rstrip()
    left_open = tail.endswith(OPEN)
    asked = switches.get("enable_thinking") is True
    if fmt == "none" or not (left_open or asked or (template and OPEN in template)):
        return ReasoningSetup()
    return ReasoningSetup(parse=True, open=left_open)


def split(text: str, setup: ReasoningSetup) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole answer, read as a stream reads it."""
    splitter = ThinkSplitter(setup)
    pieces = splitter.feed(text) + splitter.finish()
    reasoning = "".join(t for kind, t in pieces if kind == "reasoning")
    content = "".join(t for kind, t in pieces if kind == "content")
    return (reasoning if splitter.thought else None), content


class ThinkSplitter:
    """Answer text, fed as it streams, → ``("reasoning" | "content", text)`` pieces. Text
    that may still turn out to be a marker (``<thi`` at the end) is held back until the
    next piece or ``finish``."""

    def __init__(self, setup: ReasoningSetup):
        self.state = "reasoning" if setup.open else ("start" if setup.parse else "content")
        self.thought = setup.open  # whether any thinking section was seen
        self.held = ""

    @property
    def thinking(self) -> bool:
        return self.state == "reasoning"

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.held += text
        out: list[tuple[str, str]] = []
        while self.held:
            step = getattr(self, f"_{self.state}")(out)
            if not step:
                break
        return [(kind, t) for kind, t in out if t]

    def finish(self) -> list[tuple[str, str]]:
        held, self.held = self.held, ""
        if self.state == "reasoning":
            return [("reasoning", held)] if held else []
        if self.state == "after":
            held = held.lstrip()
        return [("content", held)] if held else []

    def _start(self, out: list[tuple[str, str]]) -> bool:
        stripped = self.held.lstrip()
        if not stripped or OPEN.startswith(stripped):
            return False  # whitespace, or the start of the marker: wait for more
        if stripped.startswith(OPEN):
            self.held = stripped[len(OPEN) :]
            self.state, self.thought = "reasoning", True
            return True
        self.state = "content"
        return True

    def _reasoning(self, out: list[tuple[str, str]]) -> bool:
        at = self.held.find(CLOSE)
        if at >= 0:
            out.append(("reasoning", self.held[:at]))
            self.held = self.held[at + len(CLOSE) :]
            self.state = "after"
            return True
        keep = _partial_marker(self.held, CLOSE)
        out.append(("reasoning", self.held[: len(self.held) - keep]))
        self.held = self.held[len(self.held) - keep :]
        return False

    def _after(self, out: list[tuple[str, str]]) -> bool:
        stripped = self.held.lstrip()
        if not stripped:
            self.held = ""
            return False
        self.held, self.state = stripped, "content"
        return True

    def _content(self, out: list[tuple[str, str]]) -> bool:
        out.append(("content", self.held))
        self.held = ""
        return False


def _partial_marker(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` begin ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0

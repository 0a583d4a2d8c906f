"""What the chat app's handlers hand Gradio: a ``View`` (one value per output panel) and
the small parsers and converters around it."""

from __future__ import annotations

import functools
import inspect
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import gradio as gr

# γ has one parser for every front end (its limit and its words): the app's handlers
# take it from here, under the name they always used.
from edgespec.decoding.choice import parse_gamma as parse_gamma
from edgespec.errors import EdgespecError
from edgespec.ui.chat_store import StoredMessage
from edgespec.ui.session import Session
from edgespec.ui.text import coloured_answer

# The choices the γ control offers: the useful short drafts only; what is allowed at all,
# ``parse_gamma`` decides.
GAMMA_CHOICES = ("auto", *(str(n) for n in range(17)))
# The settings panel's controls, in the order every handler of a message receives them.
SETTING_NAMES = (
    "drafter",
    "gamma",
    "verify",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "max_tokens",
    "lenience",
)
EMPTY_MESSAGE = "Type a message first: the message is empty."
ATTACHED_MARK = "📎 "


@dataclass
class View:
    """One value per output panel, in the order ``build_app`` wires them."""

    message: Any = field(default_factory=gr.skip)
    chatbot: Any = field(default_factory=gr.skip)
    gauge: Any = field(default_factory=gr.skip)
    legend: Any = field(default_factory=gr.skip)
    stats: Any = field(default_factory=gr.skip)
    steps_plot: Any = field(default_factory=gr.skip)
    steps_table: Any = field(default_factory=gr.skip)
    speedup: Any = field(default_factory=gr.skip)
    error: Any = field(default_factory=gr.skip)
    live: Any = field(default_factory=gr.skip)  # the feed the page reads while an answer runs
    system: Any = field(default_factory=gr.skip)  # the open chat's system prompt
    attach: Any = field(default_factory=gr.skip)  # the file input of the message being typed
    chips: Any = field(default_factory=gr.skip)  # its files, their sizes, tokens and how far read
    cost: Any = field(default_factory=gr.skip)  # what the message costs against the context

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def values(self) -> tuple:
        # Not dataclasses.astuple: that would deep-copy every figure on every update.
        return tuple(getattr(self, name) for name in self.names())


class Throttle:
    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._last = float("-inf")

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            return True
        return False


def parse_seed(value: str | float | None) -> int | None:
    """Empty means a fresh random seed for every answer."""
    if value is None or not str(value).strip():
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise EdgespecError(f"the seed must be a whole number or empty (got {value!r})") from None


EMPTY_ANSWER = "*(an empty answer)*"


def chat_messages(
    messages: Sequence[StoredMessage], colour: bool = False, streaming: str | None = None
) -> list[dict[str, Any]]:
    """Chatbot messages, one per stored message (so an index in the chat is an index in
    the store). Text goes in as an explicit text block: a bare string would be passed
    through ``inspect.cleandoc``, which strips the indentation of code answers. With
    ``colour``, an answer kept with its provenance is shown coloured by it, in place of
    its Markdown. ``streaming``: the markup of an answer still being written, last."""
    shown_messages = [
        {"role": m.role, "content": [{"type": "text", "text": _bubble(m, colour)}]} for m in messages
    ]
    if streaming is not None:
        shown_messages.append({"role": "assistant", "content": [{"type": "text", "text": streaming}]})
    return shown_messages


def _bubble(message: StoredMessage, colour: bool) -> str:
    if message.role == "assistant" and colour and message.provenance:
        return coloured_answer(message.provenance)
    text = shown(message.role, message.content) or EMPTY_ANSWER
    files = [attached_line(ref) for ref in message.attachments or []]
    return "\n".join([*files, "", text]) if files else text


def attached_line(ref: dict) -> str:
    """A file sent with a message, as the chat shows it above the message's text."""
    from edgespec.ui.files import human_size

    tokens = f", {ref['tokens']:,} tokens" if ref.get("tokens") else ""
    name, size = _md_escape(str(ref.get("name", "file"))), human_size(int(ref.get("size", 0)))
    return f"{ATTACHED_MARK}**{name}** ({size}{tokens})  "


def _md_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "\\`*_[]<>#|" else ch for ch in text)


def shown(role: str, text: str) -> str:
    """A message as the chat draws it. A user pastes code without a fence as often as with
    one, and Markdown would collapse its indentation: outside fences, a user's leading
    spaces are drawn as no-break spaces. The model is sent the text as typed."""
    if role != "user":
        return text
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            body = line.lstrip(" \t")
            indent = line[: len(line) - len(body)].replace("\t", "    ")
            line = "\u00a0" * len(indent) + body
        lines.append(line)
    return "\n".join(lines)


def owner_of(request: gr.Request | None) -> str:
    return (request.session_hash if request is not None else None) or "local"


def _chat_inputs(
    message: str,
    system: str,
    drafter: str,
    gamma: str,
    verify: str,
    temperature: float,
    top_k: float,
    top_p: float,
    min_p: float,
    seed: str | float | None,
    max_tokens: float,
    lenience: float,
    colour: bool,
    session: Session,
    request: gr.Request,
) -> None:
    """The chat's inputs in the order ``build_app`` wires them: the one parameter list
    every handler of a message shows Gradio (``takes_chat_inputs``)."""


@dataclass
class ChatInputs:
    message: str
    system: str
    settings: list[Any]  # drafter, gamma, verify, temperature … lenience, as _chat_inputs
    colour: bool
    session: Session
    request: gr.Request


def takes_chat_inputs(method: Callable) -> Callable:
    """``method(self, inputs: ChatInputs)``, shown to Gradio with one parameter per chat
    input (Gradio reads a handler's signature: its inputs, and where the request goes)."""
    names = list(inspect.signature(_chat_inputs).parameters)

    def unpack(values: tuple) -> ChatInputs:
        *settings, colour, session, request = values[2:]
        return ChatInputs(values[0], values[1] or "", settings, colour, session, request)

    if inspect.isgeneratorfunction(method):

        def wrapper(self, *values):
            yield from method(self, unpack(values))
    else:

        def wrapper(self, *values):
            return method(self, unpack(values))

    functools.update_wrapper(wrapper, method)
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameters = inspect.signature(_chat_inputs).parameters.values()
    wrapper.__signature__ = inspect.Signature([self_parameter, *parameters])  # type: ignore[attr-defined]
    hints = typing.get_type_hints(_chat_inputs)
    wrapper.__annotations__ = {name: hints[name] for name in names}
    return wrapper

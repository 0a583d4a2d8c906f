"""What the chat app's handlers hand Gradio: a ``View`` (one value per output panel) and
the small parsers and converters around it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import gradio as gr

from edgespec.errors import EdgespecError

GAMMA_CHOICES = ("auto", *(str(n) for n in range(17)))
EMPTY_MESSAGE = "Type a message first: the message is empty."


@dataclass
class View:
    """One value per output panel, in the order ``build_app`` wires them."""

    message: Any = field(default_factory=gr.skip)
    chatbot: Any = field(default_factory=gr.skip)
    provenance: Any = field(default_factory=gr.skip)
    gauge: Any = field(default_factory=gr.skip)
    stats: Any = field(default_factory=gr.skip)
    steps_plot: Any = field(default_factory=gr.skip)
    steps_table: Any = field(default_factory=gr.skip)
    speedup: Any = field(default_factory=gr.skip)
    error: Any = field(default_factory=gr.skip)
    live: Any = field(default_factory=gr.skip)  # the feed the page reads while an answer runs

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

    def due(self, force: bool = False) -> bool:
        now = time.monotonic()
        if force or now - self._last >= self.interval_s:
            self._last = now
            return True
        return False


def parse_gamma(value: str | int | float) -> int | str:
    if str(value).strip() == "auto":
        return "auto"
    try:
        gamma = int(float(value))
    except (TypeError, ValueError):
        raise EdgespecError(f"γ must be 'auto' or a number from 0 to 16 (got {value!r})") from None
    if not 0 <= gamma <= 16:
        raise EdgespecError(f"γ must be 'auto' or a number from 0 to 16 (got {gamma})")
    return gamma


def parse_seed(value: str | float | None) -> int | None:
    """Empty means a fresh random seed for every answer."""
    if value is None or not str(value).strip():
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise EdgespecError(f"the seed must be a whole number or empty (got {value!r})") from None


def chat_messages(history: list[dict[str, str]], streaming: str | None = None) -> list[dict[str, Any]]:
    """Chatbot messages. Text goes in as an explicit text block: a bare string would be
    passed through ``inspect.cleandoc``, which strips the indentation of code answers.
    ``streaming``: the markup of an answer still being written, as the last message."""
    messages = [
        {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
        for m in history
        if m["content"]
    ]
    if streaming is not None:
        messages.append({"role": "assistant", "content": [{"type": "text", "text": streaming}]})
    return messages


def owner_of(request: gr.Request | None) -> str:
    return (request.session_hash if request is not None else None) or "local"

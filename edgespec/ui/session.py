"""Per-browser-session state and the gate around the one shared engine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from edgespec.decoding.generation import Generation, LiveControl
from edgespec.ui.answer import AnswerRun


@dataclass
class Session:
    """What one browser tab remembers. Gradio hands every handler this same object, so
    Clear, the lenience slider and the colouring toggle see (and may change) what a running
    generation uses."""

    # The tab's chats, each the conversation sent to the model, and which one is open. A
    # chat taken up again finds its KV state in a slot or in the pair's prompt cache.
    chats: list[list[dict[str, str]]] = field(default_factory=lambda: [[]])
    current: int = 0
    colour: bool = True
    last_run: AnswerRun | None = None  # the latest finished answer (for recolouring, stats)
    current_run: AnswerRun | None = None  # the answer streaming right now
    last_prompt: list[dict[str, str]] | None = None  # what the latest answer answered
    last_settings: dict[str, Any] | None = None  # settings_from keywords of the latest answer
    # Target-only tokens/s on the prompt and settings of one answer (``baseline_for``),
    # measured at the user's request: a speed-up is shown for that answer only.
    baseline_rates: list[float] | None = None
    baseline_for: AnswerRun | None = None
    pending: Any = None  # the answer begun in this tab and not yet shown whole (handlers.Pending)
    baseline_job: Any = None  # a baseline being measured (handlers.BaselineJob)
    live: LiveControl | None = None  # the running answer's live control (the lenience slider)
    epoch: int = 0  # bumped by Clear: a generation from an older epoch must not write back

    @property
    def history(self) -> list[dict[str, str]]:
        """The open chat's conversation."""
        return self.chats[self.current]

    @history.setter
    def history(self, messages: list[dict[str, str]]) -> None:
        self.chats[self.current] = messages

    def titles(self) -> list[tuple[str, int]]:
        """(title, index) of every chat, for the list beside the chat: its first message."""
        return [(_title(chat, i), i) for i, chat in enumerate(self.chats)]

    def open_chat(self, index: int | None) -> None:
        """Open chat ``index``, or a new empty one (None; an empty open chat is reused).
        What belonged to the chat that was open (its figures) is forgotten."""
        if index is None:
            empty = [i for i, chat in enumerate(self.chats) if not chat]
            if empty:
                index = empty[0]
            else:
                self.chats.append([])
                index = len(self.chats) - 1
        if not 0 <= index < len(self.chats):
            raise IndexError(f"no chat {index}")
        self.current = index
        self._forget_answers()

    def reset(self) -> None:
        """Clear: the open chat starts over."""
        self.history = []
        self._forget_answers()

    def baseline(self) -> list[float] | None:
        """The baseline's measured rates, if they were measured for the latest answer."""
        return (
            self.baseline_rates if self.last_run is not None and self.baseline_for is self.last_run else None
        )

    def _forget_answers(self) -> None:
        # The baseline belonged to an answer of this chat: it goes with it.
        self.baseline_rates = self.baseline_for = None
        self.last_run = None
        self.current_run = None
        self.last_prompt = None
        self.last_settings = None
        self.epoch += 1


def _title(chat: list[dict[str, str]], index: int) -> str:
    first = next((m["content"] for m in chat if m["role"] == "user"), "")
    words = " ".join(first.split())
    if not words:
        return f"Chat {index + 1} (empty)"
    return words if len(words) <= 40 else words[:39] + "…"


class EngineGate:
    """Which tab's answers are running or waiting for the one shared pair, so that Stop
    in one tab ends that tab's answer (waiting or running) and never another's."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._answers: dict[str, Generation] = {}

    @contextmanager
    def hold(self, owner: str, answer: Generation) -> Iterator[None]:
        """``answer`` is ``owner``'s from now until the block ends."""
        with self._mutex:
            self._answers[owner] = answer
        try:
            yield
        finally:
            with self._mutex:
                if self._answers.get(owner) is answer:
                    del self._answers[owner]

    def others(self, owner: str) -> int:
        """How many other tabs' answers are running or waiting for the pair."""
        with self._mutex:
            return sum(other != owner for other in self._answers)

    def stop(self, owner: str) -> bool:
        """End ``owner``'s answer, if it has one."""
        with self._mutex:
            answer = self._answers.get(owner)
        if answer is None:
            return False
        answer.stop()
        return True

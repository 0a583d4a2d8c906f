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

    history: list[dict[str, str]] = field(default_factory=list)  # the conversation sent to the model
    colour: bool = True
    last_run: AnswerRun | None = None  # the latest finished answer (for recolouring, stats)
    current_run: AnswerRun | None = None  # the answer streaming right now
    last_prompt: list[dict[str, str]] | None = None  # what the latest answer answered
    last_settings: dict[str, Any] | None = None  # settings_from keywords of the latest answer
    baseline_rate: float | None = None  # target-only tokens/s, measured by the user's request
    live: LiveControl | None = None  # the running answer's live control (the lenience slider)
    epoch: int = 0  # bumped by Clear: a generation from an older epoch must not write back

    def reset(self) -> None:
        # The measured baseline survives Clear: it describes this machine, not the chat.
        self.history = []
        self.last_run = None
        self.current_run = None
        self.last_prompt = None
        self.last_settings = None
        self.epoch += 1


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

    def busy_for_other(self, owner: str) -> bool:
        """Is somebody else's answer running or waiting for the pair?"""
        with self._mutex:
            return any(other != owner for other in self._answers)

    def stop(self, owner: str) -> bool:
        """End ``owner``'s answer, if it has one."""
        with self._mutex:
            answer = self._answers.get(owner)
        if answer is None:
            return False
        answer.stop()
        return True

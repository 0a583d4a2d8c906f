"""Per-browser-session state and the gate around the one shared engine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from edgespec.api import EdgeSpec
from edgespec.decoding.engine import GenerationSettings
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
    live: GenerationSettings | None = None  # the settings object a running generation reads
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
    """Records which session is generating, so that Stop in one tab never ends another
    tab's answer, and re-sends a Stop that arrived before the engine listened for it."""

    def __init__(self, lm: EdgeSpec):
        self._lm = lm
        self._mutex = threading.Lock()
        self._owner: str | None = None
        self._stop_requested = False

    @contextmanager
    def hold(self, owner: str) -> Iterator[None]:
        with self._mutex:
            self._owner = owner
            self._stop_requested = False
        try:
            yield
        finally:
            with self._mutex:
                self._owner = None
                self._stop_requested = False

    def busy_for_other(self, owner: str) -> bool:
        """Is somebody else's generation holding the engine?"""
        current = self._owner
        return current is not None and current != owner

    def stop(self, owner: str) -> bool:
        """End the running generation if ``owner`` started it."""
        with self._mutex:
            if self._owner is None or self._owner != owner:
                return False
            self._stop_requested = True
        self._lm.stop()
        return True

    def enforce(self) -> None:
        """Called at every event: the engine clears its cancel flag when it starts, so a
        Stop pressed in that instant would otherwise be lost."""
        if self._stop_requested:
            self._lm.stop()

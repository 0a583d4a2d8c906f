"""The model pair the app answers with, and picking another one while it runs.

One object owns the loaded pair for as long as the app runs (``PairHolder``): every
handler asks it for the pair at the moment it starts an answer, so that a switch replaces
it for everybody at once. A switch stops the answers in progress (each tab's answer ends
with "stopped"), waits until none holds the engine, closes the old pair (its prompt cache
writes its states to disk) and loads the new one; a pair that fails to load is replaced by
the old one again, and the failure is said in one line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgespec.errors import EdgespecError

if TYPE_CHECKING:
    from edgespec.api import EdgeSpec

# How long a switch waits for the stopped answers to let go of the engine.
RELEASE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PairChoice:
    """What the app loads: a target and its draft (None: lookups only), as the CLI names them."""

    target: str
    draft: str | None


Loader = Callable[[PairChoice], "EdgeSpec"]


class PairHolder:
    """The app's pair (``lm``, None when it could not be loaded) for the app's lifetime.
    ``loader``: how to load another pair (None: the pair is fixed, as under ``serve``)."""

    def __init__(self, lm: EdgeSpec | None, load_error: str | None = None, loader: Loader | None = None):
        if lm is not None and not lm.threaded:
            # A tab's answer is submitted in one event and read in another, from Gradio's
            # threads: the pair's loop must run it on a thread of its own.
            raise EdgespecError("the chat app needs a pair loaded with RuntimeOptions(engine_thread=True)")
        self.lm = lm
        self.load_error = load_error or ("no model is loaded" if lm is None else None)
        self.loader = loader
        self.switching: str | None = None  # what is being loaded, while a switch runs
        self._previous: PairChoice | None = None  # what a failed switch goes back to
        self._lock = threading.Lock()

    def current(self) -> EdgeSpec:
        """The pair to start an answer with; a one-line error while there is none."""
        if self.switching is not None:
            raise EdgespecError(f"switching to {self.switching}: send again once it is loaded")
        if self.lm is None:
            raise EdgespecError(f"the model could not be loaded: {self.load_error}")
        return self.lm

    def switch(self, choice: PairChoice, say: Callable[[str], None]) -> EdgeSpec:
        """Replace the pair with ``choice``; ``say`` is told each stage in words."""
        if self.loader is None:
            raise EdgespecError("this app's models are fixed (edgespec serve): restart it with --target")
        if not self._lock.acquire(blocking=False):
            raise EdgespecError("another model is being loaded: wait for it")
        try:
            self.switching = choice.target
            self._let_go(say)
            return self._load(choice, say)
        finally:
            self.switching = None
            self._lock.release()

    def _let_go(self, say: Callable[[str], None]) -> None:
        old = self.lm
        if old is None:
            return
        stopped = old.stop_answers()
        if stopped:
            say(f"Stopped {stopped} answer{'s' if stopped > 1 else ''} in progress to switch models.")
        if not old.lock.acquire(timeout=RELEASE_TIMEOUT_S):
            raise EdgespecError("an answer still holds the engine: stop it and pick the model again")
        old.lock.release()
        say("Closing the current pair (its chats' prompt states are kept on disk)…")
        self.lm = None
        old.close()

    def _load(self, choice: PairChoice, say: Callable[[str], None]) -> EdgeSpec:
        assert self.loader is not None
        previous = self._previous
        say(f"Loading {choice.target} and measuring what drafting costs here (once per model)…")
        try:
            self.lm = self.loader(choice)
            self.load_error = None
            self._previous = choice
            return self.lm
        except EdgespecError as exc:
            if previous is None:
                self.load_error = str(exc)
                raise
            say(f"{choice.target} could not be loaded ({exc}); loading {previous.target} again…")
            self.lm = self.loader(previous)
            raise EdgespecError(f"{choice.target} could not be loaded: {exc}") from exc

    def loaded_as(self, choice: PairChoice) -> None:
        """Say which choice the pair loaded at start is (what a failed switch goes back to)."""
        self._previous = choice

"""Per-browser-session state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgespec.decoding.generation import LiveControl
from edgespec.ui.answer import AnswerRun, answer_from_record
from edgespec.ui.chat_store import StoredChat


@dataclass
class Session:
    """What one browser tab remembers. The chats themselves live in the app's store (one
    local user: every tab sees the same list); a tab holds which one is open and what its
    answers in flight and its latest answer show. Gradio hands every handler this same
    object, so Stop, the lenience slider and the colouring toggle see (and may change)
    what a running generation uses."""

    chat: StoredChat | None = None  # the open chat as stored (None: a new one, not stored yet)
    colour: bool = True
    last_run: AnswerRun | None = None  # the latest finished answer (for the gauge and stats)
    current_run: AnswerRun | None = None  # the answer streaming right now
    last_prompt: list[dict[str, str]] | None = None  # what the latest answer answered
    last_settings: dict[str, Any] | None = None  # settings_from keywords of the latest answer
    # Target-only tokens/s on the prompt and settings of one answer (``baseline_for``),
    # measured at the user's request: a speed-up is shown for that answer only.
    baseline_rates: list[float] | None = None
    baseline_for: AnswerRun | None = None
    intent: Any = None  # what the next answer answers, when not the message typed (handlers.Intent)
    pending: Any = None  # the answer begun in this tab and not yet shown whole (handlers.Pending)
    baseline_job: Any = None  # a baseline being measured (handlers.BaselineJob)
    live: LiveControl | None = None  # the running answer's live control (the lenience slider)
    epoch: int = 0  # bumped when another chat opens: an older epoch's answer must not write back
    # The files attached to the message being typed (prompt.Attached), and the read-ahead of
    # the chat and those files into the cache (api.ReadAhead), while there is one.
    attached: list[Any] = field(default_factory=list)
    reading: Any = None
    # An attached file's accepted revision, by the sha256 of the file it revises: the file
    # input still holds the original, and a file added beside it must not bring it back.
    revisions: dict[str, Any] = field(default_factory=dict)
    folder: str = "*"  # the folder the chat list shows: "*" every chat, "" those in none, else its id
    canvas: Any = None  # the file open in the edit pane (canvas.CanvasFile)

    @property
    def chat_id(self) -> str | None:
        return self.chat.id if self.chat is not None else None

    @property
    def system(self) -> str:
        return self.chat.system if self.chat is not None else ""

    @property
    def history(self) -> list[dict[str, str]]:
        """The open chat's conversation as the model is sent it (the system prompt apart)."""
        if self.chat is None:
            return []
        return [{"role": m.role, "content": m.content} for m in self.chat.messages]

    def open(self, chat: StoredChat | None) -> None:
        """Show ``chat`` (None: a new, empty one); its latest answer's figures come back
        from the store. What belonged to the chat that was open is forgotten."""
        self.chat = chat
        self._forget_answers()
        self.forget_files()
        self.last_run = self.stored_run()

    def stored_run(self) -> AnswerRun | None:
        """The open chat's last message folded again, when it is an answer."""
        if self.chat is None or not self.chat.messages or self.chat.messages[-1].role != "assistant":
            return None
        message = self.chat.messages[-1]
        return answer_from_record(message.content, message.stats, message.provenance, message.steps)

    def forget_files(self) -> None:
        """Nothing attached, nothing read ahead (what was read stays as cache), no file open."""
        if self.reading is not None:
            self.reading.stop()
        self.attached, self.reading, self.canvas, self.revisions = [], None, None, {}

    def baseline(self) -> list[float] | None:
        """The baseline's measured rates, if they were measured for the latest answer."""
        return (
            self.baseline_rates if self.last_run is not None and self.baseline_for is self.last_run else None
        )

    def _forget_answers(self) -> None:
        # The baseline belonged to an answer of the chat left: it goes with it.
        self.baseline_rates = self.baseline_for = None
        self.last_run = None
        self.current_run = None
        self.last_prompt = None
        self.last_settings = None
        self.epoch += 1

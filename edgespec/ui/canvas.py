"""Edit a file in place: the edit pane beside the chat. The person's instruction produces the
whole revised file, generated with the file itself as the Predicted Output, so the copy
drafters verify its unchanged runs in blocks; the revision streams into the pane coloured
by provenance, then shows as a diff against the file. Copy, Download under the file's own
name, and Accept, which makes the revision the file's next version in the chat.

Exact: the revision is the target's own answer to ``canvas_text.edit_messages`` (one user
message), the one ``edgespec generate --chat --prompt … --prediction FILE`` gives."""

from __future__ import annotations

import html
import tempfile
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from edgespec.api import settings_from
from edgespec.errors import EdgespecError
from edgespec.ui.answer import AnswerRun
from edgespec.ui.canvas_text import download_name, edit_messages, line_diff, revision_from_answer
from edgespec.ui.chat_store import ChatStore
from edgespec.ui.prompt import Attached
from edgespec.ui.session import Session
from edgespec.ui.text import provenance_pieces
from edgespec.ui.views import Throttle, owner_of

if TYPE_CHECKING:
    from edgespec.ui.attach import Attachments

SHOW_EVERY_S = 0.5  # the pane is redrawn whole: twice a second is smooth and cheap
EDITABLE = ("text", "markdown", "html")  # a PDF's text is no file to give back
NO_FILE = "attach a text or code file first: Edit revises an attached file"


@dataclass
class CanvasFile:
    """The file open in the pane: its current version, and the revision last made of it."""

    file: Attached
    text: str
    revision: str | None = None
    answer: str = ""  # the model's whole answer, of which the revision is the file
    complete: bool = False  # the answer ended by itself: a revision cut short is no file


class Canvas:
    """What the edit pane's controls do, for the app's lifetime."""

    def __init__(self, attachments: Attachments, store: ChatStore):
        self.attachments = attachments
        self.store = store

    def open(self, session: Session) -> tuple[Any, Any, Any, Any, Any]:
        """The pane, on the first file attached to the message, else the chat's latest
        file. Returns (pane, title, view, diff, download)."""
        file = self._file_to_edit(session)
        if file is None:
            gr.Warning(NO_FILE)
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        session.canvas = CanvasFile(file, self.attachments.text_of(file.sha256))
        title = f"**Editing {html.escape(file.name)}** · {len(session.canvas.text.splitlines())} lines"
        return gr.Column(visible=True), title, _pre(session.canvas.text), "", None

    def close(self) -> Any:
        return gr.Column(visible=False)

    def _file_to_edit(self, session: Session) -> Attached | None:
        for file in session.attached:
            if file.kind in EDITABLE:
                return file
        if session.chat is None:
            return None
        for name, versions in self.store.files(session.chat.id).items():
            stored = self.store.attachment(versions[-1])
            if stored.kind in EDITABLE:
                return Attached(name, stored.sha256, stored.size, stored.kind, 0)
        return None

    def run(self, instruction: str, drafter: str, gamma: str, session: Session,
            request: gr.Request) -> Iterator[tuple[Any, Any, Any, Any]]:  # fmt: skip
        """Revise the open file by ``instruction``; yields (view, diff, download, stats)."""
        canvas = session.canvas
        if canvas is None:
            raise gr.Error(NO_FILE)
        if not (instruction or "").strip():
            raise gr.Error("say what to change in the file first")
        lm = self.attachments.handlers.pair.current()
        messages = edit_messages(canvas.file.name, canvas.text, instruction.strip())
        prompt = lm.prompt_tokens(messages, chat=True)
        # As long as the file and its change need: the chat's max tokens would cut it short.
        budget = max(16, lm.target.n_ctx - len(prompt) - 1)
        try:  # γ as the control gives it: the request builder parses it, as for every front end
            request_ = lm.request(messages, settings_from(max_tokens=budget), drafter=drafter,
                                  gamma=gamma, chat=True, prediction=canvas.text)  # fmt: skip
        except EdgespecError as exc:
            raise gr.Error(str(exc)) from None
        answer = lm.submit(request_, owner=owner_of(request))  # the tab's Stop ends it
        run, throttle = AnswerRun(), Throttle(SHOW_EVERY_S)
        with closing(answer.events(SHOW_EVERY_S / 4)) as events:
            for event in events:
                run.add(event)
                if throttle.due():
                    yield _pre(run.runs, coloured=True), gr.skip(), gr.skip(), "Writing the revision…"
        yield self._finished(canvas, run)

    def _finished(self, canvas: CanvasFile, run: AnswerRun) -> tuple[Any, Any, Any, Any]:
        done = run.done
        if done is None:
            return gr.skip(), gr.skip(), gr.skip(), "the revision ended without a result"
        canvas.answer = done.text
        canvas.complete = done.stop_reason in ("eos", "stop_string")
        canvas.revision = revision_from_answer(done.text, canvas.text)
        diff = line_diff(canvas.text, canvas.revision)
        changed = (
            f'<div id="canvas-changed">{diff.changed} line{"s" if diff.changed != 1 else ""} changed</div>'
        )
        folder = Path(tempfile.mkdtemp(prefix="edgespec-revision-"))
        path = folder / download_name(canvas.file.name)
        path.write_text(canvas.revision, encoding="utf-8")
        s = done.stats
        stats = (f"{s.tokens:,} tokens · {s.decode_tokens_per_second:.1f} tokens/s decoding · "
                 f"{s.accepted:,} of {s.drafted:,} drafted tokens accepted · τ {s.tau:.2f}")  # fmt: skip
        if done.stop_reason not in ("eos", "stop_string"):
            stats += f" · **cut short ({done.stop_reason.replace('_', ' ')}): not the whole file**"
        shown = _runs_of(run.runs, done.text, canvas.revision)
        return _pre(shown, coloured=True), changed + diff.html, str(path), stats

    def accept(self, session: Session, request: gr.Request) -> tuple[Any, Any, Any]:
        """The revision becomes the file's next version: in the message being typed, and in
        the chat's files; the next instruction edits it. Returns (chips, title, view)."""
        canvas = session.canvas
        if canvas is None or canvas.revision is None:
            gr.Warning("nothing to accept: run an instruction first")
            return gr.skip(), gr.skip(), gr.skip()
        if not canvas.complete:
            gr.Warning("the revision was cut short (the context is full): it is not the whole file")
            return gr.skip(), gr.skip(), gr.skip()
        data = canvas.revision.encode("utf-8")
        sha = self.store.put_attachment(data, canvas.revision, canvas.file.kind)
        lm = self.attachments.handlers.lm
        tokens = len(lm.target.tokenize(canvas.revision, add_special=False)) if lm is not None else 0
        new = Attached(canvas.file.name, sha, len(data), canvas.file.kind, tokens)
        if canvas.file in session.attached:
            self.attachments.replace(session, canvas.file, new, request)
        if session.chat is not None:
            self.store.add_version(session.chat.id, new.name, sha)
        session.canvas = CanvasFile(new, canvas.revision)
        lines = len(canvas.revision.splitlines())
        title = f"**Editing {html.escape(new.name)}** (accepted revision) · {lines} lines"
        return self.attachments.chips(session), title, _pre(canvas.revision)


def _runs_of(runs: list[list[str]], answer: str, revision: str) -> list[list[str]]:
    """The provenance runs of the part of ``answer`` that is the revision (a fence or prose
    around it dropped); the whole answer's runs where the revision is not found in it."""
    start = answer.find(revision.rstrip("\n"))
    if start < 0:
        return runs
    end, kept, offset = start + len(revision.rstrip("\n")), [], 0
    for text, source in runs:
        lo, hi = max(start, offset), min(end, offset + len(text))
        if lo < hi:
            kept.append([text[lo - offset : hi - offset], source])
        offset += len(text)
    return kept


def _pre(content: Any, coloured: bool = False) -> str:
    """The file as the pane shows it: monospace, its lines kept; a revision coloured by
    where its tokens came from (the copies of the file mostly drafted and accepted)."""
    body = provenance_pieces(content, True) if coloured else html.escape(content)
    return f'<pre class="canvas-pre">{body}</pre>'

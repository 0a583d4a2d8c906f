"""Files attached to the message being typed: read (text, code, Markdown, HTML, PDF), kept in
the chat store by their content's hash, shown as chips with their size and token count, and
read into the model's cache in the background while the question is typed (``read_ahead``,
below any answer), so that Enter reads only what is left and the question. The message's
cost against the context is shown before it is sent."""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from edgespec.errors import EdgespecError
from edgespec.ui.chat_store import ChatStore
from edgespec.ui.files import human_size, read_attachment
from edgespec.ui.prompt import Attached, chat_prompt, files_prefix
from edgespec.ui.session import Session
from edgespec.ui.views import owner_of

if TYPE_CHECKING:
    from edgespec.ui.handlers import ChatHandlers

READ_AHEAD_OWNER = "read-ahead:"  # + the tab's owner: one read-ahead per tab


class Attachments:
    """What the file input and its chips do, for the app's lifetime (a tab's attached files
    and its read-ahead live in its ``Session``)."""

    def __init__(self, handlers: ChatHandlers, store: ChatStore):
        self.handlers = handlers
        self.store = store

    def text_of(self, sha256: str) -> str:
        return self.store.attachment(sha256).text

    # -- attaching ---------------------------------------------------------------------

    def attach(self, uploads: Any, session: Session, request: gr.Request) -> tuple[Any, Any, Any]:
        """The files now in the file input (added or removed there): read, stored, counted;
        a file that cannot be read is refused in one line and left out. Returns the chips,
        the cost line and whether the chips' progress timer runs."""
        paths = [getattr(u, "name", u) for u in (uploads or []) if u]
        files, problems = [], []
        for path in paths:
            try:
                files.append(self._attached(Path(path)))
            except EdgespecError as exc:
                problems.append(str(exc))
        if problems:
            gr.Warning(" · ".join(problems))
        session.attached = [session.revisions.get(file.sha256, file) for file in files]
        self._read_ahead(session, request)
        return self.chips(session), self.cost_line(session), gr.Timer(active=session.reading is not None)

    def _attached(self, path: Path) -> Attached:
        name = _original_name(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise EdgespecError(f"{name} cannot be read: {exc.strerror or exc}") from None
        limit = self.store.attachment_limit
        if len(data) > limit:
            raise EdgespecError(
                f"{name} is {human_size(len(data))}; files are limited to {human_size(limit)}"
            )
        extracted = read_attachment(name, data)
        sha = self.store.put_attachment(data, extracted.text, extracted.kind)
        lm = self.handlers.lm
        tokens = len(lm.target.tokenize(extracted.text, add_special=False)) if lm is not None else 0
        return Attached(name, sha, len(data), extracted.kind, tokens)

    def replace(self, session: Session, old: Attached, new: Attached, request: gr.Request | None) -> None:
        """An accepted revision takes its file's place in the message being typed."""
        session.attached = [new if file == old else file for file in session.attached]
        originals = [sha for sha, revised in session.revisions.items() if revised == old] or [old.sha256]
        session.revisions.update({sha: new for sha in originals})
        self._read_ahead(session, request)

    def clear(self, session: Session) -> None:
        """The message was sent (or the chat changed): nothing attached, nothing read ahead."""
        session.attached = []
        self.stop_reading(session)

    # -- reading ahead -----------------------------------------------------------------

    def _read_ahead(self, session: Session, request: gr.Request | None) -> None:
        """Read the chat so far and the files into the cache, below any answer. A file
        removed leaves what was read as cache, nothing else."""
        self.stop_reading(session)
        lm = self.handlers.lm
        if lm is None or not session.attached:
            return
        kept = session.chat.messages if session.chat is not None else []
        history = chat_prompt(session.system, kept, self.text_of)
        try:
            tokens = lm.prompt_prefix_tokens(history, files_prefix(session.attached, self.text_of))
        except EdgespecError:
            return  # too long for the context: the cost line says so, and sending refuses it
        if len(tokens) < lm.target.n_ctx:
            session.reading = lm.read_ahead(tokens, owner=READ_AHEAD_OWNER + owner_of(request))

    def stop_reading(self, session: Session) -> None:
        if session.reading is not None:
            session.reading.stop()
            session.reading = None

    def tick(self, session: Session) -> tuple[Any, Any]:
        """The chips again while the read-ahead reads; the timer stops once it has."""
        done = session.reading is None or session.reading.done
        return self.chips(session), gr.Timer(active=not done)

    # -- what the page shows -----------------------------------------------------------

    def chips(self, session: Session) -> str:
        if not session.attached:
            return ""
        read, total = session.reading.progress() if session.reading is not None else (0, 0)
        share = f" · read {100 * read // total} %" if total else ""
        chips = [
            f'<span class="attach-chip" title="{html.escape(file.kind)}">📎 {html.escape(file.name)}'
            f" · {human_size(file.size)} · {file.tokens:,} tokens{share}</span>"
            for file in session.attached
        ]
        return '<div class="attach-chips">' + " ".join(chips) + "</div>"

    def cost_line(self, session: Session) -> str:
        """What the message costs against the context before it is sent."""
        lm = self.handlers.lm
        if lm is None or not session.attached:
            return ""
        kept = session.chat.messages if session.chat is not None else []
        history = (
            len(lm.prompt_tokens(chat_prompt(session.system, kept, self.text_of), chat=True)) if kept else 0
        )
        files = sum(file.tokens for file in session.attached)
        total, room = history + files, lm.target.n_ctx
        verdict = "fits" if total < room else "does not fit: remove a file or raise --ctx"
        counted = f"about {total:,} tokens (chat {history:,}, files {files:,})"
        return f"This message: {counted} of {room:,}: {verdict}."


def _original_name(path: Path) -> str:
    """Gradio keeps an upload under its own name in a folder of its own."""
    return path.name

"""The app's chats as a person keeps them: the list (newest first, searched, marked warm
where the pair still holds the chat's prompt state), new, open, rename, delete, export and
import, the system prompt, and the page's remembered preferences. Each change is written
to the store at once (``chat_store.py``); answers are ``handlers.py``'s."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from edgespec.errors import EdgespecError
from edgespec.ui.chat_export import export_filename, import_export, to_json, to_markdown
from edgespec.ui.chat_store import ChatStore, ChatSummary, StoredChat
from edgespec.ui.folders import EVERY_CHAT, Folders, store_folder
from edgespec.ui.handlers import ChatHandlers
from edgespec.ui.prompt import chat_prompt
from edgespec.ui.session import Session
from edgespec.ui.text import error_markdown
from edgespec.ui.views import SETTING_NAMES, View

if TYPE_CHECKING:
    from edgespec.api import EdgeSpec

WARM_MARK = " · warm"
# Looking up whether a chat is warm renders and tokenizes it: the newest this many only.
WARM_CHECKED = 24
# A chat is warm when the pair holds all of its prompt but this share, or these few tokens
# (the end of the last answer and the template's opening of the next, which no state holds).
WARM_SHARE = 0.9
WARM_SLACK = 16
PANELS = ("stats", "steps", "settings")  # the folded panels whose state is remembered
DEFAULT_SYSTEM = "default_system"


class Library:
    """What the chat list's controls do, over the app's store (one local user)."""

    def __init__(self, handlers: ChatHandlers, store: ChatStore):
        self.handlers = handlers
        self.store = store
        self.folders: Folders | None = None  # set by the app's layout once made

    # -- the list ----------------------------------------------------------------------

    def choices(self, query: str = "", folder: str = EVERY_CHAT) -> list[tuple[str, str]]:
        """(label, chat id) of every chat in ``folder`` (the list's view) matching ``query``,
        newest first; a chat whose prompt state the pair holds is marked warm."""
        summaries = self.store.summaries(query.strip(), folder=store_folder(folder))
        lm = self.handlers.lm
        return [(self._label(s, lm if i < WARM_CHECKED else None), s.id) for i, s in enumerate(summaries)]

    def _label(self, summary: ChatSummary, lm: EdgeSpec | None) -> str:
        title = summary.title or "New chat"
        return title + WARM_MARK if lm is not None and self._warm(summary.id, lm) else title

    def _warm(self, chat_id: str, lm: EdgeSpec) -> bool:
        try:
            chat = self.store.load(chat_id)
        except EdgespecError:
            return False
        if not chat.messages:
            return False
        try:
            messages = chat_prompt(chat.system, chat.messages, self.text_of)
            tokens = lm.prompt_tokens(messages, chat=True)
        except EdgespecError:
            return False
        missing = len(tokens) - lm.cached_tokens(tokens)
        return bool(tokens) and missing <= max(WARM_SLACK, (1 - WARM_SHARE) * len(tokens))

    def chat_list(self, session: Session, query: str = "") -> Any:
        return gr.update(choices=self.choices(query, session.folder), value=session.chat_id)

    def text_of(self, sha256: str) -> str:
        return self.store.attachment(sha256).text

    # -- opening -----------------------------------------------------------------------

    def load(self, session: Session, request: gr.Request) -> tuple:
        """The page as it opens: the newest chat, the list, the remembered panels, and a
        word if the store had to be set aside."""
        newest = self.store.summaries()
        chat = self._load_or_none(newest[0].id) if newest else None
        session.colour = bool(self.store.get_pref("colour", True))
        opened = self._opened(session, chat, request)
        panels = self.store.get_pref("panels", {}) or {}
        notice = error_markdown(self.store.notice) if self.store.notice else ""
        return (*opened, *(gr.update(open=bool(panels.get(name, False))) for name in PANELS), notice)

    def new_chat(self, session: Session, system: str, request: gr.Request) -> tuple:
        """An empty chat (stored once its first question is asked), with the default
        system prompt."""
        self.handlers.stop_tab(session, request)
        session.open(None)
        view = self.handlers.answer_view(session, None)
        folder_system = self.folders.default_system(session) if self.folders is not None else None
        view.attach, view.chips, view.cost = None, "", ""
        view.message, view.system = "", folder_system or self.store.get_pref(DEFAULT_SYSTEM, "") or ""
        return (*view.values(), self.chat_list(session), *(gr.skip() for _ in SETTING_NAMES))

    def open_chat(self, chat_id: str | None, session: Session, request: gr.Request) -> tuple:
        """Open a chat picked in the list: its messages, its system prompt, its settings."""
        if not chat_id or chat_id == session.chat_id:
            return tuple(gr.skip() for _ in range(len(View.names()) + 1 + len(SETTING_NAMES)))
        return self._opened(session, self._load_or_none(chat_id), request)

    def _opened(self, session: Session, chat: StoredChat | None, request: gr.Request | None) -> tuple:
        # An answer still streaming in the chat that is left would write into it unseen.
        self.handlers.stop_tab(session, request)
        session.open(chat)
        view = self.handlers.answer_view(session, session.last_run)
        view.message, view.attach, view.chips, view.cost = "", None, "", ""
        view.system = chat.system if chat is not None else self.store.get_pref(DEFAULT_SYSTEM, "") or ""
        settings = chat.settings if chat is not None else {}
        restored = (
            gr.update(value=settings[name]) if name in settings else gr.skip() for name in SETTING_NAMES
        )
        return (*view.values(), self.chat_list(session), *restored)

    def branch(self, index: float, session: Session, request: gr.Request) -> tuple:
        """A new chat of the open chat's messages up to ``index``, listed beside it and
        opened; its first follow-up reads only the new message (the prefix is cached)."""
        if session.chat is None or not 0 <= int(index) < len(session.chat.messages):
            gr.Warning("nothing to branch from: pick a message of a stored chat")
            return tuple(gr.skip() for _ in range(len(View.names()) + 1 + len(SETTING_NAMES)))
        branched = self.store.branch(session.chat.id, int(index))
        return self._opened(session, branched, request)

    def _load_or_none(self, chat_id: str) -> StoredChat | None:
        try:
            return self.store.load(chat_id)
        except EdgespecError:
            return None  # deleted in another tab meanwhile: a new chat opens instead

    # -- changing one ------------------------------------------------------------------

    def search(self, query: str, session: Session) -> Any:
        return self.chat_list(session, query or "")

    def rename(self, title: str, session: Session) -> tuple[Any, Any]:
        """Name the open chat (an empty name: its first message again)."""
        if session.chat is None:
            gr.Warning("nothing to rename: this chat is not stored until its first message")
            return gr.skip(), gr.skip()
        self.store.rename(session.chat.id, title.strip())
        session.chat = self.store.load(session.chat.id)
        return "", self.chat_list(session)

    def delete(self, session: Session, request: gr.Request) -> tuple:
        """Delete the open chat (the page asked first), and open the newest left."""
        if session.chat is not None:
            self.store.delete(session.chat.id)
        newest = self.store.summaries()
        return self._opened(session, self._load_or_none(newest[0].id) if newest else None, request)

    def set_system(self, system: str, session: Session) -> None:
        """The open chat's system prompt, stored as typed (the next answer uses it)."""
        if session.chat is not None and session.chat.system != system.strip():
            self.store.set_system(session.chat.id, system.strip())
            session.chat.system = system.strip()

    def set_default_system(self, system: str) -> None:
        self.store.set_pref(DEFAULT_SYSTEM, system.strip())

    def remember_panel(self, name: str, is_open: bool) -> None:
        panels = dict(self.store.get_pref("panels", {}) or {})
        panels[name] = is_open
        self.store.set_pref("panels", panels)

    def remember_colour(self, colour: bool) -> None:
        self.store.set_pref("colour", bool(colour))

    # -- export and import -------------------------------------------------------------

    def export(self, session: Session, kind: str) -> Any:
        """The open chat as a file to download: Markdown (to read) or JSON (to import)."""
        if session.chat is None or not session.chat.messages:
            gr.Warning("nothing to export: this chat has no messages yet")
            return None
        chat = self.store.load(session.chat.id)
        text = to_markdown(chat) if kind == "md" else to_json(chat, self.store)
        # A folder of its own: Gradio serves the file by its name, which two chats may share.
        folder = Path(tempfile.mkdtemp(prefix="edgespec-export-"))
        path = folder / export_filename(chat, f".{kind}")
        path.write_text(text, encoding="utf-8")
        return str(path)

    def import_chat(self, upload: Any, session: Session, request: gr.Request) -> tuple:
        """A chat exported as JSON, stored as a new chat and opened; a file that is not
        one is refused in one line and nothing is stored."""
        path = getattr(upload, "name", upload)
        try:
            if not path:
                raise EdgespecError("choose a chat exported as JSON to import")
            chat = import_export(self.store, Path(path).read_bytes())
        except (EdgespecError, OSError) as exc:
            view = self.handlers._failure(f"cannot import that file: {exc}")
            return (*view.values(), gr.skip(), *(gr.skip() for _ in SETTING_NAMES))
        return self._opened(session, chat, request)

"""Chats kept together in folders: the folder the chat list shows (every chat, those in no
folder, or one folder), create, rename, delete (asked first; a folder that holds chats is
refused), a folder's system prompt (the default of its new chats), moving the open chat,
and a folder exported as one JSON bundle and imported back."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr

from edgespec.errors import EdgespecError
from edgespec.ui.chat_export import export_filename, folder_to_json, import_folder
from edgespec.ui.chat_store import ChatStore
from edgespec.ui.session import Session

EVERY_CHAT, NO_FOLDER = "*", ""  # the two views that are not a folder
DELETE_FOLDER_JS = (
    "(...args) => confirm('Delete this folder? Only an empty folder is deleted.') ? args : null"
)


class Folders:
    """What the folder controls do, over the app's store."""

    def __init__(self, chat_list: Callable[[Session, str], Any], store: ChatStore):
        # The chat list as it is now (``Library.chat_list``): a folder shown changes it.
        self.chat_list = chat_list
        self.store = store

    def choices(self) -> list[tuple[str, str]]:
        listed = [("All chats", EVERY_CHAT), ("No folder", NO_FOLDER)]
        return listed + [(f"📁 {folder.name}", folder.id) for folder in self.store.folders()]

    def move_choices(self) -> list[tuple[str, str]]:
        return [("No folder", NO_FOLDER)] + [(folder.name, folder.id) for folder in self.store.folders()]

    def picker(self, session: Session) -> Any:
        value = session.folder if session.folder in {c[1] for c in self.choices()} else EVERY_CHAT
        session.folder = value
        return gr.update(choices=self.choices(), value=value)

    def refresh(self, session: Session) -> tuple[Any, Any]:
        """The folder picker and where the open chat is, as the store has them now."""
        return self.picker(session), self._move_update(session)

    def _system_of(self, folder_id: str) -> str:
        for folder in self.store.folders():
            if folder.id == folder_id:
                return folder.system
        return ""

    def show(self, folder_id: str | None, session: Session, query: str) -> tuple[Any, Any, Any]:
        """Show a folder's chats; returns (chat list, folder name box, folder system box)."""
        session.folder = folder_id if folder_id is not None else EVERY_CHAT
        name = next((f.name for f in self.store.folders() if f.id == session.folder), "")
        return self.chat_list(session, query or ""), name, self._system_of(session.folder)

    def create(self, name: str, session: Session, query: str) -> tuple[Any, Any, Any, Any]:
        """A new folder, shown at once. Returns (folders, move choices, chat list, name box)."""
        try:
            folder = self.store.create_folder((name or "").strip())
        except EdgespecError as exc:
            gr.Warning(str(exc))
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        session.folder = folder.id
        return (
            self.picker(session),
            self._move_update(session),
            self.chat_list(session, query or ""),
            "",
        )

    def rename(self, name: str, session: Session) -> tuple[Any, Any]:
        if session.folder in (EVERY_CHAT, NO_FOLDER):
            gr.Warning("pick a folder to rename first")
            return gr.skip(), gr.skip()
        try:
            self.store.rename_folder(session.folder, (name or "").strip())
        except EdgespecError as exc:
            gr.Warning(str(exc))
            return gr.skip(), gr.skip()
        return self.picker(session), self._move_update(session)

    def delete(self, session: Session, query: str) -> tuple[Any, Any, Any]:
        """Delete the folder shown (the page asked first); one that holds chats is refused."""
        if session.folder in (EVERY_CHAT, NO_FOLDER):
            gr.Warning("pick a folder to delete first")
            return gr.skip(), gr.skip(), gr.skip()
        try:
            self.store.delete_folder(session.folder)
        except EdgespecError as exc:
            gr.Warning(str(exc))
            return gr.skip(), gr.skip(), gr.skip()
        session.folder = EVERY_CHAT
        return self.picker(session), self._move_update(session), self.chat_list(session, query or "")

    def set_system(self, system: str, session: Session) -> None:
        """The folder's system prompt: the default of the chats begun in it from now on."""
        if session.folder not in (EVERY_CHAT, NO_FOLDER):
            self.store.set_folder_system(session.folder, (system or "").strip())

    def move(self, target: str | None, session: Session, query: str) -> Any:
        """Move the open chat into ``target`` ("" : out of every folder)."""
        if session.chat is None:
            gr.Warning("nothing to move: this chat is not stored until its first message")
            return gr.skip()
        try:
            self.store.move_chat(session.chat.id, target or None)
        except EdgespecError as exc:
            gr.Warning(str(exc))
            return gr.skip()
        session.chat.folder = target or None
        return self.chat_list(session, query or "")

    def _move_update(self, session: Session) -> Any:
        current = (session.chat.folder or NO_FOLDER) if session.chat is not None else NO_FOLDER
        return gr.update(choices=self.move_choices(), value=current)

    def export(self, session: Session) -> Any:
        if session.folder in (EVERY_CHAT, NO_FOLDER):
            gr.Warning("pick a folder to export first")
            return None
        folder = next(f for f in self.store.folders() if f.id == session.folder)
        directory = Path(tempfile.mkdtemp(prefix="edgespec-export-"))
        path = directory / export_filename(SimpleNamespace(title=folder.name), ".folder.json")  # type: ignore[arg-type]
        path.write_text(folder_to_json(self.store, folder.id), encoding="utf-8")
        return str(path)

    def import_bundle(self, upload: Any, session: Session, query: str) -> tuple[Any, Any, Any]:
        path = getattr(upload, "name", upload)
        try:
            if not path:
                raise EdgespecError("choose a folder exported as JSON to import")
            folder = import_folder(self.store, Path(path).read_text(encoding="utf-8"))
        except (EdgespecError, OSError, UnicodeDecodeError) as exc:
            gr.Warning(f"cannot import that folder: {exc}")
            return gr.skip(), gr.skip(), gr.skip()
        session.folder = folder.id
        return self.picker(session), self._move_update(session), self.chat_list(session, query or "")

    def default_system(self, session: Session) -> str | None:
        """A new chat's system prompt in the folder shown (None: the app's default)."""
        folder = folder_for_new_chat(session)
        return (self._system_of(folder) or None) if folder is not None else None


def folder_for_new_chat(session: Session) -> str | None:
    """The folder a chat begun now goes in: the one the list shows, if it is a folder."""
    return None if session.folder in (EVERY_CHAT, NO_FOLDER) else session.folder


def store_folder(view: str) -> Any:
    """The store's filter for the list's view: every chat, those in none, or one folder."""
    from edgespec.ui.chat_store import ANY

    return ANY if view == EVERY_CHAT else (None if view == NO_FOLDER else view)

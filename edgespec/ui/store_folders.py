"""Folders of chats: a name (unique, ignoring case, so two folders never look alike in the
list) and the system prompt a new chat in the folder starts with. A chat is in one
folder or in none."""

from __future__ import annotations

import sqlite3
import uuid

from edgespec.errors import EdgespecError
from edgespec.ui.store_files import StoreFiles
from edgespec.ui.store_schema import FolderNotFound, StoredFolder, column_list, from_row, insert_sql, to_row

_INSERT_FOLDER = insert_sql("folders", StoredFolder)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


class StoreFolders(StoreFiles):
    def create_folder(self, name: str, system: str = "") -> StoredFolder:
        with self._write() as db:
            folder = StoredFolder(uuid.uuid4().hex, self._free_name(db, name), system, self._stamp())
            db.execute(_INSERT_FOLDER, to_row(folder))
        return folder

    def folder(self, folder_id: str) -> StoredFolder:
        with self._read() as db:
            return self._folder(db, folder_id)

    def folders(self) -> list[StoredFolder]:
        """Every folder, by name (ignoring case)."""
        with self._read() as db:
            rows = db.execute(f"SELECT {column_list(StoredFolder)} FROM folders").fetchall()
        return sorted((from_row(StoredFolder, row) for row in rows), key=lambda f: (f.name.casefold(), f.id))

    def rename_folder(self, folder_id: str, name: str) -> None:
        with self._write() as db:
            self._folder(db, folder_id)
            db.execute(
                "UPDATE folders SET name = ? WHERE id = ?", (self._free_name(db, name, folder_id), folder_id)
            )

    def set_folder_system(self, folder_id: str, system: str) -> None:
        """The system prompt new chats in the folder start with (those in it keep theirs)."""
        with self._write() as db:
            self._folder(db, folder_id)
            db.execute("UPDATE folders SET system = ? WHERE id = ?", (system, folder_id))

    def delete_folder(self, folder_id: str, *, with_chats: bool = False) -> None:
        """Delete the folder; one that holds chats only ``with_chats``, which deletes them
        too (so no chat is lost by a click on the folder). A missing folder: nothing."""
        with self._write() as db:
            row = db.execute("SELECT name FROM folders WHERE id = ?", (folder_id,)).fetchone()
            if row is None:
                return
            chats = [held["id"] for held in db.execute("SELECT id FROM chats WHERE folder = ?", (folder_id,))]
            if chats and not with_chats:
                held = _plural(len(chats), "chat")
                raise EdgespecError(f"The folder {row['name']} holds {held}: move or delete them first.")
            for chat_id in chats:
                self._delete_chat(db, chat_id)
            db.execute("DELETE FROM folders WHERE id = ?", (folder_id,))

    def move_chat(self, chat_id: str, folder_id: str | None) -> None:
        """Put the chat in ``folder_id`` (None: in no folder). Its place in the list stays:
        filing a chat is not talking in it."""
        with self._write() as db:
            self._chat(db, chat_id)
            if folder_id is not None:
                self._folder(db, folder_id)
            db.execute("UPDATE chats SET folder = ? WHERE id = ?", (folder_id, chat_id))

    def _folder(self, db: sqlite3.Connection, folder_id: str) -> StoredFolder:
        row = db.execute(
            f"SELECT {column_list(StoredFolder)} FROM folders WHERE id = ?", (folder_id,)
        ).fetchone()
        if row is None:
            raise FolderNotFound(f"There is no folder {folder_id} (another tab may have deleted it).")
        return from_row(StoredFolder, row)

    def _free_name(self, db: sqlite3.Connection, name: str, renaming: str | None = None) -> str:
        """``name`` on one line, if no other folder has it (ignoring case)."""
        name = " ".join(name.split())
        if not name:
            raise EdgespecError("A folder needs a name.")
        taken = db.execute(
            "SELECT name FROM folders WHERE fold(name) = ? AND id IS NOT ?", (name.casefold(), renaming)
        ).fetchone()
        if taken is not None:
            raise EdgespecError(f"There is already a folder named {taken['name']}.")
        return name

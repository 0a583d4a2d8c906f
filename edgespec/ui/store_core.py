"""What every part of the chat store shares: the one connection under its lock, a committed
transaction per change, a chat's row and messages read by column name, preferences.
``ChatStore`` (``chat_store.py``) is this plus files (``store_files.py``) and folders
(``store_folders.py``)."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgespec.errors import EdgespecError
from edgespec.ui.store_schema import (
    DEFAULT_ATTACHMENT_LIMIT,
    ChatNotFound,
    StoredChat,
    StoredMessage,
    column_list,
    from_row,
    to_row,
)

SHA256 = re.compile(r"[0-9a-f]{64}")


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT: a write is on disk whole or not at all."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        if db.in_transaction:  # SQLite may have rolled back already
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def check_reference(ref: Any) -> None:
    """A message's reference to an attachment, as ``StoredMessage.attachments`` holds it."""
    if not isinstance(ref, dict):
        raise ValueError(f"an attachment reference must be a dict, not {type(ref).__name__}")
    if not (isinstance(ref.get("sha256"), str) and SHA256.fullmatch(ref["sha256"])):
        raise ValueError(f"an attachment's sha256 must be 64 lowercase hex digits, not {ref.get('sha256')!r}")
    if not (isinstance(ref.get("name"), str) and ref["name"].strip()):
        raise ValueError(f"an attachment needs a name, not {ref.get('name')!r}")
    for key, allowed in (("size", False), ("tokens", True)):
        value = ref.get(key)
        if not ((allowed and value is None) or (isinstance(value, int) and not isinstance(value, bool))):
            raise ValueError(f"an attachment's {key} must be an integer, not {value!r}")
    if not isinstance(ref.get("kind"), str):
        raise ValueError(f"an attachment's kind must be a string, not {ref.get('kind')!r}")


def encode_message(message: StoredMessage) -> dict[str, Any]:
    """The message's columns; a bad role or reference raises ValueError, a value that is not
    JSON-able TypeError, before anything is written."""
    if message.role not in ("user", "assistant"):
        raise ValueError(f"a message's role must be user or assistant, not {message.role!r}")
    if message.attachments is not None:
        if not isinstance(message.attachments, list):
            raise ValueError("a message's attachments must be a list")
        for ref in message.attachments:
            check_reference(ref)
    return to_row(message)


class StoreCore:
    """One SQLite connection for the store's lifetime, shared by every thread under a lock.
    Every read is by column name (``sqlite3.Row``)."""

    def __init__(
        self,
        db: sqlite3.Connection,
        path: Path,
        notice: str | None = None,
        attachment_limit: int = DEFAULT_ATTACHMENT_LIMIT,
    ):
        self._db, self.path, self._lock, self._last_stamp = db, path, threading.Lock(), 0.0
        self.notice = notice  # one line when a bad file was set aside on open, else None
        self._attachment_limit = attachment_limit
        db.row_factory = sqlite3.Row
        # The search folds case in Python: SQLite's LIKE folds ASCII only.
        db.create_function("fold", 1, lambda text: (text or "").casefold(), deterministic=True)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _stamp(self) -> float:
        """Now, strictly increasing in the process (``ChatStore`` gives it its clock)."""
        raise NotImplementedError

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One committed transaction under the lock; a storage failure becomes one line."""
        with self._lock:
            try:
                with transaction(self._db) as db:
                    yield db
            except sqlite3.Error as exc:
                raise EdgespecError(f"Could not save to the chat store {self.path}: {exc}") from exc

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._db

    def _chat(self, db: sqlite3.Connection, chat_id: str) -> StoredChat:
        """The chat without its messages."""
        row = db.execute(f"SELECT {column_list(StoredChat)} FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise ChatNotFound(f"There is no chat {chat_id} (another tab may have deleted it).")
        return from_row(StoredChat, row)

    def _messages(self, db: sqlite3.Connection, chat_id: str) -> list[StoredMessage]:
        query = f"SELECT {column_list(StoredMessage)} FROM messages WHERE chat_id = ? ORDER BY position"
        return [from_row(StoredMessage, row) for row in db.execute(query, (chat_id,))]

    def _touch(self, db: sqlite3.Connection, chat_id: str, **columns: Any) -> None:
        """Set ``columns`` of an existing chat and make it the newest."""
        self._chat(db, chat_id)
        columns["updated"] = self._stamp()
        assignments = ", ".join(f"{name} = :{name}" for name in columns)
        db.execute(f"UPDATE chats SET {assignments} WHERE id = :chat_id", {**columns, "chat_id": chat_id})

    def get_pref(self, key: str, default: Any = None) -> Any:
        with self._read() as db:
            row = db.execute("SELECT value FROM prefs WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row["value"])

    def set_pref(self, key: str, value: Any) -> None:
        encoded = json.dumps(value, ensure_ascii=False)  # not JSON-able: TypeError, nothing written
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO prefs (key, value) VALUES (?, ?)", (key, encoded))

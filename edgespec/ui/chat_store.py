"""Every chat on disk: one SQLite file, a committed transaction per change, so a killed
process loses no finished message. A file that is not ours is set aside, never fatal: the
app must open even when its history cannot be read. Pure: no model, no Gradio.

The records and the migrations are ``store_schema.py``'s (rows read and written by column
name); attachments and file versions ``store_files.py``'s, folders ``store_folders.py``'s.
``ChatStore`` here is all of them, with the chats themselves and their branches."""

from __future__ import annotations

import itertools
import json
import math
import os
import sqlite3
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Final

from edgespec.errors import EdgespecError
from edgespec.ui.store_core import encode_message, transaction
from edgespec.ui.store_files import check_limit, checked_attachment
from edgespec.ui.store_folders import StoreFolders
from edgespec.ui.store_schema import (
    DEFAULT_ATTACHMENT_LIMIT,
    MIGRATIONS,
    AttachmentNotFound,
    ChatNotFound,
    ChatSummary,
    FolderNotFound,
    StoredAttachment,
    StoredChat,
    StoredFolder,
    StoredMessage,
    StoredVersion,
    format_size,
    insert_sql,
    tables_at,
    to_row,
)

__all__ = [
    "ANY",
    "APPLICATION_ID",
    "DEFAULT_ATTACHMENT_LIMIT",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "STORE_NAME",
    "AttachmentNotFound",
    "ChatNotFound",
    "ChatStore",
    "ChatSummary",
    "FolderNotFound",
    "StoredAttachment",
    "StoredChat",
    "StoredFolder",
    "StoredMessage",
    "StoredVersion",
    "default_data_dir",
    "format_size",
]

STORE_NAME = "chats.sqlite3"
APPLICATION_ID = 0x45445350  # "EDSP": tells our files from any other SQLite file
TITLE_LIMIT = 60
PREVIEW_LIMIT = 80
SCHEMA_VERSION = len(MIGRATIONS)
_SIDECARS = ("", "-wal", "-shm")  # the store's file and SQLite's files beside it
_INSERT_CHAT = insert_sql("chats", StoredChat)


class _Anywhere:
    def __repr__(self) -> str:
        return "ANY"


ANY: Final = _Anywhere()  # ``summaries(folder=ANY)``: chats in any folder or none


def default_data_dir() -> Path:
    """``EDGESPEC_DATA_DIR`` when set, else the platform's user data folder."""
    if os.environ.get("EDGESPEC_DATA_DIR"):
        return Path(os.environ["EDGESPEC_DATA_DIR"]).expanduser()
    try:
        from platformdirs import user_data_dir
    except ImportError:  # not a declared dependency: the folder platformdirs would give
        home = Path.home()
        if sys.platform == "win32":
            return Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local") / "edgespec"
        if sys.platform == "darwin":
            return home / "Library" / "Application Support" / "edgespec"
        return Path(os.environ.get("XDG_DATA_HOME", "").strip() or home / ".local" / "share") / "edgespec"
    return Path(user_data_dir("edgespec", appauthor=False))


def _unusable(db: sqlite3.Connection, latest: int) -> str | None:
    """Why the file cannot be our store (read-only checks), or None."""
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    version = db.execute("PRAGMA user_version").fetchone()[0]
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if app_id not in (0, APPLICATION_ID):
        return f"it belongs to another program, application_id {app_id:#x}"
    if app_id == 0 and tables:
        return "it holds another program's tables"
    if version > latest:
        return f"it was written by a newer edgespec, schema version {version}; this one reads up to {latest}"
    if app_id == APPLICATION_ID and not tables >= tables_at(version):
        return "its tables are missing"
    check = db.execute("PRAGMA quick_check").fetchall()
    return None if check == [("ok",)] else f"it is damaged: {' '.join(check[0][0].split())}"


def _open_checked(path: Path, latest: int) -> tuple[sqlite3.Connection | None, str | None]:
    """A ready connection, or None and why the file must be set aside."""
    if path.exists():  # garbage is told before SQLite opens it: SQLite deletes a -wal beside it
        with path.open("rb") as file:
            if file.read(16) not in (b"", b"SQLite format 3\x00"):
                return None, "not a database"
    db = None
    try:
        # Autocommit: every write is an explicit transaction. Gradio calls handlers from many
        # threads; the store's lock serializes them on this one connection.
        db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        problem = _unusable(db, latest)
        if problem is not None:
            db.close()
            return None, problem
        db.execute("PRAGMA journal_mode = WAL")  # readers never wait on the writer
        # A killed process loses no commit in WAL even with NORMAL; FULL also survives a power
        # cut, and a chat writes a message at a time, so its fsync goes unnoticed.
        db.execute("PRAGMA synchronous = FULL")
        for step in range(db.execute("PRAGMA user_version").fetchone()[0], latest):
            with transaction(db):
                MIGRATIONS[step](db)
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {step + 1}")
        return db, None
    except sqlite3.DatabaseError as exc:
        if db is not None:
            db.close()
        # Only bad content is set aside: a locked, read-only or failing disk is the
        # environment's, and setting a good store aside for it would hide the user's chats.
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if code not in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            raise EdgespecError(f"Cannot use the chat store {path}: {exc}") from exc
        return None, "not a database" if code == sqlite3.SQLITE_NOTADB else f"damaged: {exc}"


def _set_aside(path: Path) -> Path:
    """Rename the store and its -wal and -shm files to a name none of them has yet."""
    base = f"{path.name}.set-aside-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    for n in itertools.count():
        aside = path.with_name(base if n == 0 else f"{base}.{n}")
        if not any(Path(f"{aside}{tail}").exists() for tail in _SIDECARS):
            break
    for tail in _SIDECARS:
        if Path(f"{path}{tail}").exists():
            os.rename(f"{path}{tail}", f"{aside}{tail}")
    return aside


def _one_line(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


class ChatStore(StoreFolders):
    """The chats, their files and folders. A chat id that is not there raises
    ``ChatNotFound`` (an ``EdgespecError``); ``delete`` of a missing chat does nothing
    (two tabs may delete the same chat)."""

    @classmethod
    def open(cls, directory: Path, attachment_limit: int = DEFAULT_ATTACHMENT_LIMIT) -> ChatStore:
        """The store in ``directory`` (made if missing); an unusable file there is set aside.
        ``attachment_limit``: bytes per attached file, unless the store's pref says otherwise."""
        check_limit(attachment_limit)
        path = Path(directory) / STORE_NAME
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(path.parent, os.W_OK | os.X_OK):
                raise PermissionError(f"{path.parent} is not writable (set EDGESPEC_DATA_DIR)")
            db, problem = _open_checked(path, SCHEMA_VERSION)
            if db is not None:
                return cls(db, path, None, attachment_limit)
            aside = _set_aside(path)
            db, again = _open_checked(path, SCHEMA_VERSION)
        except OSError as exc:  # the folder or the file cannot be made, read or renamed
            raise EdgespecError(f"Cannot use the chat store {path}: {exc.strerror or exc}") from exc
        if db is None:  # a brand-new file failing its checks: the disk is at fault, not a file
            raise EdgespecError(f"Cannot start a new chat store at {path}: {again}")
        notice = f"The chat store {path} could not be used ({problem}); it was set aside as {aside.name}"
        return cls(db, path, notice + " and a new one started.", attachment_limit)

    def _stamp(self) -> float:
        # Strictly increasing in the process, so "newest first" holds within one clock tick.
        now = time.time()
        self._last_stamp = now if now > self._last_stamp else math.nextafter(self._last_stamp, math.inf)
        return self._last_stamp

    def _derived_title(self, db: sqlite3.Connection, chat_id: str) -> str:
        first = "SELECT content FROM messages WHERE chat_id = ? AND role = 'user' ORDER BY position LIMIT 1"
        row = db.execute(first, (chat_id,)).fetchone()
        return _one_line(row["content"], TITLE_LIMIT) if row else ""

    def create(
        self,
        system: str | None = None,
        settings: dict | None = None,
        title: str = "",
        folder: str | None = None,
    ) -> StoredChat:
        """A new empty chat, in ``folder`` if given. A non-empty ``title`` counts as a name the
        user gave it; ``system`` None: the folder's system prompt, else none."""
        title = " ".join(title.split())
        if system is None:
            system = self.folder(folder).system if folder is not None else ""
        return self.import_chat(
            StoredChat("", title, system, settings or {}, 0.0, 0.0, [], bool(title), folder)
        )

    def load(self, chat_id: str) -> StoredChat:
        with self._read() as db:
            chat = self._chat(db, chat_id)
            chat.messages = self._messages(db, chat_id)
        return chat

    def summaries(self, query: str = "", folder: str | _Anywhere | None = ANY) -> list[ChatSummary]:
        """The chats in ``folder`` (``ANY``: everywhere, None: in no folder), newest
        ``updated`` first; with ``query``, those whose title, system prompt or any message
        holds it, ignoring case (instr, not LIKE: % and _ are literal)."""
        conditions = []
        if query:
            conditions.append("""(instr(fold(c.title), :q) OR instr(fold(c.system), :q) OR EXISTS (
                SELECT 1 FROM messages m WHERE m.chat_id = c.id AND instr(fold(m.content), :q)))""")
        if folder is None:
            conditions.append("c.folder IS NULL")
        elif folder is not ANY:
            conditions.append("c.folder = :folder")
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        sql = f"""SELECT c.id AS id, c.title AS title, c.updated AS updated,
                (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id) AS messages,
                (SELECT substr(m.content, 1, 1000) FROM messages m WHERE m.chat_id = c.id
                 ORDER BY m.position DESC LIMIT 1) AS preview,
                c.folder AS folder
            FROM chats c {where} ORDER BY c.updated DESC, c.id"""
        bound = {"q": query.casefold(), "folder": folder if isinstance(folder, str) else None}
        with self._read() as db:
            rows = db.execute(sql, bound).fetchall()
        return [
            ChatSummary(**{**dict(row), "preview": _one_line(row["preview"] or "", PREVIEW_LIMIT)})
            for row in rows
        ]

    def append(self, chat_id: str, message: StoredMessage) -> None:
        """Add ``message`` at the end; an unnamed, untitled chat takes a user message as title.
        The files it names must be in the store (``put_attachment``)."""
        row = encode_message(message)  # a bad message fails here, before anything is written
        with self._write() as db:
            chat = self._chat(db, chat_id)
            stamp = self._stamp()
            next_position = "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE chat_id = ?"
            self._insert_messages(
                db, chat_id, db.execute(next_position, (chat_id,)).fetchone()[0], [row], stamp
            )
            title = chat.title
            if not chat.named and not title and message.role == "user":
                title = _one_line(message.content, TITLE_LIMIT)
            db.execute("UPDATE chats SET updated = ?, title = ? WHERE id = ?", (stamp, title, chat_id))

    def truncate(self, chat_id: str, keep: int) -> None:
        """Keep the first ``keep`` messages (regenerate, edit and resend); a derived title
        follows, and a file only the removed messages held goes."""
        if keep < 0:
            raise ValueError(f"keep must be >= 0, not {keep}")
        with self._write() as db:
            chat = self._chat(db, chat_id)
            self._drop_messages(db, chat_id, keep)
            self._touch(db, chat_id, title=chat.title if chat.named else self._derived_title(db, chat_id))

    def rename(self, chat_id: str, title: str) -> None:
        """Name the chat; an empty title gives it back the title of its first user message."""
        title = " ".join(title.split())
        with self._write() as db:
            self._touch(db, chat_id, title=title or self._derived_title(db, chat_id), named=int(bool(title)))

    def set_system(self, chat_id: str, system: str) -> None:
        with self._write() as db:
            self._touch(db, chat_id, system=system)

    def set_settings(self, chat_id: str, settings: dict) -> None:
        encoded = json.dumps(dict(settings), ensure_ascii=False)  # not JSON-able: TypeError, nothing written
        with self._write() as db:
            self._touch(db, chat_id, settings=encoded)

    def delete(self, chat_id: str) -> None:
        """The chat, its messages and versions, and the files no other chat holds."""
        with self._write() as db:
            self._delete_chat(db, chat_id)

    def import_chat(
        self,
        chat: StoredChat,
        attachments: Iterable[StoredAttachment] = (),
        versions: Iterable[StoredVersion] = (),
    ) -> StoredChat:
        """A copy of ``chat`` under a new id; ``updated`` is now, so it is listed first.
        ``attachments``: files its messages or ``versions`` (accepted versions, in order)
        name that the store may not hold yet, each checked against its data and the limit
        before anything is written. ``chat.folder``, when set, must be a folder here."""
        rows = [encode_message(message) for message in chat.messages]
        limit = self.attachment_limit
        files = [checked_attachment(attachment, limit) for attachment in attachments]
        versions = list(versions)
        chat_id = uuid.uuid4().hex
        with self._write() as db:
            if chat.folder is not None:
                self._folder(db, chat.folder)
            stamp = self._stamp()
            for attachment in files:
                self._keep_attachment(db, replace(attachment, created=attachment.created or stamp))
            kept = replace(
                chat, id=chat_id, settings=dict(chat.settings), created=chat.created or stamp, updated=stamp
            )
            db.execute(_INSERT_CHAT, to_row(kept))
            self._insert_messages(db, chat_id, 0, rows, stamp)
            self._keep_versions(db, chat_id, versions)
        return self.load(chat_id)

    def branch(self, chat_id: str, upto: int) -> StoredChat:
        """A new chat holding copies of messages 0..``upto`` (their files too), the same
        system prompt, settings and folder, named "<title> (branch)", listed first. It keeps
        the file versions accepted before the message after ``upto``."""
        with self._write() as db:
            source = self._chat(db, chat_id)
            messages = self._messages(db, chat_id)
            if isinstance(upto, bool) or not isinstance(upto, int) or not 0 <= upto < len(messages):
                held = f"messages 0 to {len(messages) - 1}" if messages else "no messages"
                raise EdgespecError(f"Cannot branch the chat at message {upto!r}: it holds {held}.")
            stamp, branch_id = self._stamp(), uuid.uuid4().hex
            title = f"{source.title or 'Untitled chat'} (branch)"
            branch = replace(
                source,
                id=branch_id,
                title=title,
                named=True,
                created=stamp,
                updated=stamp,
                branched_from=chat_id,
            )
            db.execute(_INSERT_CHAT, to_row(branch))
            self._insert_messages(db, branch_id, 0, [to_row(m) for m in messages[: upto + 1]], stamp)
            until = messages[upto + 1].created if upto + 1 < len(messages) else math.inf
            self._keep_versions(db, branch_id, [v for v in self._versions(db, chat_id) if v.created < until])
        return self.load(branch_id)

"""Every chat on disk: one SQLite file, a committed transaction per change, so a killed
process loses no finished message. A file that is not ours is set aside, never fatal: the
app must open even when its history cannot be read. Pure: no model, no Gradio."""

from __future__ import annotations

import itertools
import json
import math
import os
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.errors import EdgespecError

STORE_NAME = "chats.sqlite3"
APPLICATION_ID = 0x45445350  # "EDSP": tells our files from any other SQLite file
TITLE_LIMIT = 60
PREVIEW_LIMIT = 80
_SIDECARS = ("", "-wal", "-shm")  # the store's file and SQLite's files beside it


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


@dataclass
class StoredMessage:
    role: str  # "user" or "assistant"
    content: str
    stats: dict | None = None  # the answer's figures (JSON-able)
    provenance: list[list[str]] | None = None  # [text, source] runs
    steps: list[dict] | None = None  # per-step records (JSON-able)
    settings: dict | None = None  # the generation settings the answer used
    created: float = 0.0  # 0: stamped when stored


@dataclass
class StoredChat:
    id: str
    title: str
    system: str
    settings: dict
    created: float
    updated: float
    messages: list[StoredMessage] = field(default_factory=list)
    named: bool = False  # the user named it: the title no longer follows the first message


@dataclass
class ChatSummary:
    id: str
    title: str
    updated: float
    messages: int
    preview: str  # the latest message on one line, shortened


class ChatNotFound(EdgespecError):
    """No chat with that id: another tab may have deleted it."""


_CHAT = "id, title, system, settings, created, updated, named"
_MESSAGE = "role, content, stats, provenance, steps, settings, created"
_JSON_FIELDS = ("stats", "provenance", "steps", "settings")
_INSERT_MESSAGE = f"INSERT INTO messages (chat_id, position, {_MESSAGE}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_TABLES = {"chats", "messages", "prefs"}


def _create_v1(db: sqlite3.Connection) -> None:
    for statement in (  # one at a time: executescript would commit the migration's transaction
        "CREATE TABLE chats (id TEXT PRIMARY KEY, title TEXT NOT NULL, system TEXT NOT NULL, settings"
        " TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, named INTEGER NOT NULL)",
        "CREATE INDEX chats_by_updated ON chats (updated)",
        "CREATE TABLE messages (chat_id TEXT NOT NULL, position INTEGER NOT NULL, role TEXT NOT NULL,"
        " content TEXT NOT NULL, stats TEXT, provenance TEXT, steps TEXT, settings TEXT,"
        " created REAL NOT NULL, PRIMARY KEY (chat_id, position)) WITHOUT ROWID",
        "CREATE TABLE prefs (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ):
        db.execute(statement)


# MIGRATIONS[n] takes a store from version n to n + 1 (0: a new, empty file): version 2 is
# one more function here. Each runs in one transaction with the version it reaches.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_create_v1]
SCHEMA_VERSION = len(MIGRATIONS)


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT: a write is on disk whole or not at all."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        if db.in_transaction:  # SQLite may have rolled back already
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


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
    if app_id == APPLICATION_ID and not tables >= _TABLES:
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
            with _transaction(db):
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


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _one_line(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def _encode(m: StoredMessage) -> tuple:
    """The message's columns after (chat_id, position); a value not JSON-able raises TypeError."""
    if m.role not in ("user", "assistant"):
        raise ValueError(f"a message's role must be user or assistant, not {m.role!r}")
    return (m.role, m.content, *(_dump(getattr(m, name)) for name in _JSON_FIELDS), m.created)


class ChatStore:
    """One SQLite connection for the store's lifetime, shared by every thread under a lock.
    A chat id that is not there raises ``ChatNotFound`` (an ``EdgespecError``); ``delete``
    of a missing chat does nothing (two tabs may delete the same chat)."""

    def __init__(self, db: sqlite3.Connection, path: Path, notice: str | None = None):
        self._db, self.path, self._lock, self._last_stamp = db, path, threading.Lock(), 0.0
        self.notice = notice  # one line when a bad file was set aside on open, else None
        # The search folds case in Python: SQLite's LIKE folds ASCII only.
        db.create_function("fold", 1, lambda text: (text or "").casefold(), deterministic=True)

    @classmethod
    def open(cls, directory: Path) -> ChatStore:
        """The store in ``directory`` (made if missing); an unusable file there is set aside."""
        path = Path(directory) / STORE_NAME
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(path.parent, os.W_OK | os.X_OK):
                raise PermissionError(f"{path.parent} is not writable (set EDGESPEC_DATA_DIR)")
            db, problem = _open_checked(path, SCHEMA_VERSION)
            if db is not None:
                return cls(db, path)
            aside = _set_aside(path)
            db, again = _open_checked(path, SCHEMA_VERSION)
        except OSError as exc:  # the folder or the file cannot be made, read or renamed
            raise EdgespecError(f"Cannot use the chat store {path}: {exc.strerror or exc}") from exc
        if db is None:  # a brand-new file failing its checks: the disk is at fault, not a file
            raise EdgespecError(f"Cannot start a new chat store at {path}: {again}")
        notice = f"The chat store {path} could not be used ({problem}); it was set aside as {aside.name}"
        return cls(db, path, notice + " and a new one started.")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _stamp(self) -> float:
        # Strictly increasing in the process, so "newest first" holds within one clock tick.
        now = time.time()
        self._last_stamp = now if now > self._last_stamp else math.nextafter(self._last_stamp, math.inf)
        return self._last_stamp

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One committed transaction under the lock; a storage failure becomes one line."""
        with self._lock:
            try:
                with _transaction(self._db) as db:
                    yield db
            except sqlite3.Error as exc:
                raise EdgespecError(f"Could not save to the chat store {self.path}: {exc}") from exc

    def _row(self, db: sqlite3.Connection, chat_id: str) -> tuple:
        row = db.execute(f"SELECT {_CHAT} FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise ChatNotFound(f"There is no chat {chat_id} (another tab may have deleted it).")
        return row

    def _touch(self, db: sqlite3.Connection, chat_id: str, **columns: Any) -> None:
        """Set ``columns`` of an existing chat and make it the newest."""
        self._row(db, chat_id)
        columns["updated"] = self._stamp()
        assignments = ", ".join(f"{name} = ?" for name in columns)
        db.execute(f"UPDATE chats SET {assignments} WHERE id = ?", (*columns.values(), chat_id))

    def _derived_title(self, db: sqlite3.Connection, chat_id: str) -> str:
        first = "SELECT content FROM messages WHERE chat_id = ? AND role = 'user' ORDER BY position LIMIT 1"
        row = db.execute(first, (chat_id,)).fetchone()
        return _one_line(row[0], TITLE_LIMIT) if row else ""

    def create(self, system: str = "", settings: dict | None = None, title: str = "") -> StoredChat:
        """A new empty chat. A non-empty ``title`` counts as a name the user gave it."""
        title = " ".join(title.split())
        return self.import_chat(StoredChat("", title, system, settings or {}, 0.0, 0.0, [], bool(title)))

    def load(self, chat_id: str) -> StoredChat:
        with self._lock:
            cid, title, system, settings, created, updated, named = self._row(self._db, chat_id)
            query = f"SELECT {_MESSAGE} FROM messages WHERE chat_id = ? ORDER BY position"
            rows = self._db.execute(query, (chat_id,)).fetchall()
        messages = [StoredMessage(role, text, *map(_load, fields), at) for role, text, *fields, at in rows]
        return StoredChat(cid, title, system, _load(settings), created, updated, messages, bool(named))

    def summaries(self, query: str = "") -> list[ChatSummary]:
        """Every chat, newest ``updated`` first; with ``query``, those whose title, system
        prompt or any message holds it, ignoring case (instr, not LIKE: % and _ are literal)."""
        where = ""
        if query:
            where = """WHERE instr(fold(c.title), :q) OR instr(fold(c.system), :q) OR EXISTS (
                SELECT 1 FROM messages m WHERE m.chat_id = c.id AND instr(fold(m.content), :q))"""
        sql = f"""SELECT c.id, c.title, c.updated,
                (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id),
                (SELECT substr(m.content, 1, 1000) FROM messages m WHERE m.chat_id = c.id
                 ORDER BY m.position DESC LIMIT 1)
            FROM chats c {where} ORDER BY c.updated DESC, c.id"""
        with self._lock:
            rows = self._db.execute(sql, {"q": query.casefold()}).fetchall()
        return [
            ChatSummary(cid, title, updated, count, _one_line(last or "", PREVIEW_LIMIT))
            for cid, title, updated, count, last in rows
        ]

    def append(self, chat_id: str, message: StoredMessage) -> None:
        """Add ``message`` at the end; an unnamed, untitled chat takes a user message as title."""
        row = _encode(message)  # a bad message fails here, before anything is written
        with self._write() as db:
            _, title, *_, named = self._row(db, chat_id)
            stamp = self._stamp()
            next_position = "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE chat_id = ?"
            position = db.execute(next_position, (chat_id,)).fetchone()[0]
            db.execute(_INSERT_MESSAGE, (chat_id, position, *row[:-1], row[-1] or stamp))
            if not named and not title and message.role == "user":
                title = _one_line(message.content, TITLE_LIMIT)
            db.execute("UPDATE chats SET updated = ?, title = ? WHERE id = ?", (stamp, title, chat_id))

    def truncate(self, chat_id: str, keep: int) -> None:
        """Keep the first ``keep`` messages (regenerate, edit and resend); a derived title follows."""
        if keep < 0:
            raise ValueError(f"keep must be >= 0, not {keep}")
        with self._write() as db:
            _, title, *_, named = self._row(db, chat_id)
            db.execute("DELETE FROM messages WHERE chat_id = ? AND position >= ?", (chat_id, keep))
            self._touch(db, chat_id, title=title if named else self._derived_title(db, chat_id))

    def rename(self, chat_id: str, title: str) -> None:
        """Name the chat; an empty title gives it back the title of its first user message."""
        title = " ".join(title.split())
        with self._write() as db:
            self._touch(db, chat_id, title=title or self._derived_title(db, chat_id), named=bool(title))

    def set_system(self, chat_id: str, system: str) -> None:
        with self._write() as db:
            self._touch(db, chat_id, system=system)

    def set_settings(self, chat_id: str, settings: dict) -> None:
        with self._write() as db:
            self._touch(db, chat_id, settings=_dump(dict(settings)))

    def delete(self, chat_id: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM messages WHERE chat_id = ?", (chat_id,))
            db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    def import_chat(self, chat: StoredChat) -> StoredChat:
        """A copy of ``chat`` under a new id; ``updated`` is now, so it is listed first."""
        chat_id, settings = uuid.uuid4().hex, _dump(dict(chat.settings))
        rows = [_encode(message) for message in chat.messages]
        with self._write() as db:
            stamp = self._stamp()
            row = (chat_id, chat.title, chat.system, settings, chat.created or stamp, stamp, int(chat.named))
            db.execute(f"INSERT INTO chats ({_CHAT}) VALUES (?, ?, ?, ?, ?, ?, ?)", row)
            db.executemany(
                _INSERT_MESSAGE, [(chat_id, n, *m[:-1], m[-1] or stamp) for n, m in enumerate(rows)]
            )
        return self.load(chat_id)

    def get_pref(self, key: str, default: Any = None) -> Any:
        with self._lock:
            row = self._db.execute("SELECT value FROM prefs WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_pref(self, key: str, value: Any) -> None:
        encoded = json.dumps(value, ensure_ascii=False)  # not JSON-able: TypeError, nothing written
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO prefs (key, value) VALUES (?, ?)", (key, encoded))

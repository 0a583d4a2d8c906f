"""The chat store's records and tables. Each record is a dataclass whose fields are its
table's columns, written and read by name (``to_row``, ``from_row``), so a new field is
the field, one migration in ``MIGRATIONS`` and its test: no query lists columns by
position. A field's ``metadata`` says how it is kept: ``JSON`` text, a ``BOOL`` integer,
or ``NOT_A_COLUMN`` (a chat's messages live in their own table). Pure: no Gradio."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from edgespec.errors import EdgespecError

DEFAULT_ATTACHMENT_LIMIT = 32 * 1024 * 1024  # bytes per attached file, unless a pref says otherwise

JSON = {"column": "json"}
BOOL = {"column": "bool"}
NOT_A_COLUMN = {"column": None}


@dataclass
class StoredMessage:
    role: str  # "user" or "assistant"
    content: str
    stats: dict | None = field(default=None, metadata=JSON)  # the answer's figures (JSON-able)
    provenance: list[list[str]] | None = field(default=None, metadata=JSON)  # [text, source] runs
    steps: list[dict] | None = field(default=None, metadata=JSON)  # per-step records (JSON-able)
    settings: dict | None = field(default=None, metadata=JSON)  # the generation settings the answer used
    created: float = 0.0  # 0: stamped when stored
    # Files the message carries: {"sha256", "name", "size", "tokens" (int or None), "kind"};
    # the bytes and text are the store's attachment of that sha256, kept once however often sent.
    attachments: list[dict] | None = field(default=None, metadata=JSON)


@dataclass
class StoredChat:
    id: str
    title: str
    system: str
    settings: dict = field(metadata=JSON)
    created: float
    updated: float
    messages: list[StoredMessage] = field(default_factory=list, metadata=NOT_A_COLUMN)
    named: bool = field(default=False, metadata=BOOL)  # the user named it: the title no longer follows
    folder: str | None = None  # the folder's id, None: in no folder
    branched_from: str | None = None  # the chat it was branched from (shown only: it may be gone)


@dataclass
class ChatSummary:
    id: str
    title: str
    updated: float
    messages: int
    preview: str  # the latest message on one line, shortened
    folder: str | None = None


@dataclass
class StoredAttachment:
    sha256: str  # of ``data``: the row's key, so the same bytes are kept once
    size: int
    data: bytes  # the file as it came
    text: str  # what the model reads: the text extracted from it
    kind: str  # "text", "pdf", "markdown", "html", ...
    created: float = 0.0


@dataclass
class StoredVersion:
    """A file's version accepted in a chat after the attachments its messages carry."""

    name: str
    version: int  # orders a chat's versions of ``name``; the number shown is from ``files``
    sha256: str
    created: float = 0.0


@dataclass
class StoredFolder:
    id: str
    name: str
    system: str  # the system prompt a new chat in the folder starts with
    created: float


class ChatNotFound(EdgespecError):
    """No chat with that id: another tab may have deleted it."""


class FolderNotFound(EdgespecError):
    """No folder with that id: another tab may have deleted it."""


class AttachmentNotFound(EdgespecError):
    """No attachment with that sha256 (it was never stored, or no chat holds it any more)."""


Record = TypeVar("Record")


def _how(item: Any) -> str | None:
    return item.metadata.get("column", "plain")


def columns(cls: type) -> list[str]:
    """The record's columns, in its fields' order."""
    return [item.name for item in fields(cls) if _how(item) is not None]


def column_list(cls: type, prefix: str = "") -> str:
    return ", ".join(prefix + name for name in columns(cls))


def insert_sql(table: str, cls: type, *extra: str) -> str:
    """INSERT of one record (and ``extra`` columns first) with named parameters."""
    names = [*extra, *columns(cls)]
    return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(':' + n for n in names)})"


def to_row(record: Any) -> dict[str, Any]:
    """Column name -> SQL value; a JSON field that is not JSON-able raises TypeError."""
    row: dict[str, Any] = {}
    for item in fields(record):
        how, value = _how(item), getattr(record, item.name)
        if how == "json":
            row[item.name] = None if value is None else json.dumps(value, ensure_ascii=False)
        elif how == "bool":
            row[item.name] = int(bool(value))
        elif how is not None:
            row[item.name] = value
    return row


def from_row(cls: Callable[..., Record], row: sqlite3.Row, **extra: Any) -> Record:
    """The record from a row holding its columns by name; ``extra`` sets the other fields."""
    values: dict[str, Any] = {}
    for item in fields(cls):  # type: ignore[arg-type]
        how = _how(item)
        if how is None:
            continue
        value = row[item.name]
        if how == "json":
            value = None if value is None else json.loads(value)
        elif how == "bool":
            value = bool(value)
        values[item.name] = value
    return cls(**values, **extra)


def format_size(size: int) -> str:
    """Bytes as a person reads them: the one way the app writes a size (``files.human_size``)."""
    from edgespec.ui.files import human_size

    return human_size(size)


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


def _attachments_folders_branches(db: sqlite3.Connection) -> None:
    """Version 2: attached files kept once by hash, their versions, folders, branches."""
    for statement in (
        "CREATE TABLE attachments (sha256 TEXT PRIMARY KEY, size INTEGER NOT NULL, data BLOB NOT NULL,"
        " text TEXT NOT NULL, kind TEXT NOT NULL, created REAL NOT NULL)",
        "ALTER TABLE messages ADD COLUMN attachments TEXT",
        # Which message holds which attachment, kept beside the messages' JSON: the collection
        # of unreferenced files asks it by hash instead of parsing every message.
        "CREATE TABLE attachment_refs (chat_id TEXT NOT NULL, position INTEGER NOT NULL,"
        " sha256 TEXT NOT NULL, PRIMARY KEY (chat_id, position, sha256)) WITHOUT ROWID",
        "CREATE INDEX attachment_refs_by_sha256 ON attachment_refs (sha256)",
        "CREATE TABLE file_versions (chat_id TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,"
        " sha256 TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (chat_id, name, version)) WITHOUT ROWID",
        "CREATE INDEX file_versions_by_sha256 ON file_versions (sha256)",
        "CREATE TABLE folders (id TEXT PRIMARY KEY, name TEXT NOT NULL, system TEXT NOT NULL,"
        " created REAL NOT NULL)",
        "ALTER TABLE chats ADD COLUMN folder TEXT",
        "ALTER TABLE chats ADD COLUMN branched_from TEXT",
        "CREATE INDEX chats_by_folder ON chats (folder)",
    ):
        db.execute(statement)


# MIGRATIONS[n] takes a store from version n to n + 1 (0: a new, empty file): version 3 is
# one more function here. Each runs in one transaction with the version it reaches.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_create_v1, _attachments_folders_branches]

# The tables a store of each version must hold (those of earlier versions too).
TABLES_SINCE = {
    1: {"chats", "messages", "prefs"},
    2: {"attachments", "attachment_refs", "file_versions", "folders"},
}


def tables_at(version: int) -> set[str]:
    return set().union(*(tables for since, tables in TABLES_SINCE.items() if since <= max(version, 1)))

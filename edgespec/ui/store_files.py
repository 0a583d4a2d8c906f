"""Files in chats: attachments kept once by the sha256 of their bytes, the versions of a
file a chat accepted after the one its messages carry, and the collection of attachments
that no message and no version holds any more."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from edgespec.errors import EdgespecError
from edgespec.ui.store_core import SHA256, StoreCore
from edgespec.ui.store_schema import (
    DEFAULT_ATTACHMENT_LIMIT,
    AttachmentNotFound,
    StoredAttachment,
    StoredMessage,
    StoredVersion,
    column_list,
    format_size,
    from_row,
    insert_sql,
    to_row,
)

LIMIT_PREF = "attachment_limit"  # a pref that, when set, overrides the limit the store opened with
_INSERT_ATTACHMENT = insert_sql("attachments", StoredAttachment).replace("INSERT", "INSERT OR IGNORE", 1)
_INSERT_VERSION = insert_sql("file_versions", StoredVersion, "chat_id")
_INSERT_MESSAGE = insert_sql("messages", StoredMessage, "chat_id", "position")
# Collected attachments this process still remembers (see ``StoreFiles``): a few, and a
# bounded number of bytes, since each may be as large as the limit.
_REMEMBERED = 16
_REMEMBERED_BYTES = 64 * 1024 * 1024


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise ValueError(f"an attachment limit must be a positive number of bytes, not {limit!r}")
    return limit


def oversize(size: int, limit: int) -> str | None:
    """Why a file of ``size`` bytes cannot be attached, or None."""
    if size <= limit:
        return None
    # Exact bytes too: 32 MiB and one byte reads the same as the limit once rounded.
    return (
        f"it is {format_size(size)} ({size:,} bytes), over the limit of"
        f" {format_size(limit)} ({limit:,} bytes) per file"
    )


def checked_attachment(attachment: StoredAttachment, limit: int) -> StoredAttachment:
    """``attachment`` if its size and sha256 are its data's and it fits ``limit``."""
    data = bytes(attachment.data)
    problem = oversize(len(data), limit)
    if problem is not None:
        raise EdgespecError(f"Cannot keep the attached file: {problem}.")
    if hashlib.sha256(data).hexdigest() != attachment.sha256 or attachment.size != len(data):
        raise ValueError(f"attachment {attachment.sha256:.12}… does not match its data")
    return StoredAttachment(
        attachment.sha256, len(data), data, attachment.text, attachment.kind, attachment.created
    )


class StoreFiles(StoreCore):
    """Attachments and file versions. Collection is immediate (``delete``, ``truncate``),
    but the store remembers the last few files it collected: an edited message resent
    after ``truncate`` removed the only one holding its file, or a file put by one tab
    while another deleted the last chat holding the same bytes, finds it again."""

    def __init__(
        self,
        db: sqlite3.Connection,
        path: Path,
        notice: str | None = None,
        attachment_limit: int = DEFAULT_ATTACHMENT_LIMIT,
    ):
        super().__init__(db, path, notice, attachment_limit)
        self._remembered: OrderedDict[str, StoredAttachment] = OrderedDict()

    @property
    def attachment_limit(self) -> int:
        """Bytes per attached file: the "attachment_limit" pref, else the limit opened with."""
        pref = self.get_pref(LIMIT_PREF)
        try:
            return check_limit(pref)
        except ValueError:  # unset, or a value no limit can be: the store's own
            return self._attachment_limit

    def set_attachment_limit(self, limit: int) -> None:
        """Keep ``limit`` as the store's pref (files kept already stay)."""
        self.set_pref(LIMIT_PREF, check_limit(limit))

    def put_attachment(self, data: bytes, text: str, kind: str) -> str:
        """Keep a file (its bytes, the text the model reads, its kind); its sha256. The same
        bytes are kept once: a second put changes nothing, the first text and kind stay."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"an attachment's data must be bytes, not {type(data).__name__}")
        if not isinstance(text, str) or not isinstance(kind, str):
            raise TypeError("an attachment's text and kind must be strings")
        blob = bytes(data)
        problem = oversize(len(blob), self.attachment_limit)
        if problem is not None:
            raise EdgespecError(f"Cannot attach the file: {problem}.")
        sha256 = hashlib.sha256(blob).hexdigest()
        with self._write() as db:
            db.execute(
                _INSERT_ATTACHMENT,
                to_row(StoredAttachment(sha256, len(blob), blob, text, kind, self._stamp())),
            )
        return sha256

    def attachment(self, sha256: str) -> StoredAttachment:
        with self._read() as db:
            row = db.execute(
                f"SELECT {column_list(StoredAttachment)} FROM attachments WHERE sha256 = ?", (sha256,)
            ).fetchone()
        if row is None:
            raise AttachmentNotFound(f"There is no attached file {sha256:.12}… in the chat store.")
        return from_row(StoredAttachment, row)

    def files(self, chat_id: str) -> dict[str, list[str]]:
        """Each file name in the chat -> its versions' sha256s, oldest first: those its
        messages carry, in order, then those accepted (``add_version``); a version the same
        as the one before is not a new one."""
        with self._read() as db:
            self._chat(db, chat_id)
            return self._files(db, chat_id)

    def versions(self, chat_id: str) -> list[StoredVersion]:
        """The versions accepted in the chat, in the order they were."""
        with self._read() as db:
            self._chat(db, chat_id)
            return self._versions(db, chat_id)

    def add_version(self, chat_id: str, name: str, sha256: str) -> int:
        """Accept ``sha256`` (kept already) as file ``name``'s next version in the chat; its
        number, the place it has in ``files(chat_id)[name]`` from 1. The same as the
        latest version adds nothing and gives the latest's number."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a file version needs a name, not {name!r}")
        with self._write() as db:
            self._chat(db, chat_id)
            self._require(db, sha256, name)
            shown = self._files(db, chat_id).get(name, [])
            if shown and shown[-1] == sha256:
                return len(shown)
            after = "SELECT COALESCE(MAX(version), 0) + 1 FROM file_versions WHERE chat_id = ? AND name = ?"
            version = db.execute(after, (chat_id, name)).fetchone()[0]
            row = to_row(StoredVersion(name, version, sha256, self._stamp()))
            db.execute(_INSERT_VERSION, {**row, "chat_id": chat_id})
            self._touch(db, chat_id)
        return len(shown) + 1

    def _files(self, db: sqlite3.Connection, chat_id: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}

        def add(name: str, sha256: str) -> None:
            shas = found.setdefault(name, [])
            if not shas or shas[-1] != sha256:
                shas.append(sha256)

        carried = (
            "SELECT attachments FROM messages WHERE chat_id = ? AND attachments IS NOT NULL ORDER BY position"
        )
        for row in db.execute(carried, (chat_id,)):
            for ref in json.loads(row["attachments"]):
                add(ref["name"], ref["sha256"])
        for version in sorted(self._versions(db, chat_id), key=lambda v: v.version):
            add(version.name, version.sha256)
        return found

    def _versions(self, db: sqlite3.Connection, chat_id: str) -> list[StoredVersion]:
        query = f"SELECT {column_list(StoredVersion)} FROM file_versions WHERE chat_id = ?"
        query += " ORDER BY created, version"
        return [from_row(StoredVersion, row) for row in db.execute(query, (chat_id,))]

    def _keep_versions(self, db: sqlite3.Connection, chat_id: str, versions: Iterable[StoredVersion]) -> None:
        """Versions copied into a chat that has none, in their order, numbered afresh."""
        numbers: dict[str, int] = {}
        for version in versions:
            self._require(db, version.sha256, version.name)
            numbers[version.name] = numbers.get(version.name, 0) + 1
            row = to_row(
                StoredVersion(
                    version.name, numbers[version.name], version.sha256, version.created or self._stamp()
                )
            )
            db.execute(_INSERT_VERSION, {**row, "chat_id": chat_id})

    def _insert_messages(
        self, db: sqlite3.Connection, chat_id: str, first: int, rows: Sequence[dict[str, Any]], stamp: float
    ) -> None:
        """Messages encoded by ``encode_message``, at positions from ``first``; one without a
        time takes ``stamp``. Each file a message names must be in the store."""
        for position, row in enumerate(rows, first):
            db.execute(
                _INSERT_MESSAGE,
                {**row, "chat_id": chat_id, "position": position, "created": row["created"] or stamp},
            )
            for ref in json.loads(row["attachments"] or "[]"):
                self._require(db, ref["sha256"], ref["name"])
                db.execute(
                    "INSERT OR IGNORE INTO attachment_refs (chat_id, position, sha256) VALUES (?, ?, ?)",
                    (chat_id, position, ref["sha256"]),
                )

    def _keep_attachment(self, db: sqlite3.Connection, attachment: StoredAttachment) -> None:
        db.execute(_INSERT_ATTACHMENT, to_row(attachment))

    def _require(self, db: sqlite3.Connection, sha256: str, name: str) -> None:
        """The attachment ``sha256`` is in the store, brought back if collected lately."""
        if not (isinstance(sha256, str) and SHA256.fullmatch(sha256)):
            raise ValueError(f"an attachment's sha256 must be 64 lowercase hex digits, not {sha256!r}")
        if db.execute("SELECT 1 FROM attachments WHERE sha256 = ?", (sha256,)).fetchone() is not None:
            return
        remembered = self._remembered.pop(sha256, None)
        if remembered is None:
            raise AttachmentNotFound(
                f"The attached file {name} is no longer in the chat store: attach it again."
            )
        self._keep_attachment(db, remembered)

    def _collect(self, db: sqlite3.Connection, candidates: Iterable[str]) -> None:
        """Remove those of ``candidates`` that no message and no version holds any more."""
        unheld = """SELECT {columns} FROM attachments WHERE sha256 = :sha256
            AND NOT EXISTS (SELECT 1 FROM attachment_refs WHERE sha256 = :sha256)
            AND NOT EXISTS (SELECT 1 FROM file_versions WHERE sha256 = :sha256)"""
        remembered = self._remembered
        for sha256 in sorted(set(candidates)):
            row = db.execute(
                unheld.format(columns=column_list(StoredAttachment)), {"sha256": sha256}
            ).fetchone()
            if row is None:
                continue
            db.execute("DELETE FROM attachments WHERE sha256 = ?", (sha256,))
            remembered[sha256] = from_row(StoredAttachment, row)
        while len(remembered) > _REMEMBERED or sum(a.size for a in remembered.values()) > _REMEMBERED_BYTES:
            remembered.popitem(last=False)

    def _drop_messages(
        self, db: sqlite3.Connection, chat_id: str, keep: int, also: Iterable[str] = ()
    ) -> None:
        """Delete the chat's messages from position ``keep`` on, and the files only they held
        (and only ``also``, released by the caller)."""
        where = "WHERE chat_id = ? AND position >= ?"
        held = {
            row["sha256"]
            for row in db.execute(f"SELECT sha256 FROM attachment_refs {where}", (chat_id, keep))
        }
        db.execute(f"DELETE FROM attachment_refs {where}", (chat_id, keep))
        db.execute(f"DELETE FROM messages {where}", (chat_id, keep))
        self._collect(db, held | set(also))

    def _delete_chat(self, db: sqlite3.Connection, chat_id: str) -> None:
        """The chat, its messages and versions, and the files only they held."""
        versioned = {
            row["sha256"]
            for row in db.execute("SELECT sha256 FROM file_versions WHERE chat_id = ?", (chat_id,))
        }
        db.execute("DELETE FROM file_versions WHERE chat_id = ?", (chat_id,))
        self._drop_messages(db, chat_id, 0, also=versioned)
        db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

"""The chat store's files, folders and branches: attachments kept once by hash and
collected when nothing holds them, file versions, folders, branches, the migration of a
version 1 store, and exports that carry all of it (and are refused when tampered with)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path

import pytest

from edgespec.errors import EdgespecError
from edgespec.ui.chat_store import (
    ANY,
    APPLICATION_ID,
    DEFAULT_ATTACHMENT_LIMIT,
    SCHEMA_VERSION,
    STORE_NAME,
    AttachmentNotFound,
    ChatNotFound,
    ChatStore,
    FolderNotFound,
    StoredAttachment,
    StoredChat,
    StoredFolder,
    StoredMessage,
    StoredVersion,
)
from edgespec.ui.store_schema import NOT_A_COLUMN, columns

REPORT = b"# Report\n\nQuarterly figures: 1, 2, 3.\n"
NOTES = "Notes ✓ ünïcode\n".encode()
PDF = b"%PDF-1.4\n" + bytes(range(256)) * 4  # not text: bytes of every value


@pytest.fixture
def store(tmp_path):
    fresh = ChatStore.open(tmp_path / "store")
    yield fresh
    fresh.close()


@pytest.fixture
def other(tmp_path):
    fresh = ChatStore.open(tmp_path / "other")
    yield fresh
    fresh.close()


@contextmanager
def opened(directory: Path, **options: int) -> Iterator[ChatStore]:
    store = ChatStore.open(directory, **options)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def raw_db(path: Path) -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(path)
    try:
        yield db
        db.commit()
    finally:
        db.close()


def count(store: ChatStore, table: str) -> int:
    with raw_db(store.path) as db:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ref(data: bytes, name: str, kind: str = "text", tokens: int | None = 12) -> dict:
    return {"sha256": sha(data), "name": name, "size": len(data), "tokens": tokens, "kind": kind}


def one_line_error(caught: pytest.ExceptionInfo) -> str:
    message = str(caught.value)
    assert message and "\n" not in message
    return message


# -- attachments -----------------------------------------------------------------------


def test_an_attachment_comes_back_as_put_and_after_reopening(store):
    before = time.time()
    key = store.put_attachment(PDF, "extracted text ✓", "pdf")
    assert key == sha(PDF)
    stored = store.attachment(key)
    assert (stored.sha256, stored.size, stored.data, stored.text, stored.kind) == (
        key,
        len(PDF),
        PDF,
        "extracted text ✓",
        "pdf",
    )
    assert before <= stored.created <= time.time() + 1
    store.close()
    with opened(store.path.parent) as again:
        assert again.attachment(key) == stored


def test_the_same_bytes_are_kept_once_however_often_attached(store):
    first = store.put_attachment(REPORT, "first text", "markdown")
    assert store.put_attachment(bytearray(REPORT), "second text", "text") == first
    chats = [store.create(), store.create()]
    for chat in chats:
        store.append(chat.id, StoredMessage("user", "see attached", attachments=[ref(REPORT, "report.md")]))
        store.append(chat.id, StoredMessage("user", "again", attachments=[ref(REPORT, "copy.md")]))
    assert count(store, "attachments") == 1
    assert (store.attachment(first).text, store.attachment(first).kind) == ("first text", "markdown")
    store.put_attachment(NOTES, "notes", "text")
    assert count(store, "attachments") == 2


def test_a_missing_attachment_is_one_edgespec_error(store):
    with pytest.raises(AttachmentNotFound) as caught:
        store.attachment("0" * 64)
    assert "0" * 12 in one_line_error(caught) and isinstance(caught.value, EdgespecError)


def test_a_file_over_the_limit_is_refused_and_nothing_written(tmp_path):
    with opened(tmp_path, attachment_limit=100) as store:
        assert store.attachment_limit == 100
        with pytest.raises(EdgespecError) as caught:
            store.put_attachment(b"x" * 101, "x", "text")
        message = one_line_error(caught)
        assert "101 bytes" in message and "100 bytes" in message
        assert count(store, "attachments") == 0
        store.put_attachment(b"x" * 100, "x", "text")  # at the limit: kept
        assert count(store, "attachments") == 1
        store.set_attachment_limit(1000)  # kept as a pref: it outlives this store object
        store.put_attachment(b"y" * 101, "y", "text")
    with opened(tmp_path, attachment_limit=50) as store:
        assert store.attachment_limit == 1000 and store.get_pref("attachment_limit") == 1000
        store.set_pref("attachment_limit", "junk")  # no limit: the one opened with
        assert store.attachment_limit == 50
        for bad in (0, -1, True, 1.5, None):
            with pytest.raises(ValueError):
                store.set_attachment_limit(bad)
    with pytest.raises(ValueError):
        ChatStore.open(tmp_path, attachment_limit=0)
    assert DEFAULT_ATTACHMENT_LIMIT == 32 * 1024 * 1024


def test_messages_carry_their_files_by_reference(store):
    for data, text in ((REPORT, "report"), (PDF, "pdf text")):
        store.put_attachment(data, text, "text")
    chat = store.create()
    message = StoredMessage(
        "user", "two files", attachments=[ref(REPORT, "report.md"), ref(PDF, "a.pdf", "pdf", None)]
    )
    store.append(chat.id, message)
    store.append(chat.id, StoredMessage("assistant", "read them", stats={"tokens": 3}))
    loaded = store.load(chat.id)
    assert loaded.messages[0] == replace(message, created=loaded.messages[0].created)
    assert loaded.messages[1].attachments is None
    store.close()
    with opened(store.path.parent) as again:
        assert again.load(chat.id) == loaded


def test_a_message_naming_a_file_not_kept_writes_nothing(store):
    chat = store.create()
    with pytest.raises(AttachmentNotFound) as caught:
        store.append(chat.id, StoredMessage("user", "x", attachments=[ref(REPORT, "report.md")]))
    assert "report.md" in one_line_error(caught)
    store.put_attachment(REPORT, "r", "text")
    bad_refs = [
        [{**ref(REPORT, "report.md"), "sha256": "ABC"}],
        [{**ref(REPORT, "report.md"), "name": ""}],
        [{**ref(REPORT, "report.md"), "size": "12"}],
        [{**ref(REPORT, "report.md"), "tokens": 1.5}],
        ["report.md"],
    ]
    for refs in bad_refs:
        with pytest.raises(ValueError):
            store.append(chat.id, StoredMessage("user", "x", attachments=refs))
    assert store.load(chat.id).messages == [] and count(store, "attachment_refs") == 0


def test_delete_collects_the_files_no_other_chat_holds(store):
    for data in (REPORT, NOTES, PDF):
        store.put_attachment(data, "t", "text")
    shared, alone = store.create(), store.create()
    store.append(
        shared.id, StoredMessage("user", "a", attachments=[ref(REPORT, "r.md"), ref(NOTES, "n.txt")])
    )
    store.append(alone.id, StoredMessage("user", "b", attachments=[ref(REPORT, "r.md")]))
    store.add_version(alone.id, "r.md", sha(PDF))  # held by a version only
    store.delete(shared.id)
    assert count(store, "attachments") == 2
    with pytest.raises(AttachmentNotFound):
        store.attachment(sha(NOTES))
    assert store.attachment(sha(REPORT)).data == REPORT and store.attachment(sha(PDF)).data == PDF
    store.delete(alone.id)
    assert count(store, "attachments") == 0 and count(store, "attachment_refs") == 0
    assert count(store, "file_versions") == 0


def test_truncate_collects_the_files_only_the_removed_messages_held(store):
    for data in (REPORT, NOTES):
        store.put_attachment(data, "t", "text")
    chat = store.create()
    store.append(chat.id, StoredMessage("user", "0", attachments=[ref(REPORT, "r.md")]))
    store.append(chat.id, StoredMessage("assistant", "1"))
    store.append(chat.id, StoredMessage("user", "2", attachments=[ref(NOTES, "n.txt")]))
    store.append(chat.id, StoredMessage("user", "3", attachments=[ref(REPORT, "r.md")]))
    store.truncate(chat.id, 2)
    assert [m.content for m in store.load(chat.id).messages] == ["0", "1"]
    assert count(store, "attachments") == 1 and store.attachment(sha(REPORT)).data == REPORT
    store.truncate(chat.id, 0)
    assert count(store, "attachments") == 0


def test_an_edited_message_resent_after_truncate_finds_its_file_again(store):
    store.put_attachment(REPORT, "report text", "markdown")
    chat = store.create()
    store.append(chat.id, StoredMessage("user", "summarise", attachments=[ref(REPORT, "r.md")]))
    store.truncate(chat.id, 0)  # edit and resend: the only message holding the file goes
    assert count(store, "attachments") == 0
    store.append(chat.id, StoredMessage("user", "summarise briefly", attachments=[ref(REPORT, "r.md")]))
    assert count(store, "attachments") == 1
    assert (store.attachment(sha(REPORT)).data, store.attachment(sha(REPORT)).text) == (REPORT, "report text")


# -- file versions ---------------------------------------------------------------------


def test_file_versions_follow_the_messages_then_the_accepted_edits(store):
    v1, v2, v3 = b"def f(): pass\n", b"def f():\n    return 1\n", b"def f():\n    return 2\n"
    for data in (v1, v2, v3, NOTES):
        store.put_attachment(data, data.decode(), "text")
    chat = store.create()
    store.append(chat.id, StoredMessage("user", "fix", attachments=[ref(v1, "f.py"), ref(NOTES, "n.txt")]))
    store.append(chat.id, StoredMessage("user", "again", attachments=[ref(v1, "f.py")]))  # not a new version
    assert store.files(chat.id) == {"f.py": [sha(v1)], "n.txt": [sha(NOTES)]}
    assert store.add_version(chat.id, "f.py", sha(v2)) == 2
    assert store.add_version(chat.id, "f.py", sha(v2)) == 2  # the same again: nothing new
    assert store.add_version(chat.id, "f.py", sha(v3)) == 3
    assert store.add_version(chat.id, "new.py", sha(v1)) == 1  # a file no message carried
    assert store.files(chat.id) == {
        "f.py": [sha(v1), sha(v2), sha(v3)],
        "n.txt": [sha(NOTES)],
        "new.py": [sha(v1)],
    }
    accepted = [(v.name, v.sha256) for v in store.versions(chat.id)]
    assert accepted == [("f.py", sha(v2)), ("f.py", sha(v3)), ("new.py", sha(v1))]  # as accepted
    assert count(store, "file_versions") == 3
    with pytest.raises(AttachmentNotFound):
        store.add_version(chat.id, "f.py", "f" * 64)
    with pytest.raises(ChatNotFound):
        store.add_version("nope", "f.py", sha(v2))
    with pytest.raises(ChatNotFound):
        store.files("nope")
    store.truncate(chat.id, 0)  # the versions still hold their files
    assert store.files(chat.id) == {"f.py": [sha(v2), sha(v3)], "new.py": [sha(v1)]}
    for data in (v1, v2, v3):
        assert store.attachment(sha(data)).data == data
    with pytest.raises(AttachmentNotFound):
        store.attachment(sha(NOTES))


# -- folders ---------------------------------------------------------------------------


def test_folders_are_kept_sorted_by_name_ignoring_case(store):
    made = [
        store.create_folder(name, system)
        for name, system in (("beta", ""), ("Alpha", "Be terse."), ("gamma", ""))
    ]
    assert all(isinstance(f, StoredFolder) and f.id for f in made) and len({f.id for f in made}) == 3
    assert [f.name for f in store.folders()] == ["Alpha", "beta", "gamma"]
    store.rename_folder(made[0].id, "  Zeta   work ")
    store.set_folder_system(made[2].id, "Réponds en français.")
    store.rename_folder(made[1].id, "ALPHA")  # its own name in other case: allowed
    store.close()
    with opened(store.path.parent) as again:
        folders = again.folders()
        assert [(f.name, f.system) for f in folders] == [
            ("ALPHA", "Be terse."),
            ("gamma", "Réponds en français."),
            ("Zeta work", ""),
        ]
        assert again.folder(made[2].id) == folders[1]


def test_a_folder_needs_a_name_of_its_own(store):
    work = store.create_folder("Work")
    for name in ("", "   ", "work", " WORK "):
        with pytest.raises(EdgespecError) as caught:
            store.create_folder(name)
        one_line_error(caught)
    home = store.create_folder("Home")
    with pytest.raises(EdgespecError, match="already a folder named Work"):
        store.rename_folder(home.id, "wORK")
    assert [f.name for f in store.folders()] == ["Home", "Work"]
    for call in (
        lambda: store.rename_folder("nope", "x"),
        lambda: store.set_folder_system("nope", "x"),
        lambda: store.move_chat(store.create().id, "nope"),
        lambda: store.create(folder="nope"),
        lambda: store.folder("nope"),
    ):
        with pytest.raises(FolderNotFound):
            call()
    with pytest.raises(ChatNotFound):
        store.move_chat("nope", work.id)


def test_a_new_chat_in_a_folder_takes_its_system_prompt(store):
    work = store.create_folder("Work", "You are a lawyer.")
    assert store.create(folder=work.id).system == "You are a lawyer."
    assert store.create(system="", folder=work.id).system == ""
    assert store.create(system="Own prompt", folder=work.id).system == "Own prompt"
    assert store.create().system == ""
    chat = store.create(folder=work.id)
    assert (chat.folder, store.load(chat.id).folder, store.load(chat.id).branched_from) == (
        work.id,
        work.id,
        None,
    )


def test_a_folder_holding_chats_is_deleted_only_with_them(store):
    store.put_attachment(REPORT, "r", "text")
    work, empty = store.create_folder("Work"), store.create_folder("Empty")
    held = [store.create(folder=work.id) for _ in range(2)]
    outside = store.create()
    store.append(held[0].id, StoredMessage("user", "x", attachments=[ref(REPORT, "r.md")]))
    with pytest.raises(EdgespecError, match="Work holds 2 chats") as caught:
        store.delete_folder(work.id)
    one_line_error(caught)
    assert {f.id for f in store.folders()} == {work.id, empty.id}
    assert {s.id for s in store.summaries(folder=work.id)} == {c.id for c in held}
    store.delete_folder(empty.id)
    store.delete_folder(empty.id)  # twice (two tabs): nothing happens
    store.delete_folder(work.id, with_chats=True)
    assert [f.id for f in store.folders()] == [] and [s.id for s in store.summaries()] == [outside.id]
    assert count(store, "attachments") == 0 and count(store, "messages") == 0
    moved_out = store.create_folder("Again")
    chat = store.create(folder=moved_out.id)
    store.move_chat(chat.id, None)
    store.delete_folder(moved_out.id)
    assert store.load(chat.id).folder is None


def test_search_within_a_folder_or_everywhere(store):
    work, home = store.create_folder("Work"), store.create_folder("Home")
    placed = {"work": work.id, "home": home.id, "none": None}
    ids = {}
    for where, folder in placed.items():
        ids[where] = store.create(folder=folder).id
        store.append(ids[where], StoredMessage("user", f"the needle, in {where}"))
        ids[f"{where}-other"] = store.create(folder=folder).id
        store.append(ids[f"{where}-other"], StoredMessage("user", "hay only"))

    def found(query: str, folder) -> set[str]:
        return {s.id for s in store.summaries(query, folder=folder)}

    assert found("needle", ANY) == {ids["work"], ids["home"], ids["none"]} == found("NEEDLE", ANY)
    assert {s.id for s in store.summaries("needle")} == found("needle", ANY)
    assert found("needle", work.id) == {ids["work"]}
    assert found("needle", None) == {ids["none"]}
    assert found("", home.id) == {ids["home"], ids["home-other"]}
    assert found("", None) == {ids["none"], ids["none-other"]}
    assert len(found("", ANY)) == 6 and found("needle", "no-such-folder") == set()
    assert {s.id: s.folder for s in store.summaries(folder=work.id)} == {
        ids["work"]: work.id,
        ids["work-other"]: work.id,
    }


def test_moving_a_chat_files_it_without_reordering_the_list(store):
    work = store.create_folder("Work")
    older, newer = store.create(), store.create()
    store.move_chat(older.id, work.id)
    assert [s.id for s in store.summaries()] == [newer.id, older.id]
    assert [s.id for s in store.summaries(folder=work.id)] == [older.id]
    assert store.load(older.id).folder == work.id
    store.move_chat(older.id, None)
    assert store.summaries(folder=work.id) == [] and store.load(older.id).folder is None


# -- branches --------------------------------------------------------------------------


def branch_fixture(store: ChatStore) -> StoredChat:
    """A chat in a folder, five messages (files on two), a version accepted after the second."""
    for data in (REPORT, NOTES, PDF):
        store.put_attachment(data, "t", "text")
    folder = store.create_folder("Work", "Be exact.")
    chat = store.create(settings={"temperature": 0.2}, title="Plan", folder=folder.id)
    now = time.time()
    texts = [
        ("user", "q0", [ref(REPORT, "r.md")]),
        ("assistant", "a0", None),
        ("user", "q1", [ref(NOTES, "n.txt")]),
    ]
    for n, (role, text, refs) in enumerate(texts):
        store.append(
            chat.id, StoredMessage(role, text, stats={"n": n}, created=now - 30 + n, attachments=refs)
        )
    store.add_version(chat.id, "r.md", sha(PDF))  # stamped now: after q1, before a1
    store.append(chat.id, StoredMessage("assistant", "a1", provenance=[["a1", "draft"]], created=now + 30))
    store.append(chat.id, StoredMessage("user", "q2", created=now + 31))
    return store.load(chat.id)


def test_a_branch_copies_exactly_the_messages_up_to_the_one_chosen(store):
    original = branch_fixture(store)
    branch = store.branch(original.id, 2)
    assert branch.messages == original.messages[:3]
    assert branch.id != original.id and store.load(branch.id) == branch
    assert (branch.title, branch.named, branch.branched_from) == ("Plan (branch)", True, original.id)
    assert (branch.system, branch.settings, branch.folder) == (
        original.system,
        original.settings,
        original.folder,
    )
    assert store.summaries()[0].id == branch.id
    assert store.load(original.id) == original  # untouched
    assert store.files(branch.id) == {"r.md": [sha(REPORT), sha(PDF)], "n.txt": [sha(NOTES)]}
    early = store.branch(original.id, 1)  # before the version was accepted: not in it
    assert early.messages == original.messages[:2] and store.files(early.id) == {"r.md": [sha(REPORT)]}
    whole = store.branch(original.id, 4)
    assert whole.messages == original.messages
    store.delete(original.id)  # the branches still hold their files
    assert store.attachment(sha(NOTES)).data == NOTES and store.attachment(sha(PDF)).data == PDF
    assert store.load(branch.id).branched_from == original.id  # shown only: it may be gone


@pytest.mark.parametrize("upto", [5, -1, True, 2.0])
def test_a_branch_outside_the_chat_is_refused(store, upto):
    original = branch_fixture(store)
    chats = count(store, "chats")
    with pytest.raises(EdgespecError, match="Cannot branch") as caught:
        store.branch(original.id, upto)
    one_line_error(caught)
    assert count(store, "chats") == chats
    with pytest.raises(ChatNotFound):
        store.branch("nope", 0)


def test_an_empty_chat_has_nothing_to_branch(store):
    with pytest.raises(EdgespecError, match="no messages"):
        store.branch(store.create().id, 0)


# -- migration -------------------------------------------------------------------------

V1_DDL = (  # the version 1 schema, as edgespec wrote it before version 2
    "CREATE TABLE chats (id TEXT PRIMARY KEY, title TEXT NOT NULL, system TEXT NOT NULL, settings"
    " TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, named INTEGER NOT NULL)",
    "CREATE INDEX chats_by_updated ON chats (updated)",
    "CREATE TABLE messages (chat_id TEXT NOT NULL, position INTEGER NOT NULL, role TEXT NOT NULL,"
    " content TEXT NOT NULL, stats TEXT, provenance TEXT, steps TEXT, settings TEXT,"
    " created REAL NOT NULL, PRIMARY KEY (chat_id, position)) WITHOUT ROWID",
    "CREATE TABLE prefs (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


HELLO = StoredMessage("user", "hello ünïcode", created=101.0)
HI = StoredMessage("assistant", "hi", {"tokens": 1}, [["hi", "draft"]], [{"gamma": 2}], {"top_k": 40}, 102.0)
EMPTY = StoredMessage("user", "", {}, [], [], {}, 301.0)  # empty values stay empty
V1_CHATS = [
    StoredChat("a" * 32, "First chat", "Be terse.", {"temperature": 0.5}, 100.0, 200.0, [HELLO, HI]),
    StoredChat("b" * 32, "Named", "", {}, 300.0, 400.0, [EMPTY], True),
]


def v1_store(directory: Path) -> None:
    """A version 1 store file holding ``V1_CHATS``, as the version 1 code left it."""
    directory.mkdir(parents=True, exist_ok=True)
    with raw_db(directory / STORE_NAME) as db:
        for statement in V1_DDL:
            db.execute(statement)
        for chat in V1_CHATS:
            row = (chat.id, chat.title, chat.system, json.dumps(chat.settings), chat.created, chat.updated)
            db.execute("INSERT INTO chats VALUES (?, ?, ?, ?, ?, ?, ?)", (*row, int(chat.named)))
            for n, m in enumerate(chat.messages):
                dumped = [
                    None if v is None else json.dumps(v) for v in (m.stats, m.provenance, m.steps, m.settings)
                ]
                row = (chat.id, n, m.role, m.content, *dumped, m.created)
                db.execute("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        db.execute("INSERT INTO prefs VALUES ('panels', '{\"stats\": true}')")
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.execute("PRAGMA user_version = 1")


def test_a_version_1_store_migrates_and_keeps_every_chat_and_message(tmp_path):
    v1_store(tmp_path)
    assert SCHEMA_VERSION == 2
    with opened(tmp_path) as store:
        assert store.notice is None
        for chat in V1_CHATS:
            assert store.load(chat.id) == chat  # folder, branch and attachments: none
        assert [(s.id, s.messages, s.folder) for s in store.summaries()] == [
            ("b" * 32, 1, None),
            ("a" * 32, 2, None),
        ]
        assert store.get_pref("panels") == {"stats": True}
        # What version 2 brings works on the migrated chats.
        store.put_attachment(REPORT, "r", "markdown")
        store.append("a" * 32, StoredMessage("user", "file", attachments=[ref(REPORT, "r.md")]))
        work = store.create_folder("Work")
        store.move_chat("b" * 32, work.id)
        branch = store.branch("a" * 32, 1)
        assert branch.messages == V1_CHATS[0].messages
    with raw_db(tmp_path / STORE_NAME) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (2,)
    with opened(tmp_path) as store:
        assert store.notice is None and store.load("b" * 32).folder == work.id
        assert store.files("a" * 32) == {"r.md": [sha(REPORT)]}


def test_every_record_field_is_a_column_of_its_table(store):
    tables = {
        StoredChat: "chats",
        StoredMessage: "messages",
        StoredAttachment: "attachments",
        StoredVersion: "file_versions",
        StoredFolder: "folders",
    }
    with raw_db(store.path) as db:
        for record, table in tables.items():
            on_disk = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            assert set(columns(record)) <= on_disk, record
            skipped = {f.name for f in fields(record) if f.metadata == NOT_A_COLUMN}
            assert set(columns(record)) | skipped == {f.name for f in fields(record)}


def test_stored_message_keeps_its_positional_fields_first():
    message = StoredMessage("assistant", "x", {"s": 1}, [["x", "plain"]], [{"g": 1}], {"t": 0}, 5.0)
    assert (message.created, message.attachments) == (5.0, None)
    assert [f.name for f in fields(StoredChat)][7:] == ["named", "folder", "branched_from"]

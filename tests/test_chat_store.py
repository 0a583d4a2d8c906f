"""The chat store on disk: every field back as written, order, search, edits, preferences,
a writer killed mid-loop, and files that are not ours set aside instead of crashing."""

from __future__ import annotations

import itertools
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edgespec.errors import EdgespecError
from edgespec.ui import chat_store
from edgespec.ui.chat_store import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    STORE_NAME,
    ChatNotFound,
    ChatStore,
    StoredChat,
    StoredMessage,
    default_data_dir,
)

REPO = Path(__file__).resolve().parent.parent
ASIDE = re.compile(r"^chats\.sqlite3\.set-aside-\d{8}T\d{6}Z(\.\d+)?$")

CODE = 'def f(x):\n    if x:\n\treturn "ünïcödé ✓"\n    return None\n'


@pytest.fixture
def store(tmp_path):
    fresh = ChatStore.open(tmp_path)
    yield fresh
    fresh.close()


@contextmanager
def opened(directory: Path) -> Iterator[ChatStore]:
    store = ChatStore.open(directory)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def raw_db(path: Path) -> Iterator[sqlite3.Connection]:
    """Another program's view of a file: plain sqlite3, committed and closed."""
    db = sqlite3.connect(path)
    try:
        yield db
        db.commit()
    finally:
        db.close()


def reopen(store: ChatStore) -> ChatStore:
    store.close()
    return ChatStore.open(store.path.parent)


def asides(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if ASIDE.match(p.name))


def full_messages() -> list[StoredMessage]:
    return [
        StoredMessage("user", "Write code:\n```python\n" + CODE + "```", created=1700000000.25),
        StoredMessage(
            "assistant",
            "Here 🙂:\n\n```python\n" + CODE + "```\n",
            stats={"tokens": 42, "tokens_per_second": 31.5, "tau": 2.25, "time_s": {"draft": 0.1}},
            provenance=[["Here ", "plain"], ["🙂", "draft"], [":\n", "target"], ["\n", "bonus"]],
            steps=[{"gamma": 4, "accepted": 3, "drafter": "draft"}, {"gamma": 0, "accepted": 0}],
            settings={"temperature": 0.0, "max_tokens": 256, "drafter": "auto"},
            created=1700000001.5,
        ),
        # Empty values stay empty, None stays None.
        StoredMessage("user", "", stats={}, provenance=[], steps=[], settings={}, created=1700000002.0),
        StoredMessage("assistant", "  leading and trailing  \n\n", created=1700000003.0),
    ]


def test_every_field_comes_back_as_written_and_after_reopening(store):
    settings = {"temperature": 0.7, "nested": {"stop": ["\n\n", "«end»"]}, "top_k": None}
    chat = store.create(system="Réponds en français.\n  Indented line", settings=settings)
    for message in full_messages():
        store.append(chat.id, message)
    expected = StoredChat(
        id=chat.id,
        title='Write code: ```python def f(x): if x: return "ünïcödé ✓" re…',  # 60 characters
        system="Réponds en français.\n  Indented line",
        settings=settings,
        created=chat.created,
        updated=store.load(chat.id).updated,
        messages=full_messages(),
        named=False,
    )
    assert len(expected.title) == 60
    assert store.load(chat.id) == expected
    loaded = store.load(chat.id)
    assert loaded.messages[2].stats == {} and loaded.messages[2].provenance == []
    assert loaded.messages[3].stats is None and loaded.messages[3].provenance is None
    assert loaded.messages[3].steps is None and loaded.messages[3].settings is None
    store = reopen(store)
    assert store.load(chat.id) == expected
    store.close()


def test_a_new_chat_and_a_message_without_a_time_are_stamped_now(store):
    before = time.time()
    chat = store.create()
    store.append(chat.id, StoredMessage("user", "hi"))
    after = time.time()
    loaded = store.load(chat.id)
    assert before <= chat.created <= loaded.messages[0].created <= loaded.updated <= after + 1
    assert (chat.title, chat.system, chat.settings, chat.messages, chat.named) == ("", "", {}, [], False)


def test_the_title_follows_the_first_user_message(store):
    chat = store.create()
    store.append(chat.id, StoredMessage("assistant", "Hello, how can I help?"))
    assert store.load(chat.id).title == ""
    store.append(chat.id, StoredMessage("user", "  What   is\n\n the\tweather?  "))
    store.append(chat.id, StoredMessage("user", "And tomorrow?"))
    assert store.load(chat.id).title == "What is the weather?"
    long = store.create()
    store.append(long.id, StoredMessage("user", "word " * 40))
    title = store.load(long.id).title
    assert len(title) == 60 and title.endswith("…") and title[:-1] == ("word " * 12).strip()


def test_newest_first_even_within_one_clock_tick(store, monkeypatch):
    # A clock that never moves: the order must still be the order of the writes.
    frozen = types.SimpleNamespace(time=lambda: 1_000_000.0, strftime=time.strftime, gmtime=time.gmtime)
    monkeypatch.setattr(chat_store, "time", frozen)
    ids = [store.create(title=f"chat {i}").id for i in range(20)]
    listed = store.summaries()
    assert [s.id for s in listed] == ids[::-1]
    assert all(a.updated > b.updated for a, b in itertools.pairwise(listed))
    store.append(ids[5], StoredMessage("user", "bump"))
    assert [s.id for s in store.summaries()][:2] == [ids[5], ids[19]]
    store.set_system(ids[0], "x")
    assert store.summaries()[0].id == ids[0]


def test_summaries_count_messages_and_preview_the_latest(store):
    chat = store.create()
    store.append(chat.id, StoredMessage("user", "first question"))
    store.append(chat.id, StoredMessage("assistant", "An answer\nover   two lines " + "z" * 200))
    (summary,) = store.summaries()
    assert (summary.id, summary.title, summary.messages) == (chat.id, "first question", 2)
    assert summary.preview == ("An answer over two lines " + "z" * 200)[:79] + "…"
    assert summary.updated == store.load(chat.id).updated


def test_rename_and_unrename(store):
    chat = store.create()
    store.append(chat.id, StoredMessage("user", "original question"))
    store.rename(chat.id, "  My\n chosen   name ")
    store.append(chat.id, StoredMessage("user", "another"))
    loaded = store.load(chat.id)
    assert (loaded.title, loaded.named) == ("My chosen name", True)
    store = reopen(store)
    assert (store.load(chat.id).title, store.load(chat.id).named) == ("My chosen name", True)
    store.rename(chat.id, "   ")
    assert (store.load(chat.id).title, store.load(chat.id).named) == ("original question", False)
    named = store.create(title="Given at birth")
    store.append(named.id, StoredMessage("user", "not the title"))
    assert (store.load(named.id).title, store.load(named.id).named) == ("Given at birth", True)
    store.close()


def test_delete_removes_the_chat_and_its_messages_only(store):
    gone, kept = store.create(), store.create()
    for chat in (gone, kept):
        store.append(chat.id, StoredMessage("user", f"in {chat.id}"))
    store.delete(gone.id)
    store.delete(gone.id)  # twice (two tabs): nothing happens
    assert [s.id for s in store.summaries()] == [kept.id]
    with pytest.raises(ChatNotFound):
        store.load(gone.id)
    assert [m.content for m in store.load(kept.id).messages] == [f"in {kept.id}"]
    with raw_db(store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM messages WHERE chat_id = ?", (gone.id,)).fetchone() == (0,)


def test_a_missing_chat_is_one_edgespec_error(store):
    calls = [
        lambda: store.load("nope"),
        lambda: store.append("nope", StoredMessage("user", "x")),
        lambda: store.truncate("nope", 0),
        lambda: store.rename("nope", "x"),
        lambda: store.set_system("nope", "x"),
        lambda: store.set_settings("nope", {}),
    ]
    for call in calls:
        with pytest.raises(EdgespecError, match="no chat nope") as caught:
            call()
        assert isinstance(caught.value, ChatNotFound) and "\n" not in str(caught.value)
    assert store.summaries() == []


def test_a_bad_message_writes_nothing(store):
    chat = store.create()
    with pytest.raises(ValueError, match="role"):
        store.append(chat.id, StoredMessage("system", "x"))
    with pytest.raises(TypeError):
        store.append(chat.id, StoredMessage("assistant", "x", stats={"when": object()}))
    assert store.load(chat.id).messages == []


def search_fixture(store: ChatStore) -> dict[str, str]:
    chats = {
        "title": store.create(title="Alpha Plan"),
        "system": store.create(system="You are a PIRATE captain"),
        "percent": store.create(),
        "underscore": store.create(),
        "unicode": store.create(),
        "plain": store.create(),
    }
    store.append(chats["percent"].id, StoredMessage("user", "I am 100% sure"))
    store.append(chats["underscore"].id, StoredMessage("user", "rename to snake_case please"))
    store.append(chats["unicode"].id, StoredMessage("user", "hello"))
    store.append(chats["unicode"].id, StoredMessage("assistant", "Die Straße, ÄRGER"))
    store.append(chats["plain"].id, StoredMessage("user", "100 percent sure, snake case"))
    return {name: chat.id for name, chat in chats.items()}


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("alpha plan", ["title"]),
        ("pirate", ["system"]),
        ("100%", ["percent"]),
        ("%", ["percent"]),
        ("_", ["underscore"]),
        ("e_c", ["underscore"]),
        ("strasse", ["unicode"]),  # casefold, not ASCII-only lowering
        ("ärger", ["unicode"]),
        ("SURE", ["percent", "plain"]),
        ("no such text", []),
    ],
)
def test_search_matches_titles_system_prompts_and_messages(store, query, found):
    ids = search_fixture(store)
    assert sorted(s.id for s in store.summaries(query)) == sorted(ids[name] for name in found)


def test_an_empty_query_lists_every_chat(store):
    ids = search_fixture(store)
    assert {s.id for s in store.summaries("")} == set(ids.values())


def test_truncate_keeps_the_first_messages(store):
    chat = store.create()
    texts = ["q1", "a1", "q2", "a2"]
    for i, text in enumerate(texts):
        store.append(chat.id, StoredMessage("user" if i % 2 == 0 else "assistant", text))
    store.truncate(chat.id, 10)
    assert [m.content for m in store.load(chat.id).messages] == texts
    store.truncate(chat.id, 3)  # regenerate the last answer
    store.append(chat.id, StoredMessage("assistant", "a2 again"))
    assert [m.content for m in store.load(chat.id).messages] == ["q1", "a1", "q2", "a2 again"]
    store.truncate(chat.id, 0)  # edit and resend the first message
    assert store.load(chat.id).title == "" and store.load(chat.id).messages == []
    store.append(chat.id, StoredMessage("user", "q1 edited"))
    assert store.load(chat.id).title == "q1 edited"
    store.rename(chat.id, "Kept")
    store.truncate(chat.id, 0)
    assert store.load(chat.id).title == "Kept"
    with pytest.raises(ValueError):
        store.truncate(chat.id, -1)


def test_system_and_settings_are_saved_and_bump_the_chat(store):
    older, chat = store.create(), store.create()
    store.set_system(older.id, "Be terse.")
    assert store.summaries()[0].id == older.id
    store.set_settings(chat.id, {"temperature": 1.2, "stop": ["###"]})
    store = reopen(store)
    assert store.load(older.id).system == "Be terse."
    assert store.load(chat.id).settings == {"temperature": 1.2, "stop": ["###"]}
    assert store.summaries()[0].id == chat.id
    store.close()


def test_preferences_are_json_values_kept_across_opens(store):
    assert store.get_pref("panels") is None and store.get_pref("panels", {"stats": True}) == {"stats": True}
    values = {
        "panels": {"stats": False, "steps": True},
        "system": "Sois bref ✓",
        "list": [1, 2.5, None],
        "b": False,
    }
    for key, value in values.items():
        store.set_pref(key, value)
    store.set_pref("system", "Be brief")
    store = reopen(store)
    assert {key: store.get_pref(key) for key in values} == {**values, "system": "Be brief"}
    store.set_pref("none", None)
    assert store.get_pref("none", "default") is None
    store.close()


def test_threads_writing_at_once_lose_nothing(store):
    chats = [store.create() for _ in range(4)]

    def write(chat_id: str) -> None:
        for i in range(25):
            store.append(chat_id, StoredMessage("user", f"{chat_id} {i}"))

    threads = [threading.Thread(target=write, args=(chat.id,)) for chat in chats]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for chat in chats:
        assert [m.content for m in store.load(chat.id).messages] == [f"{chat.id} {i}" for i in range(25)]


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from edgespec.ui.chat_store import ChatStore, StoredMessage

    store = ChatStore.open(Path(sys.argv[1]))
    chat = store.create(system="killed")
    print(chat.id, flush=True)
    i = 0
    while True:
        role = "user" if i % 2 == 0 else "assistant"
        store.append(chat.id, StoredMessage(role, f"message {i} " + "x" * 200_000, stats={"i": i}))
        print(i, flush=True)
        i += 1
    """
)


def test_a_writer_killed_mid_loop_keeps_every_finished_message(tmp_path):
    finished = 12
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        chat_id = child.stdout.readline().strip()
        for expected in range(finished):
            line = child.stdout.readline()
            assert line.strip() == str(expected), f"writer stopped: {child.stderr.read()}"
        child.send_signal(signal.SIGKILL)  # while it writes message `finished`
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    with opened(tmp_path) as store:
        assert store.notice is None
        messages = store.load(chat_id).messages
        assert len(messages) >= finished
        for i, message in enumerate(messages):
            assert message.content == f"message {i} " + "x" * 200_000 and message.stats == {"i": i}
        store.append(chat_id, StoredMessage("user", "after the kill"))
        assert store.load(chat_id).messages[-1].content == "after the kill"
        assert len(store.load(chat_id).messages) == len(messages) + 1


def assert_set_aside(directory: Path, store: ChatStore, reason: str, old_bytes: bytes | None = None) -> Path:
    """One set-aside file holding the old bytes, a one-line notice naming it, a fresh store."""
    (aside,) = asides(directory)
    assert store.notice is not None and "\n" not in store.notice
    assert reason in store.notice and aside.name in store.notice and str(directory) in store.notice
    if old_bytes is not None:
        assert aside.read_bytes() == old_bytes
    assert store.summaries() == []
    chat = store.create()
    store.append(chat.id, StoredMessage("user", "fresh"))
    store.close()
    with opened(directory) as again:
        assert again.notice is None and again.load(chat.id).messages[0].content == "fresh"
    return aside


def test_garbage_is_set_aside_and_a_fresh_store_started(tmp_path):
    garbage = b"this is not a database\x00\xff" * 300
    (tmp_path / STORE_NAME).write_bytes(garbage)
    (tmp_path / f"{STORE_NAME}-wal").write_bytes(b"stale wal")
    store = ChatStore.open(tmp_path)
    aside = assert_set_aside(tmp_path, store, "not a database", garbage)
    assert Path(f"{aside}-wal").read_bytes() == b"stale wal"


def test_a_second_set_aside_in_the_same_second_gets_a_number(tmp_path, monkeypatch):
    epoch = types.SimpleNamespace(time=time.time, strftime=time.strftime, gmtime=lambda: time.gmtime(0))
    monkeypatch.setattr(chat_store, "time", epoch)
    for garbage in (b"first garbage" * 100, b"second garbage" * 100):
        (tmp_path / STORE_NAME).unlink(missing_ok=True)
        for tail in ("-wal", "-shm"):
            (tmp_path / f"{STORE_NAME}{tail}").unlink(missing_ok=True)
        (tmp_path / STORE_NAME).write_bytes(garbage)
        ChatStore.open(tmp_path).close()
    names = [p.name for p in asides(tmp_path)]
    assert names == ["chats.sqlite3.set-aside-19700101T000000Z", "chats.sqlite3.set-aside-19700101T000000Z.1"]
    assert (tmp_path / names[1]).read_bytes() == b"second garbage" * 100


def test_a_newer_schema_is_set_aside(tmp_path):
    ChatStore.open(tmp_path).close()
    with raw_db(tmp_path / STORE_NAME) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    assert_set_aside(tmp_path, ChatStore.open(tmp_path), f"schema version {SCHEMA_VERSION + 1}")


def foreign(path: Path, application_id: int) -> None:
    with raw_db(path) as db:
        db.execute("CREATE TABLE users (name TEXT)")
        db.execute("INSERT INTO users VALUES ('someone else')")
        db.execute(f"PRAGMA application_id = {application_id}")


@pytest.mark.parametrize(
    ("application_id", "reason"), [(0x12345678, "another program"), (0, "another program's tables")]
)
def test_a_foreign_database_is_set_aside_untouched(tmp_path, application_id, reason):
    foreign(tmp_path / STORE_NAME, application_id)
    old = (tmp_path / STORE_NAME).read_bytes()
    aside = assert_set_aside(tmp_path, ChatStore.open(tmp_path), reason, old)
    with raw_db(aside) as db:
        assert db.execute("SELECT name FROM users").fetchall() == [("someone else",)]


@pytest.mark.parametrize("pages", [(2, 3), (3, 6)], ids=["found-by-quick-check", "malformed-on-read"])
def test_a_damaged_store_is_set_aside(tmp_path, pages):
    with opened(tmp_path) as store:
        chat = store.create()
        for i in range(200):
            store.append(chat.id, StoredMessage("user", f"{i} " + "y" * 500))
    path = tmp_path / STORE_NAME
    data = bytearray(path.read_bytes())
    page, (first, end) = 4096, pages
    assert len(data) > 6 * page
    data[first * page : end * page] = b"\x5a" * ((end - first) * page)  # the header page stays valid
    path.write_bytes(bytes(data))
    assert_set_aside(tmp_path, ChatStore.open(tmp_path), "damaged", bytes(data))


def test_an_empty_file_becomes_a_store(tmp_path):
    (tmp_path / STORE_NAME).write_bytes(b"")
    with opened(tmp_path) as store:
        assert store.notice is None and asides(tmp_path) == []
        store.create()
    with raw_db(tmp_path / STORE_NAME) as db:
        assert db.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


def test_a_folder_that_cannot_be_made_is_one_edgespec_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(EdgespecError, match=r"Cannot use the chat store .*a-file/chats") as caught:
        ChatStore.open(blocker / "chats")
    assert "\n" not in str(caught.value)


def test_a_later_version_migrates_an_older_store_and_keeps_its_chats(tmp_path, monkeypatch):
    with opened(tmp_path) as store:
        chat = store.create(system="kept")
        store.append(chat.id, StoredMessage("user", "still here"))

    def add_pinned(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")

    monkeypatch.setattr(chat_store, "MIGRATIONS", [*chat_store.MIGRATIONS, add_pinned])
    monkeypatch.setattr(chat_store, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with opened(tmp_path) as store:
        assert store.notice is None
        assert store.load(chat.id).messages[0].content == "still here"
    with raw_db(tmp_path / STORE_NAME) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION + 1,)
        assert db.execute("SELECT pinned FROM chats").fetchall() == [(0,)]


def test_a_failing_migration_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    with opened(tmp_path) as store:
        chat = store.create(system="kept")

    def broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half_done (x)")
        db.execute("ALTER TABLE no_such_table ADD COLUMN y")

    monkeypatch.setattr(chat_store, "MIGRATIONS", [*chat_store.MIGRATIONS, broken])
    monkeypatch.setattr(chat_store, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(EdgespecError, match="no_such_table"):
        ChatStore.open(tmp_path)
    assert asides(tmp_path) == []
    monkeypatch.undo()
    with opened(tmp_path) as store:
        assert store.notice is None and store.load(chat.id).system == "kept"
    with raw_db(tmp_path / STORE_NAME) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchall() == []


def test_the_data_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_DATA_DIR", str(tmp_path / "here"))
    assert default_data_dir() == tmp_path / "here"
    monkeypatch.delenv("EDGESPEC_DATA_DIR")
    assert default_data_dir().name == "edgespec"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the XDG rule is Linux's")
def test_without_platformdirs_the_data_dir_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGESPEC_DATA_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # importing it raises ImportError
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / "edgespec"
    monkeypatch.setenv("XDG_DATA_HOME", "")
    assert default_data_dir() == Path.home() / ".local" / "share" / "edgespec"

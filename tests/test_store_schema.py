"""A chat-store field added the way ARCHITECTURE.md says a newcomer adds one: the record's
field in ``ui/store_schema.py`` and one migration appended to ``MIGRATIONS`` there, nothing
else. The edit is made to the module's own source text, in a child process (so no other test
sees it), before the store's other modules import it; the store made by today's code then
opens, migrates, and keeps the new field by name in every path a message travels."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from edgespec.ui.chat_store import SCHEMA_VERSION, ChatStore, StoredMessage

FIELD_AFTER = "    attachments: list[dict] | None = field(default=None, metadata=JSON)\n"
MIGRATIONS_LINE = (
    "MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_create_v1, _attachments_folders_branches]"
)

NEWCOMER = textwrap.dedent(
    f"""
    import json, pathlib, sys
    import edgespec.ui.store_schema as schema

    source = pathlib.Path(schema.__file__).read_text()
    field_after, migrations = {FIELD_AFTER!r}, {MIGRATIONS_LINE!r}
    assert field_after in source and migrations in source, "the schema moved: update this test"
    source = source.replace(
        field_after, field_after + "    pinned: bool = field(default=False, metadata=BOOL)\\n"
    )
    source = source.replace(
        migrations,
        "def _pinned(db):\\n"
        "    db.execute('ALTER TABLE messages ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0')\\n\\n\\n"
        + migrations[:-1] + ", _pinned]",
    )
    exec(compile(source, schema.__file__, "exec"), schema.__dict__)

    from edgespec.ui.chat_store import SCHEMA_VERSION, ChatStore, StoredMessage

    store = ChatStore.open(pathlib.Path(sys.argv[1]))
    chat_id = sys.argv[2]
    old = store.load(chat_id).messages
    store.append(chat_id, StoredMessage("assistant", "kept", pinned=True))
    branch = store.branch(chat_id, 2)
    store.close()
    again = ChatStore.open(pathlib.Path(sys.argv[1]))
    messages = again.load(chat_id).messages
    print(json.dumps({{
        "version": SCHEMA_VERSION,
        "old": [[m.content, m.pinned] for m in old],
        "after": [[m.content, m.pinned] for m in messages],
        "branch": [[m.content, m.pinned] for m in again.load(branch.id).messages],
        "notice": again.notice,
    }}))
    again.close()
    """
)


def test_a_new_message_field_is_its_dataclass_field_and_one_migration(tmp_path):
    directory = tmp_path / "store"
    store = ChatStore.open(directory)
    chat = store.create(system="")
    store.append(chat.id, StoredMessage("user", "question"))
    store.append(chat.id, StoredMessage("assistant", "answer", stats={"tokens": 1}))
    store.close()
    ran = subprocess.run(
        [sys.executable, "-c", NEWCOMER, str(directory), chat.id], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen["version"] == SCHEMA_VERSION + 1
    assert seen["notice"] is None
    # The rows written before the field existed read back with its default ...
    assert seen["old"] == [["question", False], ["answer", False]]
    # ... and a message written with it keeps it across a reopening and a branch.
    assert seen["after"] == [["question", False], ["answer", False], ["kept", True]]
    assert seen["branch"] == seen["after"]  # a branch up to the new message copies it whole


def test_the_newcomer_test_fails_when_a_query_lists_columns_by_position(tmp_path):
    """The test above can fail: a store that writes messages by position (here, the same
    edit without its migration, so the column is missing) does not carry the field."""
    directory = tmp_path / "store"
    store = ChatStore.open(directory)
    chat = store.create(system="")
    store.close()
    broken = NEWCOMER.replace('+ migrations[:-1] + ", _pinned]"', "+ migrations")
    assert broken != NEWCOMER
    ran = subprocess.run(
        [sys.executable, "-c", broken, str(directory), chat.id], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode != 0 and "pinned" in ran.stderr

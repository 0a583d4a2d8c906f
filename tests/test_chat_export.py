"""A chat as Markdown and as JSON: everything in it, back whole through an import (its
files, versions and folder too), folders of chats as one bundle, and an import of anything
else refused with one line that says what is wrong, nothing written."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import pytest

from edgespec.errors import EdgespecError
from edgespec.ui.chat_export import (
    export_filename,
    folder_to_json,
    from_json,
    import_export,
    import_folder,
    read_export,
    to_json,
    to_markdown,
)
from edgespec.ui.chat_store import ChatStore, StoredChat, StoredMessage
from tests.test_store_files import NOTES, PDF, REPORT, count, one_line_error, opened, ref, sha

CODE = "```python\ndef f(x):\n    return {'ключ': x}  # 🙂\n```"


def sample() -> StoredChat:
    return StoredChat(
        id="abc123",
        title="Ünïcode & code",
        system="You are terse.\n\nAnswer in French.",
        settings={"temperature": 0.3, "stop": ["\n\n"], "drafter": "auto"},
        created=1700000000.5,
        updated=1700000100.25,
        messages=[
            StoredMessage("user", "Show me a function:\n\n" + CODE, created=1700000001.0),
            StoredMessage(
                "assistant",
                "Voilà:\n\n" + CODE + "\n",
                stats={"tokens": 57, "tokens_per_second": 23.456, "tau": 2.5, "acceptance_rate": 0.8},
                provenance=[["Voilà", "plain"], [":\n\n", "draft"], ["```", "target"], ["python", "bonus"]],
                steps=[{"gamma": 3, "accepted": 2}],
                settings={"temperature": 0.3},
                created=1700000002.0,
            ),
            StoredMessage("user", "", stats={}, provenance=[], steps=[], settings={}, created=1700000003.0),
            StoredMessage("assistant", "No figures here.", created=1700000004.0),
        ],
        named=True,
    )


def test_markdown_holds_the_title_system_prompt_and_every_message():
    chat = sample()
    text = to_markdown(chat)
    assert text.startswith("# Ünïcode & code\n\n> **System:** You are terse.\n>\n> Answer in French.\n\n")
    assert text.count("## You\n") == 2 and text.count("## Assistant\n") == 2
    for message in chat.messages:
        assert message.content.rstrip("\n") in text
    assert (
        "## You\n\nShow me a function:\n\n" + CODE + "\n\n## Assistant\n\nVoilà:\n\n" + CODE + "\n\n" in text
    )
    assert "\n\n*57 tokens · 23.5 tok/s · τ 2.50*\n\n## You" in text
    assert text.endswith("## Assistant\n\nNo figures here.\n")  # no figures line without stats


def test_markdown_without_title_or_system_prompt():
    chat = replace(sample(), title="", system="", messages=[StoredMessage("user", "hi")])
    assert to_markdown(chat) == "# Untitled chat\n\n## You\n\nhi\n"


def test_markdown_names_the_files_under_their_message():
    report = {"sha256": "a" * 64, "name": "report.pdf", "size": 12_345, "tokens": 100, "kind": "pdf"}
    odd = {"sha256": "b" * 64, "name": "notes_*v2*.md", "size": 300, "tokens": None, "kind": "markdown"}
    messages = [
        StoredMessage("user", "Summarise these.", attachments=[report, odd]),
        StoredMessage("assistant", "Done.", stats={"tokens": 2}),
    ]
    assert to_markdown(replace(sample(), system="", messages=messages)) == (
        "# Ünïcode & code\n\n## You\n\nSummarise these.\n\n"
        "*Attached: report.pdf (12 kB), notes\\_\\*v2\\*.md (300 B)*\n\n"  # Markdown's own characters escaped
        "## Assistant\n\nDone.\n\n*2 tokens*\n"
    )


def test_json_carries_every_field_readably():
    text = to_json(sample())
    assert "Ünïcode" in text and "ключ" in text and "\\u" not in text  # UTF-8, not escapes
    assert text.startswith('{\n  "format": "edgespec-chat",\n  "version": 2,')
    data = json.loads(text)
    assert list(data["messages"][1]) == [
        "role",
        "content",
        "stats",
        "provenance",
        "steps",
        "settings",
        "created",
        "attachments",
    ]
    assert (data["folder"], data["versions"], data["attachments"]) == (None, [], [])
    assert "id" not in data and data["title"] == "Ünïcode & code" and data["named"] is True


@pytest.mark.parametrize("as_bytes", [False, True])
def test_json_round_trip_gives_the_same_chat_without_its_id(as_bytes):
    text = to_json(sample())
    back = from_json(text.encode("utf-8") if as_bytes else text)
    assert back == replace(sample(), id="")
    assert back.messages[2].stats == {} and back.messages[3].stats is None


def export(**changes) -> str:
    data = json.loads(to_json(sample()))
    data.update(changes)
    return json.dumps(data)


def with_message(index: int, **changes) -> str:
    data = json.loads(to_json(sample()))
    data["messages"][index].update(changes)
    return json.dumps(data)


BAD = [
    ("{not json", "not JSON"),
    (b"\xff\xfe\x00\xd8 broken", "not JSON"),
    ("", "not JSON"),
    ("[1, 2]", "not an edgespec chat export (a JSON list"),
    (json.dumps({"title": "x", "messages": []}), "not an edgespec chat export (format None)"),
    (export(format="other-app"), "not an edgespec chat export (format 'other-app')"),
    (export(version=3), "a newer export version 3; this edgespec reads version 2"),
    (export(version="1"), "unknown export version '1'"),
    (export(version=True), "unknown export version True"),
    (export(version=0), "unknown export version 0"),
    (export(messages=None), "messages is missing"),
    (export(messages={"role": "user"}), "messages must be a list, not dict"),
    (export(title=5), "title must be a string, not int"),
    (export(system=["x"]), "system must be a string, not list"),
    (export(settings=[]), "settings must be an object, not list"),
    (export(named="yes"), "named must be true or false, not str"),
    (export(created="yesterday"), "created must be a number of seconds, not 'yesterday'"),
    (export(updated=True), "updated must be a number of seconds, not True"),
    (export(created=float("nan")), "created must be a number of seconds, not nan"),
    ("[" * 100_000 + "]" * 100_000, "not JSON"),
    (export(messages=[*json.loads(to_json(sample()))["messages"], "hi"]), "message 5: must be an object"),
    (with_message(2, role="system"), "message 3: role must be user or assistant, not 'system'"),
    (with_message(0, role=None), "message 1: role must be user or assistant, not None"),
    (with_message(0, content=None), "message 1: content is missing"),
    (with_message(0, content=7), "message 1: content must be a string, not int"),
    (with_message(1, stats=[1]), "message 2: stats must be an object, not list"),
    (with_message(1, settings="fast"), "message 2: settings must be an object, not str"),
    (with_message(1, steps={"gamma": 1}), "message 2: steps must be a list, not dict"),
    (with_message(1, steps=[1, 2]), "message 2: steps must be objects"),
    (with_message(1, provenance="text"), "message 2: provenance must be a list of [text, source] runs"),
    (with_message(1, provenance=[["text"]]), "message 2: provenance runs must be [text, source] pairs"),
    (with_message(1, provenance=[["text", 3]]), "message 2: provenance runs must be [text, source] pairs"),
    (
        with_message(1, provenance=[("a", "b", "c")]),
        "message 2: provenance runs must be [text, source] pairs",
    ),
    (with_message(1, provenance=[["x", '"><script>']]), "message 2: provenance source must be one of"),
    (with_message(3, created="now"), "message 4: created must be a number of seconds, not 'now'"),
]


@pytest.mark.parametrize(("text", "reason"), BAD, ids=[reason for _, reason in BAD])
def test_a_bad_import_is_one_line_naming_what_is_wrong(text, reason):
    with pytest.raises(EdgespecError) as caught:
        from_json(text)
    message = str(caught.value)
    assert message.startswith("Cannot import the chat: ") and reason in message, message
    assert "\n" not in message


def test_optional_fields_may_be_left_out():
    minimal = {"format": "edgespec-chat", "version": 1, "messages": [{"role": "user", "content": "hi"}]}
    chat = from_json(json.dumps(minimal))
    assert chat == StoredChat("", "", "", {}, 0.0, 0.0, [StoredMessage("user", "hi")], False)


# A chat exported by the version 1 code, as it wrote it.
V1_EXPORT = """{
  "format": "edgespec-chat",
  "version": 1,
  "title": "Old chat",
  "system": "Be brief.",
  "settings": {"temperature": 0.2},
  "named": false,
  "created": 1700000000.0,
  "updated": 1700000050.0,
  "messages": [
    {"role": "user", "content": "hi ✓", "stats": null, "provenance": null, "steps": null, "settings": null,
     "created": 1700000001.0},
    {"role": "assistant", "content": "hello", "stats": {"tokens": 1}, "provenance": [["hello", "draft"]],
     "steps": [{"gamma": 1}], "settings": {"temperature": 0.2}, "created": 1700000002.0}
  ]
}
"""


def test_a_version_1_export_still_imports(tmp_path):
    messages = [
        StoredMessage("user", "hi ✓", created=1700000001.0),
        StoredMessage(
            "assistant",
            "hello",
            {"tokens": 1},
            [["hello", "draft"]],
            [{"gamma": 1}],
            {"temperature": 0.2},
            1700000002.0,
        ),
    ]
    expected = StoredChat(
        "", "Old chat", "Be brief.", {"temperature": 0.2}, 1700000000.0, 1700000050.0, messages
    )
    assert from_json(V1_EXPORT) == expected
    store = ChatStore.open(tmp_path)
    try:
        chat = import_export(store, V1_EXPORT)
        assert chat == replace(expected, id=chat.id, updated=chat.updated) == store.load(chat.id)
        assert store.folders() == [] and store.files(chat.id) == {}
    finally:
        store.close()


def test_an_import_gets_a_new_id_and_the_same_messages(tmp_path):
    store = ChatStore.open(tmp_path)
    try:
        older = store.create(title="Already here")
        first = store.import_chat(from_json(to_json(sample())))
        second = store.import_chat(from_json(to_json(sample())))
        assert first.id and second.id and len({first.id, second.id, older.id, "abc123"}) == 4
        loaded = store.load(first.id)
        assert loaded.messages == sample().messages
        expected = replace(sample(), id=first.id, updated=loaded.updated)
        assert loaded == expected == first
        assert loaded.updated > older.updated  # listed first, where the user looks
        assert [s.id for s in store.summaries()] == [second.id, first.id, older.id]
        assert store.load(second.id).messages == sample().messages
    finally:
        store.close()


@pytest.mark.parametrize(
    ("title", "suffix", "name"),
    [
        ("Ünïcode & code", "md", "unicode-code.md"),
        ("Hello, World!", ".json", "hello-world.json"),
        ("../../etc/passwd", "md", "etc-passwd.md"),
        ("日本語のチャット", "md", "chat.md"),
        ("", "json", "chat.json"),
        ("CON", "md", "chat-con.md"),
        ("a" * 100, "md", "a" * 60 + ".md"),
        ("word " * 30, "md", ("word-" * 12).rstrip("-") + ".md"),
    ],
)
def test_export_filenames_are_safe_slugs(title, suffix, name):
    assert export_filename(replace(sample(), title=title), suffix) == name


# -- a chat's files, versions and folder, and folders of chats --------------------------


@pytest.fixture
def store(tmp_path):
    with opened(tmp_path / "store") as fresh:
        yield fresh


@pytest.fixture
def other(tmp_path):
    with opened(tmp_path / "other") as fresh:
        yield fresh


def exported_fixture(store: ChatStore) -> StoredChat:
    for data, text, kind in (
        (REPORT, "report text", "markdown"),
        (NOTES, "notes", "text"),
        (PDF, "pdf words", "pdf"),
    ):
        store.put_attachment(data, text, kind)
    work = store.create_folder("Work", "Be exact.")
    chat = store.create(title="Quarter", folder=work.id)
    store.append(
        chat.id, StoredMessage("user", "read", attachments=[ref(REPORT, "r.md"), ref(PDF, "a.pdf", "pdf")])
    )
    store.append(chat.id, StoredMessage("assistant", "done", stats={"tokens": 1}))
    store.append(chat.id, StoredMessage("user", "and", attachments=[ref(REPORT, "r-copy.md")]))
    store.add_version(chat.id, "r.md", sha(NOTES))
    return store.load(chat.id)


def test_an_export_carries_the_files_versions_and_folder(store, other):
    chat = exported_fixture(store)
    data = json.loads(to_json(chat, store))
    assert data["folder"] == {"name": "Work", "system": "Be exact."}
    assert [a["sha256"] for a in data["attachments"]] == [sha(REPORT), sha(PDF), sha(NOTES)]  # each once
    assert [a["name"] for a in data["attachments"]] == ["r.md", "a.pdf", "r.md"]
    assert (
        base64.b64decode(data["attachments"][1]["data"]) == PDF
        and data["attachments"][1]["text"] == "pdf words"
    )
    assert [(v["name"], v["sha256"]) for v in data["versions"]] == [("r.md", sha(NOTES))]
    back = import_export(other, to_json(chat, store))
    assert back.messages == chat.messages and (back.title, back.named) == ("Quarter", True)
    (folder,) = other.folders()
    assert (folder.name, folder.system, back.folder) == ("Work", "Be exact.", folder.id)
    assert (
        other.files(back.id)
        == store.files(chat.id)
        == {"r.md": [sha(REPORT), sha(NOTES)], "a.pdf": [sha(PDF)], "r-copy.md": [sha(REPORT)]}
    )
    for key in (sha(REPORT), sha(NOTES), sha(PDF)):
        mine, theirs = store.attachment(key), other.attachment(key)
        assert (theirs.data, theirs.text, theirs.kind) == (mine.data, mine.text, mine.kind)
    again = import_export(other, to_json(chat, store))  # into the folder it made, files not duplicated
    assert again.folder == folder.id and len(other.folders()) == 1 and count(other, "attachments") == 3
    assert from_json(to_json(chat, store)).messages == chat.messages


def test_an_export_of_a_chat_with_files_needs_its_store(store):
    chat = exported_fixture(store)
    with pytest.raises(ValueError, match="store"):
        to_json(chat)


def tampered(text: str, change) -> str:
    data = json.loads(text)
    change(data)
    return json.dumps(data)


def other_bytes(data: dict) -> None:
    data["attachments"][0]["data"] = base64.b64encode(b"# Report\n\nQuarterly figures: 9, 9, 9.\n").decode()


TAMPERED = [
    (other_bytes, "does not match its sha256"),
    (lambda d: d["attachments"][0].update(data="not base64!"), "data is not base64"),
    (lambda d: d["attachments"][0].update(sha256="xyz"), "sha256 must be 64 lowercase hex digits"),
    (lambda d: d["attachments"][0].update(size=3), "size 3 is not its data's"),
    (lambda d: d["attachments"].pop(1), "message 1: attached file 'a.pdf' is not in the export"),
    (lambda d: d["attachments"].pop(2), "version 1: file 'r.md' is not in the export"),
    (
        lambda d: d["messages"][0]["attachments"][0].update(size="big"),
        "message 1: attachment size must be an integer",
    ),
    (lambda d: d["messages"][0].update(attachments="r.md"), "message 1: attachments must be a list"),
    (lambda d: d.update(folder={"name": " "}), "folder name is empty"),
    (lambda d: d.update(versions=[{"name": "x"}]), "version 1: sha256 must be"),
]


@pytest.mark.parametrize(("change", "reason"), TAMPERED, ids=[reason for _, reason in TAMPERED])
def test_a_tampered_export_is_refused_and_nothing_written(store, other, change, reason):
    text = tampered(to_json(exported_fixture(store), store), change)
    with pytest.raises(EdgespecError) as caught:
        import_export(other, text)
    message = one_line_error(caught)
    assert message.startswith("Cannot import the chat: ") and reason in message, message
    assert other.summaries() == [] and other.folders() == [] and count(other, "attachments") == 0


def test_a_file_no_message_or_version_names_is_left_out(store, other):
    stray = {"sha256": sha(b"stray"), "name": "stray.txt", "kind": "text", "text": "stray"}
    stray["data"] = base64.b64encode(b"stray").decode()
    import_export(
        other, tampered(to_json(exported_fixture(store), store), lambda d: d["attachments"].append(stray))
    )
    assert count(other, "attachments") == 3  # nothing would ever collect it
    with pytest.raises(EdgespecError):
        other.attachment(sha(b"stray"))


def test_an_export_over_the_importing_store_limit_is_refused(store, tmp_path):
    text = to_json(exported_fixture(store), store)
    with opened(tmp_path / "small", attachment_limit=len(PDF) - 1) as small:
        with pytest.raises(EdgespecError, match="over the limit") as caught:
            import_export(small, text)
        assert "a.pdf" in one_line_error(caught)
        assert small.summaries() == [] and count(small, "attachments") == 0
    assert read_export(text).attachments[1].data == PDF  # under the default limit: read


def test_a_folder_bundle_round_trips_under_a_free_name(store, other):
    chat = exported_fixture(store)
    work = store.folder(chat.folder)
    second = store.create(folder=work.id)
    store.append(second.id, StoredMessage("user", "second chat"))
    store.create()  # not in the folder: not in the bundle
    bundle = folder_to_json(store, work.id)
    data = json.loads(bundle)
    assert (data["format"], data["name"], data["system"], len(data["chats"])) == (
        "edgespec-folder",
        "Work",
        "Be exact.",
        2,
    )
    elsewhere = import_folder(other, bundle)
    assert (elsewhere.name, elsewhere.system) == ("Work", "Be exact.")
    listed = other.summaries(folder=elsewhere.id)
    assert [s.title for s in listed] == ["second chat", "Quarter"]  # the order they had
    assert other.load(listed[1].id).messages == chat.messages and other.files(listed[1].id) == store.files(
        chat.id
    )
    here = import_folder(store, bundle)
    assert here.name == "Work (2)" and here.id != work.id
    assert import_folder(store, bundle).name == "Work (3)"
    assert len(store.summaries(folder=here.id)) == 2 and count(store, "attachments") == 3


def test_a_bad_folder_bundle_writes_nothing(store, other):
    chat = exported_fixture(store)
    bundle = json.loads(folder_to_json(store, chat.folder))
    bundle["chats"][0]["messages"][0]["role"] = "system"
    for text, reason in (
        (json.dumps(bundle), "chat 1: message 1: role must be user or assistant"),
        (to_json(chat, store), "not an edgespec folder export (format 'edgespec-chat')"),
        (json.dumps({**bundle, "version": 2}), "a newer export version 2"),
        (json.dumps({**bundle, "name": ""}), "the folder's name is empty"),
        ("{", "not JSON"),
    ):
        with pytest.raises(EdgespecError) as caught:
            import_folder(other, text)
        message = one_line_error(caught)
        assert message.startswith("Cannot import the folder: ") and reason in message, message
    assert other.folders() == [] and other.summaries() == [] and count(other, "attachments") == 0

"""A chat as Markdown and as JSON: everything in it, back whole through an import, and an
import of anything else refused with one line that says what is wrong."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from edgespec.errors import EdgespecError
from edgespec.ui.chat_export import export_filename, from_json, to_json, to_markdown
from edgespec.ui.chat_store import ChatStore, StoredChat, StoredMessage

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


def test_json_carries_every_field_readably():
    text = to_json(sample())
    assert "Ünïcode" in text and "ключ" in text and "\\u" not in text  # UTF-8, not escapes
    assert text.startswith('{\n  "format": "edgespec-chat",\n  "version": 1,')
    data = json.loads(text)
    assert list(data["messages"][1]) == [
        "role",
        "content",
        "stats",
        "provenance",
        "steps",
        "settings",
        "created",
    ]
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
    (export(version=2), "a newer export version 2; this edgespec reads version 1"),
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

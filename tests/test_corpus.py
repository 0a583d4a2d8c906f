"""The benchmark's data files: the prompt corpus (each prompt's half written on its own
line, so that lines added or moved change no other prompt's half), the replay's cost curves
and the benchmark's bars, each loaded with one-line errors for a bad file. No models."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from edgespec.api import settings_from
from edgespec.bench.corpus import (
    BY_ID,
    CATEGORIES,
    CORPUS,
    CORPUS_DIR,
    KINDS,
    conversation,
    fields_of,
    file_name,
    load_corpus,
    settings_extras,
)
from edgespec.bench.curves import CURVES, CURVES_FILE, Curve, load_curves
from edgespec.cli.bench import BARS, BARS_FILE, load_bars
from edgespec.decoding.grammar import GrammarSpec
from edgespec.errors import EdgespecError
from lab import llamacpp as lab_llamacpp

# -- the corpus --------------------------------------------------------------------------------


def records(directory: Path = CORPUS_DIR) -> dict[str, list[dict]]:
    """Every category's lines as written, parsed without the loader."""
    return {
        category: [json.loads(line) for line in (directory / file_name(category)).read_text().splitlines()]
        for category in CATEGORIES
    }


def test_every_category_has_a_file_and_two_even_halves_of_at_least_four():
    assert sorted(path.name for path in CORPUS_DIR.iterdir()) == sorted(map(file_name, CATEGORIES))
    counts = Counter((p.category, p.split) for p in CORPUS)
    for category in CATEGORIES:
        assert counts[category, "dev"] >= 4 and counts[category, "dev"] == counts[category, "test"], category
    for category in ("agent", "structured"):
        assert counts[category, "dev"] >= 8, category
    assert {p.split for p in CORPUS} == {"dev", "test"}


def test_every_line_has_its_own_id_split_source_and_what_it_sends():
    written = records()
    ids = [r["id"] for lines in written.values() for r in lines]
    assert len(ids) == len(set(ids)) == len(CORPUS)
    for category, lines in written.items():
        for r in lines:
            assert set(r) == set(fields_of(category)), r["id"]
            assert r["split"] in ("dev", "test") and r["source"].strip(), r["id"]
            assert ("kind" in r) == (category in KINDS), r["id"]
            assert r.get("kind", "") in KINDS.get(category, ("",)), r["id"]
    assert set(fields_of("agent")) >= {"messages", "tools"} and "text" not in fields_of("agent")
    assert set(fields_of("structured")) >= {"text", "json_schema"}
    # The loader keeps every field as written, in the order written.
    shown = ("id", "split", "source", "text", "kind", "messages", "tools", "json_schema")
    assert [tuple(getattr(p, name) for name in shown) for p in CORPUS] == [
        (r["id"], r["split"], r["source"], r.get("text", ""), r.get("kind", ""), r.get("messages"),
         r.get("tools"), r.get("json_schema"))
        for category in CATEGORIES
        for r in written[category]
    ]  # fmt: skip


def test_both_halves_cover_every_kind():
    for category, kinds in KINDS.items():
        for split in ("dev", "test"):
            found = Counter(p.kind for p in CORPUS if p.category == category and p.split == split)
            assert set(found) == set(kinds), (category, split)
    assert all(not p.kind for p in CORPUS if p.category not in KINDS)


def offered(prompt) -> set[str]:
    return {tool["function"]["name"] for tool in prompt.tools}


def calls(prompt) -> list[tuple[str, dict]]:
    return [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for message in prompt.messages
        for call in message.get("tool_calls") or []
    ]


def test_agent_conversations_are_what_their_kind_says():
    agents = [p for p in CORPUS if p.category == "agent"]
    for p in agents:
        # Every call names a tool the prompt offers, and every result answers a call before it.
        assert {name for name, _ in calls(p)} <= offered(p), p.id
        asked: set[str] = set()
        for message in p.messages:
            asked |= {call["id"] for call in message.get("tool_calls") or []}
            if message["role"] == "tool":
                assert message["tool_call_id"] in asked and message["content"].strip(), p.id
        last = p.messages[-1]["role"]
        if p.kind == "call":  # the answer is a call whose arguments the request spells out
            assert last == "user" and not calls(p), p.id
        elif p.kind == "round-trip":  # the answer reads the results of the calls made
            assert last == "tool" and calls(p) and "read_file" not in dict(calls(p)), p.id
        else:  # file-loop: a file was read, and the next step writes it
            read = [args["path"] for name, args in calls(p) if name == "read_file"]
            assert read and offered(p) & {"edit_file", "write_file"} and last == "tool", p.id
            assert read[0] in p.messages[1]["content"] or read[0] in p.messages[0]["content"], p.id


def test_the_helpers_build_every_prompt_from_its_own_fields():
    text = BY_ID["rag-lighthouse-1"]
    assert conversation(text) == ([{"role": "user", "content": text.text}], None)
    assert settings_extras(text) == {} and settings_from(**settings_extras(text)).grammar is None
    agent = next(p for p in CORPUS if p.category == "agent")
    messages, tools = conversation(agent)
    assert (messages, tools) == (agent.messages, agent.tools) and agent.text == ""
    messages[0]["content"] = "changed"
    tools.clear()
    assert agent.messages[0]["content"] != "changed" and agent.tools  # copies, not the corpus itself
    assert settings_extras(agent) == {}


# The JSON schema keywords llama-cpp-python's converter turns into a grammar, and the
# types the corpus uses: a schema stays within what every engine understands.
SCHEMA_KEYWORDS = {"type", "properties", "required", "items", "enum", "description"}
SCHEMA_TYPES = {"object", "array", "string", "integer", "number", "boolean"}


def schema_problems(schema: dict, where: str = "$") -> list[str]:
    problems = [f"{where}: {key}" for key in set(schema) - SCHEMA_KEYWORDS]
    if schema.get("type") not in SCHEMA_TYPES:
        problems.append(f"{where}: type {schema.get('type')!r}")
    if schema.get("type") == "object":
        properties = schema.get("properties", {})  # none: any object
        if not set(schema.get("required", [])) <= set(properties):
            problems.append(f"{where}: required")
        for name, sub in properties.items():
            problems += schema_problems(sub, f"{where}.{name}")
    if schema.get("type") == "array":
        problems += schema_problems(schema.get("items", {}), f"{where}[]")
    if "enum" in schema and not (schema["enum"] and all(isinstance(v, str) for v in schema["enum"])):
        problems.append(f"{where}: enum")
    return problems


def test_every_json_schema_keeps_to_the_supported_keywords_and_becomes_a_grammar():
    structured = [p for p in CORPUS if p.category == "structured"]
    assert all(p.json_schema and p.text.strip() for p in structured)
    assert all(p.json_schema is None for p in CORPUS if p.category != "structured")
    for p in structured:
        assert schema_problems(p.json_schema) == [], p.id
        assert p.json_schema["type"] == "object", p.id  # an answer is one record
        grammar = settings_from(**settings_extras(p)).grammar
        assert isinstance(grammar, GrammarSpec) and "root ::=" in grammar.text, p.id
    # Tool-argument schemas are also tool parameters: the agent's tools keep to the same set.
    for p in CORPUS:
        for tool in p.tools or []:
            assert schema_problems(tool["function"]["parameters"]) == [], (p.id, tool["function"]["name"])


def test_adding_or_moving_lines_keeps_every_prompt_in_its_half(tmp_path):
    directory = tmp_path / "corpus"
    shutil.copytree(CORPUS_DIR, directory)
    rag = directory / file_name("rag")
    lines = rag.read_text().splitlines(keepends=True)
    new = json.dumps({"id": "rag-new-0", "split": "test", "source": "a test", "text": "What is in it?"})
    rag.write_text(new + "\n" + "".join(lines))
    for category in ("open chat", "agent"):
        path = directory / file_name(category)
        path.write_text("".join(reversed(path.read_text().splitlines(keepends=True))))
    before = {p.id: p.split for p in CORPUS}
    after = {p.id: p.split for p in load_corpus(directory)}
    # (A split by position within a category would move every rag, chat and agent prompt.)
    assert after.pop("rag-new-0") == "test"
    assert after == before


GOOD = {"id": "x-1", "split": "dev", "source": "a test", "text": "Say hello."}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}},
]}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
AGENT = {"id": "x-1", "split": "dev", "kind": "file-loop", "source": "a test", "tools": TOOLS,
         "messages": [{"role": "user", "content": "Read a.py"}, CALLED,
                      {"role": "tool", "tool_call_id": "c1", "content": "x = 1"}]}  # fmt: skip
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
STRUCTURED = GOOD | {"kind": "extract", "json_schema": SCHEMA}


def changed(n: int, **changes) -> list[dict]:
    return [m | changes if i == n else m for i, m in enumerate(AGENT["messages"])]


@pytest.mark.parametrize(
    ("category", "line", "message"),
    [
        ("translation", '{"id": "x-1", "split": "dev",', "not valid JSON"),
        ("translation", '["x-1", "dev"]', "not a JSON object"),
        ("translation", json.dumps({k: v for k, v in GOOD.items() if k != "split"}), "missing field 'split'"),
        ("translation", json.dumps(GOOD | {"split": "train"}), "unknown split 'train'"),
        ("translation", json.dumps(GOOD | {"text": ""}), "field 'text' must be a non-empty string"),
        ("translation", json.dumps(GOOD | {"kind": "rename"}), "unknown field 'kind'"),  # no kinds here
        ("translation", json.dumps(GOOD | {"json_schema": {}}), "unknown field 'json_schema'"),
        ("translation", json.dumps(GOOD | {"id": CORPUS[0].id}), f"duplicate id {CORPUS[0].id!r}"),
        ("agent", json.dumps(AGENT | {"kind": "rename"}), "unknown kind 'rename' (known: call, round-trip"),
        ("agent", json.dumps(AGENT | {"text": "Hello"}), "unknown field 'text'"),
        ("agent", json.dumps({k: v for k, v in AGENT.items() if k != "tools"}), "missing field 'tools'"),
        ("agent", json.dumps(AGENT | {"messages": "Read a.py"}), "field 'messages' must be a non-empty list"),
        ("agent", json.dumps(AGENT | {"messages": changed(0, role="robot")}), "message 0 needs a role"),
        ("agent", json.dumps(AGENT | {"messages": changed(0, content=None)}), "message 0 needs text content"),
        ("agent", json.dumps(AGENT | {"messages": changed(2, tool_call_id=None)}), "needs its tool_call_id"),
        ("agent", json.dumps(AGENT | {"messages": changed(1, tool_calls=[{"id": "c1"}])}),
         "message 1: each tool call needs a function with a name"),
        ("agent", json.dumps(AGENT | {"messages": changed(1, tool_calls=[
            {"id": "c1", "function": {"name": "read_file", "arguments": "a.py"}}])}),
         "message 1: a tool call's arguments must be the JSON text of an object"),
        ("agent", json.dumps(AGENT | {"messages": AGENT["messages"][:2]}), "must end with a user message"),
        ("agent", json.dumps(AGENT | {"tools": {"read_file": {}}}), "field 'tools' must be a non-empty list"),
        ("agent", json.dumps(AGENT | {"tools": [{"type": "function", "function": {"name": "f"}}]}),
         "tool 0 needs type 'function' and a function with a name and parameters"),
        ("structured", json.dumps(STRUCTURED | {"json_schema": "object"}),
         "field 'json_schema' must be a JSON schema"),
        ("structured", json.dumps({k: v for k, v in STRUCTURED.items() if k != "json_schema"}),
         "missing field 'json_schema'"),
    ],
)  # fmt: skip
def test_a_bad_line_is_one_error_line_naming_the_file_and_the_line(tmp_path, category, line, message):
    directory = tmp_path / "corpus"
    shutil.copytree(CORPUS_DIR, directory)
    path = directory / file_name(category)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:2], line, *lines[2:]]) + "\n")
    with pytest.raises(EdgespecError) as caught:
        load_corpus(directory)
    text = str(caught.value)
    assert text.startswith(f"{path}:3: ") and message in text and "\n" not in text
    if "duplicate" in message:  # and where the id first was
        assert text.endswith(f"(first at {directory / file_name(CORPUS[0].category)}:1)")


def test_every_good_line_above_loads(tmp_path):
    # (So each bad line above is refused for the one thing it changes.)
    directory = tmp_path / "corpus"
    shutil.copytree(CORPUS_DIR, directory)
    for category, record in (("translation", GOOD), ("agent", AGENT), ("structured", STRUCTURED)):
        path = directory / file_name(category)
        path.write_text(path.read_text() + json.dumps(record | {"id": f"good-{category}"}) + "\n")
    loaded = {p.id: p for p in load_corpus(directory)}
    assert loaded["good-agent"].messages == AGENT["messages"] and loaded["good-agent"].tools == TOOLS
    assert loaded["good-structured"].json_schema == STRUCTURED["json_schema"]


def test_a_file_of_no_known_category_or_a_missing_one_is_an_error(tmp_path):
    directory = tmp_path / "corpus"
    shutil.copytree(CORPUS_DIR, directory)
    (directory / "poetry.jsonl").write_text(json.dumps(GOOD) + "\n")
    with pytest.raises(EdgespecError, match=r"poetry\.jsonl: unknown category 'poetry'"):
        load_corpus(directory)
    (directory / "poetry.jsonl").unlink()
    (directory / file_name("rag")).unlink()
    with pytest.raises(EdgespecError, match=r"rag\.jsonl: cannot read the rag prompts"):
        load_corpus(directory)


# -- the replay's cost curves ----------------------------------------------------------------


def test_curves_load_with_their_figures():
    assert list(CURVES) == [
        "cpu", "epyc-f26", "epyc-f25", "epyc-f25-rpc0", "epyc-f25-rpc5", "cpu-avx2", "cpu-f16",
        "xeon-f16", "xeon", "xeon-rpc", "gpu", "h200", "h200-history", "gpu-slow-draft",
    ]  # fmt: skip
    assert CURVES["epyc-f25"].shared_token == 0.85 and CURVES["cpu"].shared_token == 0.0
    avx2 = CURVES["cpu-avx2"]
    assert (avx2.target_s, avx2.draft_ratio, avx2.python_s) == (0.0631, 0.47, 0.0005)
    assert avx2.target == {
        1: 1, 2: 1.7, 3: 2.49, 4: 2.76, 5: 3.43, 6: 4.08, 7: 5.02, 8: 7.31, 9: 8.01, 12: 8.24,
        16: 9.89, 17: 10.72, 24: 12.74, 32: 15.93, 48: 21.2, 65: 32.4,
    }  # fmt: skip
    assert avx2.draft == {1: 1, 2: 1.54, 4: 2.32, 65: 23.9}
    assert (avx2.reshape, avx2.back_to_one) == ({}, (0.0, 0.0))
    # A curve based on another keeps its figures and adds its own.
    h200, history = CURVES["h200"], CURVES["h200-history"]
    assert (history.target_s, history.target, history.draft_ratio, history.draft) == (
        h200.target_s, h200.target, h200.draft_ratio, h200.draft,
    )  # fmt: skip
    assert history.reshape == {2: 1.59, 3: 1.46, 5: 0.71, 9: 0.69, 17: 0.72, 33: 0.77, 65: 0.70}
    assert history.back_to_one == (0.56, 0.95) and not h200.reshape
    assert all(isinstance(curve, Curve) and curve.about for curve in CURVES.values())


def test_a_bad_curve_is_one_error_line_naming_the_file(tmp_path):
    path = tmp_path / "curves.toml"
    good = CURVES_FILE.read_text()
    for text, message in [
        (good + "\n[extra]\nbased_on = 'nowhere'\n", "curve 'extra': based on 'nowhere'"),
        (good.replace("draft_ratio = 0.47", "draft_rate = 0.47"), "'cpu-avx2': unknown field 'draft_rate'"),
        (good.replace("target_s = 0.0631", "target_s = 'fast'"), "'cpu-avx2': a figure is not a number"),
        (good.replace("[gpu]", "[gpu"), "cannot read the cost curves"),
    ]:
        path.write_text(text)
        with pytest.raises(EdgespecError) as caught:
            load_curves(path)
        assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
        assert "\n" not in str(caught.value)


# -- the benchmark's bars ------------------------------------------------------------------------


def test_bars_load():
    assert load_bars() == BARS
    assert (BARS.auto, BARS.auto_per_prompt, BARS.min_tokens_per_prompt) == (0.97, 0.97, 64)
    assert BARS.auto_by_category == {
        "code editing": 1.3, "code completion": 1.15, "summarization": 1.15, "rag": 1.15,
    }  # fmt: skip
    assert BARS.config_by_category == {"model γ=4": {"code writing": 0.85}}
    assert (BARS.f16_share_of_best_fixed, BARS.peak_memory) == (0.9, 1.15)
    # Against llama.cpp's own loops: the lab's bars, beside its instrument.
    loops = lab_llamacpp.load_bars()
    assert loops.llamacpp_categories == ("code editing", "code completion", "summarization", "rag")
    assert (loops.against_llamacpp, loops.against_llamacpp_prompt) == (1.1, 1.0)


def test_a_bad_bars_file_is_one_error_line_naming_the_file(tmp_path):
    path = tmp_path / "bars.toml"
    good = BARS_FILE.read_text()
    for text, message in [
        (good.replace("peak_memory = 1.15\n", ""), "missing bar 'peak_memory'"),
        ("something = 1\n" + good, "unknown bar 'something'"),
        (good.replace('"open chat" = 1.2', '"poetry" = 1.2'), "unknown category 'poetry'"),
        (good.replace('."model γ=4"]', '."model γ=9"]'), "unknown configuration 'model γ=9'"),
        (good.replace("auto = 0.97", "auto = 'high'"), "a bar has the wrong type"),
    ]:
        path.write_text(text)
        with pytest.raises(EdgespecError) as caught:
            load_bars(path)
        assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
        assert "\n" not in str(caught.value)


def test_a_bad_llamacpp_bars_file_is_one_error_line_naming_the_file(tmp_path):
    path = tmp_path / "llamacpp_bars.toml"
    good = lab_llamacpp.BARS_FILE.read_text()
    for text, message in [
        (good.replace("against_llamacpp = 1.1\n", ""), "missing bar 'against_llamacpp'"),
        ("something = 1\n" + good, "unknown bar 'something'"),
        (good.replace('"rag"]', '"poetry"]'), "unknown category 'poetry'"),
        (good.replace("against_llamacpp_prompt = 1.0", "against_llamacpp_prompt = 'high'"), "wrong type"),
        ("against_llamacpp = \n", "cannot read the bars"),
    ]:
        path.write_text(text)
        with pytest.raises(EdgespecError) as caught:
            lab_llamacpp.load_bars(path)
        assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
        assert "\n" not in str(caught.value)

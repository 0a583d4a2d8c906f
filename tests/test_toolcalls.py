"""Tool calls parsed out of answer text, whole and streamed (pure: no model), and the
formats the real GGUFs' templates teach (those two tests load the template text only)."""

from __future__ import annotations

import json
import random
import re

import pytest

from edgespec.decoding.request import Request
from edgespec.models.gguf import read_info
from edgespec.runtime.chat_template import render_template
from edgespec.server.toolcalls import (
    Delta,
    StreamParser,
    detect_format,
    finish_reason,
    parse,
)

TOOLS = {"get_weather", "search", "noop"}

# Arguments that exercise the JSON: nesting, unicode (outside the BMP too), quotes,
# backslashes, newlines, and text that looks like the formats' markers.
TRICKY = {
    "city": 'Zürich "Altstadt" 東京 🌧',
    "path": "C:\\tmp\\new",
    "note": "line one\nline two\t</tool_call> [TOOL_CALLS] <|python_tag|>",
    "nested": {"list": [1, 2.5, None, True, {"deep": []}], "empty": {}},
}


def hermes_call(name: str, arguments: dict, *, ascii_only: bool = False) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=ascii_only)
    return f"<tool_call>\n{body}\n</tool_call>"


def compact(arguments: dict) -> str:
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def names_and_arguments(parsed) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def stream(text: str, fmt: str, sizes: list[int] | None = None, allowed=TOOLS):
    """Feeds ``text`` in pieces (``sizes`` cycled; one character each by default) and
    folds the deltas as an OpenAI client does. Returns the parser, the content sent
    before ``finish``, all content, and the calls as (id, name, arguments) by index."""
    parser = StreamParser(fmt, allowed)
    early: list[Delta] = []
    pos, n = 0, 0
    while pos < len(text):
        size = sizes[n % len(sizes)] if sizes else 1
        early += parser.feed(text[pos : pos + size])
        pos += size
        n += 1
    deltas = early + parser.finish()
    calls: dict[int, list] = {}
    for d in deltas:
        assert (d.content is None) != (d.tool_call is None)
        if d.tool_call is not None:
            entry = d.tool_call
            if "id" in entry:
                assert entry["index"] not in calls
                assert entry["type"] == "function" and entry["function"]["arguments"] == ""
                calls[entry["index"]] = [entry["id"], entry["function"]["name"], ""]
            else:
                assert set(entry["function"]) == {"arguments"}
                calls[entry["index"]][2] += entry["function"]["arguments"]
    early_text = "".join(d.content for d in early if d.content is not None)
    content = "".join(d.content for d in deltas if d.content is not None)
    return parser, early_text, content, [tuple(calls[i]) for i in sorted(calls)]


# --- whole answers ---------------------------------------------------------------------


def test_hermes_one_call() -> None:
    parsed = parse(hermes_call("get_weather", {"city": "Paris"}), "hermes", allowed=TOOLS)
    assert parsed.ok and parsed.content is None and parsed.error is None
    [call] = parsed.calls
    assert call.name == "get_weather" and call.arguments == '{"city":"Paris"}'
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    assert call.as_dict() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }


def test_hermes_parallel_calls_with_content_before_and_after() -> None:
    text = (
        "I will look both up.\n\n"
        + hermes_call("get_weather", {"city": "Paris"})
        + "\n"
        + hermes_call("search", {"q": "Paris"})
        + "\nDone."
    )
    parsed = parse(text, "hermes", allowed=TOOLS)
    assert parsed.ok
    assert names_and_arguments(parsed) == [("get_weather", {"city": "Paris"}), ("search", {"q": "Paris"})]
    assert parsed.content == "I will look both up.\nDone."
    assert len({c.id for c in parsed.calls}) == 2


def test_hermes_accepts_parameters_string_arguments_and_a_missing_last_closing_tag() -> None:
    text = (
        '<tool_call>{"name": "search", "parameters": {"q": "x"}}</tool_call>'
        '<tool_call>{"name": "noop", "arguments": "{\\"a\\": 1}"}</tool_call>'
        '<tool_call>\n{"name": "noop"}\n'
    )
    parsed = parse(text, "hermes", allowed=TOOLS)
    assert parsed.ok
    assert names_and_arguments(parsed) == [("search", {"q": "x"}), ("noop", {"a": 1}), ("noop", {})]


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None),
        ('\n {"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}', None),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', None),
        ('Let me see. <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "Let me see."),
    ],
)
def test_llama3_one_call(text: str, content: str | None) -> None:
    parsed = parse(text, "llama3", allowed=TOOLS)
    assert parsed.ok and parsed.content == content
    assert names_and_arguments(parsed) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("separator", ["; ", ";", "\n", "\n\n", " ; \n"])
@pytest.mark.parametrize("tag", ["", "<|python_tag|>"])
def test_llama3_parallel_calls(separator: str, tag: str) -> None:
    one = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    two = '{"name": "search", "parameters": {"q": "rain"}}'
    parsed = parse(tag + one + separator + two, "llama3", allowed=TOOLS)
    assert parsed.ok and parsed.content is None
    assert names_and_arguments(parsed) == [("get_weather", {"city": "Paris"}), ("search", {"q": "rain"})]


@pytest.mark.parametrize(
    "text",
    [
        "The weather is fine.",
        '{"answer": 42, "name": "get_weather"}',  # JSON, but not a call: "name" is not first
        'Here it is: {"name": "get_weather", "parameters": {}}',  # a bare call must open the answer
        "{x} is a set and {} is empty",
    ],
)
def test_llama3_text_that_is_not_a_call_stays_content(text: str) -> None:
    parsed = parse(text, "llama3", allowed=TOOLS)
    assert parsed.ok and parsed.calls == [] and parsed.content == text


def test_mistral_list_form_keeps_a_valid_id_and_makes_one_otherwise() -> None:
    for marker in ("[TOOL_CALLS]", "[TOOL_CALLS] "):
        text = (
            "Checking. "
            + marker
            + '[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"},'
            ' {"name": "search", "arguments": {"q": "x"}, "id": "call_too_long"}]'
        )
        parsed = parse(text, "mistral", allowed=TOOLS)
        assert parsed.ok and parsed.content == "Checking."
        assert names_and_arguments(parsed) == [("get_weather", {"city": "Paris"}), ("search", {"q": "x"})]
        assert parsed.calls[0].id == "abcDEF123"
        assert re.fullmatch(r"[A-Za-z0-9]{9}", parsed.calls[1].id)


def test_mistral_name_args_form_with_and_without_call_id() -> None:
    text = (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        + '[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{"q": "x"}'
    )
    parsed = parse(text, "mistral", allowed=TOOLS)
    assert parsed.ok and parsed.content is None
    assert names_and_arguments(parsed) == [("get_weather", {"city": "Paris"}), ("search", {"q": "x"})]
    assert parsed.calls[1].id == "a1b2c3d4e"
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in parsed.calls)


def _one_call_text(fmt: str, name: str, arguments: dict, ascii_only: bool) -> str:
    if fmt == "hermes":
        return "Sure.\n" + hermes_call(name, arguments, ascii_only=ascii_only)
    if fmt == "llama3":
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=ascii_only)
    return f"[TOOL_CALLS]{name}[ARGS]" + json.dumps(arguments, ensure_ascii=ascii_only)


@pytest.mark.parametrize("ascii_only", [False, True])
@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral"])
def test_arguments_survive_nesting_unicode_quotes_and_newlines(fmt: str, ascii_only: bool) -> None:
    parsed = parse(_one_call_text(fmt, "search", TRICKY, ascii_only), fmt, allowed=TOOLS)
    assert parsed.ok
    [call] = parsed.calls
    assert json.loads(call.arguments) == TRICKY
    assert call.arguments == compact(TRICKY)


@pytest.mark.parametrize(
    ("fmt", "text", "why"),
    [
        ("hermes", '<tool_call>\n{"name": "search", "arguments": {"q": "x"}\n</tool_call>', "JSON"),
        ("hermes", '<tool_call>\n{"arguments": {"q": "x"}}\n</tool_call>', "no function name"),
        ("hermes", '<tool_call>\n{"name": "search", "arguments": [1]}\n</tool_call>', "not a JSON object"),
        ("hermes", '<tool_call>\n{"name": "search", "arguments": {"v": NaN}}\n</tool_call>', "JSON"),
        ("hermes", '<tool_call>\n{"name": "search"} and more\n</tool_call>', "more than JSON"),
        ("hermes", "<tool_call>\nsearch(q='x')\n</tool_call>", "JSON object"),
        ("llama3", '{"name": "search", "parameters": {"q": "x"}', "JSON"),
        ("llama3", '<|python_tag|>brave_search.call(query="x")', "JSON object"),
        ("mistral", '[TOOL_CALLS][{"name": "search", "arguments": {"q": "x"}}', "JSON"),
        ("mistral", "[TOOL_CALLS] I would call search here.", "function name"),
        ("mistral", '[TOOL_CALLS]search[ARGS]{"q": }', "JSON"),
    ],
)
def test_a_malformed_call_makes_the_whole_answer_text(fmt: str, text: str, why: str) -> None:
    if not text.startswith("{"):  # a bare Llama call must open the answer
        text = "Let me check. " + text
    parsed = parse(text, fmt, allowed=TOOLS)
    assert not parsed.ok and parsed.calls == [] and parsed.content == text
    assert why in parsed.error
    assert parsed.finish_reason("stop") == "stop"


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral"])
def test_an_unknown_function_makes_the_whole_answer_text(fmt: str) -> None:
    text = _one_call_text(fmt, "rm_rf", {"path": "/"}, False)
    parsed = parse(text, fmt, allowed=TOOLS)
    assert not parsed.ok and parsed.calls == [] and parsed.content == text
    assert "'rm_rf'" in parsed.error
    assert parse(text, fmt, allowed=None).calls[0].name == "rm_rf"  # any name, when not restricted
    assert not parse(text, fmt, allowed=set()).ok


def test_one_bad_call_among_parallel_ones_spoils_them_all() -> None:
    text = hermes_call("search", {"q": "x"}) + hermes_call("unknown", {})
    parsed = parse(text, "hermes", allowed=TOOLS)
    assert not parsed.ok and parsed.calls == [] and parsed.content == text


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral"])
def test_an_answer_cut_inside_a_call_is_text_with_finish_reason_length(fmt: str) -> None:
    text = _one_call_text(fmt, "search", TRICKY, False)
    json_end = text.rindex("}") + 1
    json_start = text.index("{")
    for cut in range(json_start + 1, json_end):
        prefix = text[:cut]
        parsed = parse(prefix, fmt, allowed=TOOLS)
        assert parsed.calls == [] and parsed.content == prefix, cut
        assert parsed.finish_reason("length") == "length"
        _, _, content, calls = stream(prefix, fmt, [3])
        assert calls == [] and content == prefix


def test_text_without_calls_and_format_none() -> None:
    for fmt in ("hermes", "llama3", "mistral", "none"):
        parsed = parse("Just text, with < and { and [.\n", fmt, allowed=TOOLS)
        assert parsed.ok and parsed.calls == [] and parsed.content == "Just text, with < and { and [.\n"
    text = hermes_call("search", {"q": "x"})
    assert parse(text, "none", allowed=TOOLS).content == text
    assert parse("", "hermes").content == ""


def test_finish_reason() -> None:
    calls = parse(hermes_call("search", {}), "hermes").calls
    assert finish_reason(calls, "stop") == "tool_calls"
    assert finish_reason(calls, "length") == "length"
    assert finish_reason([], "stop") == "stop"
    assert finish_reason([], "length") == "length"


# --- streaming -------------------------------------------------------------------------

STREAM_CASES = [
    ("hermes", "Plain answer: a < b, x<y, <tool and {braces}.\n\n"),
    ("hermes", hermes_call("get_weather", TRICKY)),
    ("hermes", "Looking.  \n" + hermes_call("get_weather", {"c": 1}) + hermes_call("search", TRICKY)),
    ("hermes", "A " + hermes_call("search", {"q": 1}) + "\nthen <b> " + hermes_call("noop", {}) + " end \n"),
    ("hermes", "x" + hermes_call("rm_rf", {})),
    ("hermes", '<tool_call>\n{"name": "search", "arguments": {"q": '),
    ("llama3", '  {"name": "get_weather", "parameters": ' + json.dumps(TRICKY) + "}"),
    ("llama3", '{"type": "function", "name": "search", "parameters": {}};{"name": "noop", "parameters": {}}'),
    ("llama3", 'Hmm <|python ok. <|python_tag|>{"name": "search", "parameters": {"q": "é"}}'),
    ("llama3", '{"answer": 42}\n'),
    ("llama3", "   {not json at all"),
    ("llama3", '{ "name": "nope", "parameters": {}}'),
    ("mistral", "Sure [TOOL and [TOOLS] " + '[TOOL_CALLS][{"name": "search", "arguments": {"q": 1}}]'),
    ("mistral", '[TOOL_CALLS]search[ARGS]{"q": "\\n"}[TOOL_CALLS]get_weather[ARGS]' + json.dumps(TRICKY)),
    ("none", hermes_call("search", {})),
]


@pytest.mark.parametrize(("fmt", "text"), STREAM_CASES)
def test_a_stream_says_what_the_whole_answer_says(fmt: str, text: str) -> None:
    whole = parse(text, fmt, allowed=TOOLS)
    expected_content = whole.content or ""
    expected_calls = [(c.name, c.arguments) for c in whole.calls]
    rng = random.Random(text)
    plans = [None, [len(text) or 1], *([rng.randint(1, 9) for _ in range(50)] for _ in range(8))]
    for sizes in plans:
        parser, _, content, calls = stream(text, fmt, sizes)
        assert content == expected_content, sizes
        assert [(name, arguments) for _, name, arguments in calls] == expected_calls, sizes
        for _, _, arguments in calls:
            json.loads(arguments)
        assert parser.parsed.ok == whole.ok
        assert [c.id for c in parser.parsed.calls] == [i for i, _, _ in calls]
        assert parser.finish_reason("stop") == whole.finish_reason("stop")
        if not whole.ok or not whole.calls:
            assert content == text  # what a client sees of an answer with no (good) calls


@pytest.mark.parametrize(
    ("fmt", "pieces", "sent"),
    [
        ("hermes", ["if a <", " b then", " {x}", " end"], "if a < b then {x} end"),
        ("hermes", ["<tool", "s>", " are nice"], "<tools> are nice"),
        ("llama3", ["{x", "} is a set", " and so on"], "{x} is a set and so on"),
        ("llama3", ['{"a', '": 1}', " ok"], '{"a": 1} ok'),
        ("llama3", ["  x <|py", "thon is nice"], "  x <|python is nice"),
        ("mistral", ["[TOOL", "S] and [1, 2]", " done"], "[TOOLS] and [1, 2] done"),
        ("none", ["<tool_call>", " raw"], "<tool_call> raw"),
    ],
)
def test_content_that_only_looks_like_a_call_is_sent_before_the_end(fmt, pieces, sent) -> None:
    parser = StreamParser(fmt, TOOLS)
    early = "".join(d.content for piece in pieces for d in parser.feed(piece))
    assert early == sent
    assert [d.as_dict() for d in parser.finish()] == []


def test_a_stream_holds_only_what_may_start_a_call() -> None:
    parser = StreamParser("hermes", TOOLS)
    assert [d.as_dict() for d in parser.feed("Hello")] == [{"content": "Hello"}]
    assert parser.feed(" \n<tool") == []  # whitespace and a marker's start are held
    assert parser.feed("_call>\n{") == []  # a call has begun
    assert parser.feed('"name": "search", "arguments": {}}\n</tool_call>') == []
    deltas = [d.as_dict() for d in parser.finish()]
    call_id = deltas[0]["tool_calls"][0]["id"]
    assert deltas == [
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "search", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
    ]
    assert parser.finish_reason("stop") == "tool_calls"


def test_llama3_holds_an_opening_brace_until_its_first_key_is_known() -> None:
    parser = StreamParser("llama3", TOOLS)
    assert parser.feed(" \n{") == []
    assert parser.feed(' "na') == []
    assert parser.feed('me": "search", "parameters": {}}') == []
    [header, arguments] = parser.finish()
    assert header.tool_call["function"]["name"] == "search"
    assert arguments.tool_call["function"]["arguments"] == "{}"


def test_a_malformed_call_in_a_stream_is_flushed_as_content() -> None:
    text = 'Answer: <tool_call>\n{"name": "search", "arguments": {"q": oops}}\n</tool_call>'
    parser = StreamParser("hermes", TOOLS)
    early = [d for ch in text for d in parser.feed(ch)]
    assert "".join(d.content for d in early) == "Answer:"
    last = parser.finish()
    assert [d.as_dict() for d in last] == [{"content": text[len("Answer:") :]}]
    assert not parser.parsed.ok and parser.finish_reason("stop") == "stop"


# --- formats of the templates ----------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "name", "fmt"),
    [
        (None, "qwen2.5", "none"),
        ("", "qwen2.5", "none"),
        ("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", "smollm2", "none"),
        ("{% if tools %}... <tool_call>\\n{{'name'}}</tool_call>{% endif %}", "any", "hermes"),
        ("{{ '[TOOL_CALLS][' }}{% for t in message.tool_calls %}", "any", "mistral"),
        ("{{- '<|python_tag|>' + tool_call.name }}", "any", "llama3"),
        ("{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}", "any", "llama3"),
        ("{% if tools %}{{ tools | tojson }}{% endif %}", "Meta-Llama-3.1-8B", "llama3"),
        ("{% if tools %}{{ tools | tojson }}{% endif %}", "Mistral-Nemo", "mistral"),
        ("{% if tools %}{{ tools | tojson }}{% endif %}", "some-finetune", "hermes"),
    ],
)
def test_detect_format(template: str | None, name: str, fmt: str) -> None:
    assert detect_format(template, name) == fmt


@pytest.mark.needs_models
def test_the_real_templates_name_their_format(target_path, smol_path) -> None:
    qwen = read_info(target_path).metadata["tokenizer.chat_template"]
    assert detect_format(qwen, "qwen2.5-coder-1.5b") == "hermes"
    smol = read_info(smol_path).metadata["tokenizer.chat_template"]
    assert detect_format(smol, "smollm2-135m") == "none"


@pytest.mark.needs_models
def test_a_call_written_by_the_real_qwen_template_parses_back(target_path) -> None:
    source = read_info(target_path).metadata["tokenizer.chat_template"]
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": compact(TRICKY)},
        },
        {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}},
    ]
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": calls},
    ]
    rendered = render_template(source, messages, add_generation_prompt=False)
    # The generation prompt ends with "<|im_start|>assistant\n": the answer starts after it.
    turn = rendered.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    parsed = parse(turn, detect_format(source, "qwen"), allowed=TOOLS)
    assert parsed.ok and parsed.content == "Checking."
    assert names_and_arguments(parsed) == [("get_weather", TRICKY), ("search", {"q": "x"})]
    _, _, content, streamed = stream(turn, "hermes", [4])
    assert content == "Checking." and [(n, json.loads(a)) for _, n, a in streamed] == [
        ("get_weather", TRICKY),
        ("search", {"q": "x"}),
    ]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"city": "Porto"}}',
        '```json\n{"name": "get_weather", "arguments": {"city": "Porto"}}\n```',
        '{{"name": "get_weather", "arguments": {"city": "Porto"}}}',
    ],
)
def test_hermes_models_calling_with_bare_json_are_read(text):
    """What small models taught the Hermes format write instead of <tool_call> blocks."""
    from edgespec.server.chunks import read_calls

    parsed = read_calls(text, "hermes", {"get_weather"})
    assert parsed.ok and [c.name for c in parsed.calls] == ["get_weather"]
    assert json.loads(parsed.calls[0].arguments) == {"city": "Porto"}
    assert read_calls(text, "hermes", {"other"}).calls == []  # only an offered function
    assert read_calls("The weather is {sunny}.", "hermes", {"get_weather"}).calls == []


def _answer(*, stream: bool = True, parallel: bool = True):
    """A chat answer with tools offered (Hermes format), before any event."""
    from edgespec.api import settings_from
    from edgespec.server.chunks import Answer
    from edgespec.server.schemas import Job
    from edgespec.server.tools import ToolSetup

    tools = ToolSetup(
        [{"type": "function", "function": {"name": "get_weather"}}],
        frozenset({"get_weather"}),
        "hermes",
        parallel=parallel,
    )
    job = Job("chat", Request((1,), settings_from()), stream, False, "m", tools=tools)
    return Answer(job, lambda token: b"x")


def _done(pieces: list[str]):
    from edgespec.decoding.events import Done, Stats

    return Done(text="".join(pieces), tail="", stop_reason="eos", stats=Stats(tokens=len(pieces)))


def _stream_answer(pieces: list[str], *, parallel: bool = True) -> list[dict]:
    """The chunks a streamed chat answer with tools offered (Hermes format) gives."""
    from edgespec.decoding.events import Token

    answer = _answer(parallel=parallel)
    out = [c for i, piece in enumerate(pieces) for c in answer.add(Token(i, piece, "plain"))]
    return out + answer.finish(_done(pieces))


@pytest.mark.parametrize(
    "pieces",
    [
        ["\n", '{"name": "get_weather", ', '"arguments": {"city": "Porto"}}'],
        ["```json\n", '{"name": "get_weather", "arguments": ', '{"city": "Porto"}}', "\n```"],
        ["<tool_call>\n", '{"name": "get_weather", "arguments": {"city": "Porto"}}', "\n</tool_call>"],
    ],
)
def test_a_streamed_call_comes_as_tool_call_deltas(pieces):
    chunks = _stream_answer(pieces)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Porto"}
    assert not any(d.get("content") for d in deltas)  # nothing of the call leaks as text
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_streamed_answer_that_is_no_call_is_content():
    pieces = ["{Braces} ", "are ", "fine."]
    deltas = [c["choices"][0]["delta"] for c in _stream_answer(pieces) if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "".join(pieces)
    assert not any("tool_calls" in d for d in deltas)


TWO_CALLS = {
    "tagged": [
        "<tool_call>\n",
        '{"name": "get_weather", "arguments": {"city": "Porto"}}',
        "\n</tool_call>\n<tool_call>\n",
        '{"name": "get_weather", "arguments": {"city": "Lyon"}}',
        "\n</tool_call>",
    ],
    "bare": [
        '{"name": "get_weather", "arguments": {"city": "Porto"}}\n',
        '{"name": "get_weather", "arguments": {"city": "Lyon"}}',
    ],
}


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("pieces", list(TWO_CALLS.values()), ids=list(TWO_CALLS))
def test_parallel_tool_calls_false_keeps_the_first_call_streamed_as_whole(pieces, parallel):
    whole = _answer(stream=False, parallel=parallel).whole(_done(pieces))
    whole_calls = [c["function"] for c in whole["choices"][0]["message"]["tool_calls"]]
    assert len(whole_calls) == (2 if parallel else 1)

    deltas = [c["choices"][0]["delta"] for c in _stream_answer(pieces, parallel=parallel) if c["choices"]]
    streamed: dict[int, dict] = {}
    for call in (d["tool_calls"][0] for d in deltas if "tool_calls" in d):
        function = streamed.setdefault(call["index"], {"name": "", "arguments": ""})
        function["name"] += call["function"].get("name", "")
        function["arguments"] += call["function"]["arguments"]
    assert [streamed[index] for index in sorted(streamed)] == whole_calls
    assert json.loads(whole_calls[0]["arguments"]) == {"city": "Porto"}
    assert not any(d.get("content") for d in deltas)


def test_a_stream_parser_without_parallel_calls_sends_the_first_call_only():
    text = hermes_call("search", {"q": "a"}) + "\n" + hermes_call("noop", {})
    parser = StreamParser("hermes", TOOLS, parallel=False)
    deltas = parser.feed(text) + parser.finish()
    calls = [d.tool_call for d in deltas if d.tool_call is not None]
    assert {call["index"] for call in calls} == {0}
    assert [call["function"].get("name") for call in calls] == ["search", None]
    assert len(parser.parsed.calls) == 2  # the parse itself still sees both
    assert parser.finish_reason("stop") == "tool_calls"

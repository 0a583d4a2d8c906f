"""The benchmark's prompt corpus: requests in eleven categories, each split in halves.

A drafter or a controller tuned on one prompt learns that prompt; the speed-ups it shows
there need not survive a new one. So every category holds at least eight prompts, split
into a ``dev`` half (tune and explore on it) and a ``test`` half (report only from it).
Prompts are written in pairs of the same kind, one to each half, so that both halves cover
every kind (a rename and a bug fix, a wrapped e-mail and a flowing article, …).

The prompts are data: ``data/corpus/<category>.jsonl``, one JSON object a line with its
``id``, ``split`` and ``source``, and what is sent: ``text``, one user message, in most
categories; in ``agent``, ``messages`` (an OpenAI conversation that may hold assistant
``tool_calls`` and ``tool`` results) and ``tools`` (an OpenAI tools list); in
``structured``, ``text`` and the ``json_schema`` the answer must follow. ``short`` holds
one-line questions answered in a sentence or two (16-64 tokens): too short to repay a
trial of the draft model. Code editing, agent and structured prompts also name their
``kind``. A prompt's half is written on its own line, so adding or moving a line never
moves another prompt to the other half. Every prompt was written for edgespec;
``source`` names the public benchmark whose *style* it follows, not a text it was taken
from. Answers come from the default target (Qwen2.5-Coder-1.5B-Instruct), greedy, with
the model's chat template (tools and tool calls in its own format), under the schema's
grammar where one is given: build a prompt with ``prompt_tokens`` and its settings with
``settings_extras``, which every consumer shares. Each prompt stays well under 700
tokens, so a 2-core CPU prefills it in seconds.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgespec.errors import EdgespecError

if TYPE_CHECKING:
    from edgespec.api import EdgeSpec

CATEGORIES = (
    "code writing",
    "code editing",
    "code completion",
    "summarization",
    "rag",
    "open chat",
    "translation",
    "math reasoning",
    "agent",
    "structured",
    "short",
)
SPLITS = ("dev", "test", "all")
EDIT_KINDS = ("rename", "signature", "bugfix", "docstring", "typehints", "reformat")
# call: a tool call whose arguments copy the conversation; round-trip: the answer after a
# tool's result; file-loop: an edit of a file the conversation has read.
AGENT_KINDS = ("call", "round-trip", "file-loop")
# extract: a record from prose; classify: labels from enums; rewrite: a given JSON record
# transformed; tool-args: a tool's arguments from a request.
STRUCTURED_KINDS = ("extract", "classify", "rewrite", "tool-args")
KINDS: dict[str, tuple[str, ...]] = {
    "code editing": EDIT_KINDS,
    "agent": AGENT_KINDS,
    "structured": STRUCTURED_KINDS,
}
CORPUS_DIR = Path(__file__).with_name("data") / "corpus"


@dataclass(frozen=True)
class CorpusPrompt:
    id: str
    category: str
    split: str  # "dev" or "test"
    text: str  # the user message, sent through the model's chat template ("" where messages are)
    source: str  # what it is modelled on
    kind: str = ""  # in a category with kinds: one of KINDS[category]
    # Lists and dicts, left out of the hash so that a prompt stays hashable.
    # agent: the conversation so far and the tools it offers, in OpenAI's shapes
    messages: list[dict[str, Any]] | None = field(default=None, hash=False)
    tools: list[dict[str, Any]] | None = field(default=None, hash=False)
    # structured: the JSON schema the answer follows
    json_schema: dict[str, Any] | None = field(default=None, hash=False)


def conversation(prompt: CorpusPrompt) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """What a prompt sends: its messages (its text as one user message where it has none)
    and the tools it offers (None: none). Copies: a caller may change them freely."""
    if prompt.messages is None:
        return [{"role": "user", "content": prompt.text}], None
    return copy.deepcopy(prompt.messages), copy.deepcopy(prompt.tools)


def prompt_tokens(lm: EdgeSpec, prompt: CorpusPrompt) -> list[int]:
    """A prompt's tokens: its conversation and tools through the target's chat template."""
    messages, tools = conversation(prompt)
    return lm.prompt_tokens(messages, chat=True, tools=tools)


_FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)


def predicted_output(prompt: CorpusPrompt) -> str | None:
    """What an editor would send as the Predicted Output of a prompt that hands over code
    to change: the first fenced block of its text (the file before the edit); None where
    it has none."""
    found = _FENCE.search(prompt.text)
    return found.group(1) if found else None


def settings_extras(prompt: CorpusPrompt) -> dict[str, Any]:
    """The keywords of ``api.settings_from`` a prompt asks for: its JSON schema, if any."""
    return {} if prompt.json_schema is None else {"json_schema": copy.deepcopy(prompt.json_schema)}


def file_name(category: str) -> str:
    """The file of a category's prompts in the corpus folder: ``code editing`` → ``code-editing.jsonl``."""
    return category.replace(" ", "-") + ".jsonl"


def fields_of(category: str) -> tuple[str, ...]:
    """The fields every line of a category has, and no others."""
    kind = ("kind",) if category in KINDS else ()
    sent = {"agent": ("messages", "tools"), "structured": ("text", "json_schema")}.get(category, ("text",))
    return ("id", "split", "source", *kind, *sent)


_ROLES = ("system", "user", "assistant", "tool")


def _is_object(value: Any) -> bool:
    return isinstance(value, dict)


def _messages_problem(messages: Any) -> str:
    """What is wrong with a conversation ("" when nothing is): OpenAI messages whose tool
    calls carry a function name and JSON-object arguments, ending where the model answers."""
    if not isinstance(messages, list) or not messages or not all(map(_is_object, messages)):
        return "must be a non-empty list of chat messages (objects)"
    for n, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES:
            return f"message {n} needs a role ({', '.join(_ROLES)})"
        calls = message.get("tool_calls")
        if calls is not None and (role != "assistant" or not isinstance(calls, list) or not calls):
            return f"message {n}: only an assistant message carries tool_calls, a non-empty list"
        if not isinstance(content, str) and not (content is None and calls):
            return f"message {n} needs text content"
        for call in calls or []:
            function = call.get("function") if _is_object(call) else None
            if not _is_object(function) or not isinstance(function.get("name"), str):
                return f"message {n}: each tool call needs a function with a name"
            try:
                arguments = json.loads(function.get("arguments"))
            except (TypeError, ValueError):
                arguments = None
            if not _is_object(arguments):
                return f"message {n}: a tool call's arguments must be the JSON text of an object"
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            return f"message {n}: a tool result needs its tool_call_id"
    if messages[-1]["role"] not in ("user", "tool"):
        return "must end with a user message or a tool result (the model answers next)"
    return ""


def _tools_problem(tools: Any) -> str:
    if not isinstance(tools, list) or not tools or not all(map(_is_object, tools)):
        return "must be a non-empty list of tool definitions (objects)"
    for n, tool in enumerate(tools):
        function = tool.get("function")
        if (
            tool.get("type") != "function"
            or not _is_object(function)
            or not isinstance(function.get("name"), str)
            or not _is_object(function.get("parameters"))
        ):
            return f"tool {n} needs type 'function' and a function with a name and parameters"
    return ""


def _field_problem(name: str, value: Any) -> str:
    """What is wrong with one field's value ("" when nothing is)."""
    if name == "messages":
        return _messages_problem(value)
    if name == "tools":
        return _tools_problem(value)
    if name == "json_schema":
        return "" if _is_object(value) and value else "must be a JSON schema (a non-empty object)"
    return "" if isinstance(value, str) and value.strip() else "must be a non-empty string"


def _parse(line: str, category: str, where: str) -> CorpusPrompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise EdgespecError(f"{where}: not valid JSON ({e.msg}, column {e.colno})") from None
    if not isinstance(record, dict):
        raise EdgespecError(f"{where}: not a JSON object")
    fields = fields_of(category)
    for name in fields:
        if name not in record:
            raise EdgespecError(f"{where}: missing field {name!r}")
        problem = _field_problem(name, record[name])
        if problem:
            raise EdgespecError(f"{where}: field {name!r} {problem}")
    unknown = sorted(set(record) - set(fields))
    if unknown:
        raise EdgespecError(f"{where}: unknown field {unknown[0]!r} (known here: {', '.join(fields)})")
    if record["split"] not in ("dev", "test"):
        raise EdgespecError(f"{where}: unknown split {record['split']!r} (known: dev, test)")
    kind = record.get("kind", "")
    if kind and kind not in KINDS[category]:
        raise EdgespecError(f"{where}: unknown kind {kind!r} (known: {', '.join(KINDS[category])})")
    return CorpusPrompt(
        record["id"],
        category,
        record["split"],
        record.get("text", ""),
        record["source"],
        kind,
        messages=record.get("messages"),
        tools=record.get("tools"),
        json_schema=record.get("json_schema"),
    )


def load_corpus(directory: Path = CORPUS_DIR) -> list[CorpusPrompt]:
    """Every prompt in ``directory``, category by category in the order of ``CATEGORIES``
    and line by line within one. A file, a line or an id that is wrong is a one-line error
    naming the file and the line."""
    known = {file_name(category) for category in CATEGORIES}
    for path in sorted(directory.glob("*.jsonl")):
        if path.name not in known:
            raise EdgespecError(
                f"{path}: unknown category {path.stem.replace('-', ' ')!r} (known: {', '.join(CATEGORIES)})"
            )
    out: list[CorpusPrompt] = []
    seen: dict[str, str] = {}
    for category in CATEGORIES:
        path = directory / file_name(category)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise EdgespecError(f"{path}: cannot read the {category} prompts ({e.strerror})") from None
        except UnicodeDecodeError as e:
            raise EdgespecError(f"{path}: not UTF-8 text (byte {e.start})") from None
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            prompt = _parse(line, category, where)
            if prompt.id in seen:
                raise EdgespecError(f"{where}: duplicate id {prompt.id!r} (first at {seen[prompt.id]})")
            seen[prompt.id] = where
            out.append(prompt)
    return out


CORPUS: list[CorpusPrompt] = load_corpus()
BY_ID: dict[str, CorpusPrompt] = {p.id: p for p in CORPUS}


def select(
    split: str = "test", categories: list[str] | None = None, ids: list[str] | None = None
) -> list[CorpusPrompt]:
    """The prompts a benchmark runs: by id (any split) when ids are given, else one split
    of the chosen categories, in corpus order."""
    if split not in SPLITS:
        raise EdgespecError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    for category in categories or []:
        if category not in CATEGORIES:
            raise EdgespecError(f"unknown category {category!r} (known: {', '.join(CATEGORIES)})")
    if ids:
        for pid in ids:
            if pid not in BY_ID:
                raise EdgespecError(f"unknown prompt id {pid!r} (see the ids in {CORPUS_DIR})")
        chosen = [BY_ID[pid] for pid in dict.fromkeys(ids)]
        return [p for p in chosen if not categories or p.category in categories]
    return [
        p
        for p in CORPUS
        if (split == "all" or p.split == split) and (not categories or p.category in categories)
    ]

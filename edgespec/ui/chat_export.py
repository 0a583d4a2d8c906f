"""A chat as a file: Markdown to read and share, JSON to import back. An import is checked
whole before anything is returned, since it comes from outside and its text ends up in the
page (provenance sources become HTML attributes)."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import asdict
from typing import Any

from edgespec.errors import EdgespecError
from edgespec.ui.chat_store import StoredChat, StoredMessage

FORMAT = "edgespec-chat"
VERSION = 1
SOURCES = frozenset({"draft", "target", "bonus", "plain"})
_HEADINGS = {"user": "You", "assistant": "Assistant"}
_REQUIRED: Any = object()  # a field with no default
_KINDS = {str: "a string", dict: "an object", list: "a list", bool: "true or false"}
# Names Windows will not create, whatever the extension.
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


def to_markdown(chat: StoredChat) -> str:
    parts = [f"# {chat.title or 'Untitled chat'}"]
    if chat.system:
        parts.append("\n".join(f"> {line}".rstrip() for line in f"**System:** {chat.system}".splitlines()))
    for message in chat.messages:
        parts.append(f"## {_HEADINGS.get(message.role, message.role)}")
        parts.append(message.content.rstrip("\n"))
        figures = _figures(message.stats)
        if figures:
            parts.append(f"*{figures}*")
    return "\n\n".join(parts) + "\n"


def _figures(stats: dict | None) -> str:
    """One line of an answer's figures, from those its stats hold."""
    if not stats:
        return ""

    def number(key: str) -> float | None:
        value = stats.get(key)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    shown = [
        (number("tokens"), "{:.0f} tokens"),
        (number("tokens_per_second"), "{:.1f} tok/s"),
        (number("tau"), "τ {:.2f}"),
    ]
    return " · ".join(form.format(value) for value, form in shown if value is not None)


def to_json(chat: StoredChat) -> str:
    body = {
        "format": FORMAT,
        "version": VERSION,
        "title": chat.title,
        "system": chat.system,
        "settings": chat.settings,
        "named": chat.named,
        "created": chat.created,
        "updated": chat.updated,
        "messages": [asdict(message) for message in chat.messages],
    }
    return json.dumps(body, ensure_ascii=False, indent=2) + "\n"


def from_json(text: str | bytes) -> StoredChat:
    """The chat in an export, checked whole; ``id`` is "" (the store gives it one).
    Anything wrong raises ``EdgespecError`` with one line naming it."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # bad JSON, bytes that are no Unicode, nested too deep
        raise _bad(f"not JSON ({_first_line(exc)})") from None
    if not isinstance(data, dict):
        raise _bad(f"not an edgespec chat export (a JSON {type(data).__name__}, not an object)")
    if data.get("format") != FORMAT:
        raise _bad(f"not an edgespec chat export (format {data.get('format')!r})")
    version = data.get("version")
    if not _is_int(version) or version < 1:
        raise _bad(f"unknown export version {version!r}")
    if version > VERSION:
        raise _bad(f"a newer export version {version}; this edgespec reads version {VERSION}")
    messages = _get(data, "messages", list, _REQUIRED, "")
    return StoredChat(
        id="",
        title=_get(data, "title", str, "", ""),
        system=_get(data, "system", str, "", ""),
        settings=_get(data, "settings", dict, {}, ""),
        created=_time(data, "created", ""),
        updated=_time(data, "updated", ""),
        messages=[_message(item, f"message {n}: ") for n, item in enumerate(messages, 1)],
        named=_get(data, "named", bool, False, ""),
    )


def _message(item: Any, where: str) -> StoredMessage:
    if not isinstance(item, dict):
        raise _bad(f"{where}must be an object")
    if item.get("role") not in _HEADINGS:
        raise _bad(f"{where}role must be user or assistant, not {item.get('role')!r}")
    steps = _get(item, "steps", list, None, where)
    if steps is not None and not all(isinstance(step, dict) for step in steps):
        raise _bad(f"{where}steps must be objects")
    return StoredMessage(
        role=item["role"],
        content=_get(item, "content", str, _REQUIRED, where),
        stats=_get(item, "stats", dict, None, where),
        provenance=_provenance(item.get("provenance"), where),
        steps=steps,
        settings=_get(item, "settings", dict, None, where),
        created=_time(item, "created", where),
    )


def _provenance(runs: Any, where: str) -> list[list[str]] | None:
    if runs is None:
        return None
    if not isinstance(runs, list):
        raise _bad(f"{where}provenance must be a list of [text, source] runs")
    for run in runs:
        if not (isinstance(run, list) and len(run) == 2 and all(isinstance(s, str) for s in run)):
            raise _bad(f"{where}provenance runs must be [text, source] pairs of strings, not {run!r:.60}")
        if run[1] not in SOURCES:
            raise _bad(
                f"{where}provenance source must be one of {', '.join(sorted(SOURCES))}, not {run[1]!r:.40}"
            )
    return runs


def _get(obj: dict, key: str, kind: type, default: Any, where: str) -> Any:
    """``obj[key]`` of type ``kind``; missing or null gives ``default``, or fails if required."""
    value = obj.get(key)
    if value is None:
        if default is _REQUIRED:
            raise _bad(f"{where}{key} is missing")
        return default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _bad(f"{where}{key} must be {_KINDS[kind]}, not {type(value).__name__}")
    return value


def _time(obj: dict, key: str, where: str) -> float:
    value = obj.get(key)
    if value is None:
        return 0.0  # the store stamps it
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(f"{where}{key} must be a number of seconds, not {value!r:.40}")
    return float(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _bad(reason: str) -> EdgespecError:
    return EdgespecError(f"Cannot import the chat: {reason}.")


def export_filename(chat: StoredChat, suffix: str) -> str:
    """A file name safe on every system: the title as an ASCII slug, else "chat"."""
    ascii_title = unicodedata.normalize("NFKD", chat.title).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_title.lower()).strip("-")[:60].rstrip("-") or "chat"
    if slug in _RESERVED:
        slug = f"chat-{slug}"
    return f"{slug}.{suffix.lstrip('.')}"

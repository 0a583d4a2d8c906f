"""A chat as a file: Markdown to read and share, JSON to import back; a folder of chats as
one JSON bundle. An import is checked whole before anything is written, since it comes
from outside and its text ends up in the page (provenance sources become HTML attributes,
file names are shown).

The chat export (format "edgespec-chat", version 2; version 1 files still import) holds
the chat, the folder it was in (name and system prompt), the file versions it accepted,
and every attached file it names, once: name, kind, extracted text, and the bytes in
base64 under their sha256, which an import recomputes and refuses on a mismatch.

Importing, two levels:
- ``import_export(store, text)``: the whole export into the store (its files, versions,
  and its folder: the folder here of that name, made if there is none) — what the app uses;
- ``read_export(text)`` gives the checked ``ChatExport`` (chat, files, versions, folder)
  without writing; ``from_json(text)`` just its chat (id "", no folder), as before.
  ``ChatStore.import_chat(chat, attachments, versions)`` writes one.

The folder bundle (format "edgespec-folder"): the folder's name and system prompt and each
of its chats as a chat export; ``import_folder`` makes a new folder, named apart from those
there ("Work (2)")."""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
import math
import re
import unicodedata
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from edgespec.errors import EdgespecError
from edgespec.ui.chat_store import (
    DEFAULT_ATTACHMENT_LIMIT,
    ChatNotFound,
    ChatStore,
    FolderNotFound,
    StoredAttachment,
    StoredChat,
    StoredFolder,
    StoredMessage,
    StoredVersion,
    format_size,
)

FORMAT = "edgespec-chat"
VERSION = 2
FOLDER_FORMAT = "edgespec-folder"
FOLDER_VERSION = 1
SOURCES = frozenset({"draft", "target", "bonus", "plain"})
_HEADINGS = {"user": "You", "assistant": "Assistant"}
_REQUIRED: Any = object()  # a field with no default
_KINDS = {str: "a string", dict: "an object", list: "a list", bool: "true or false", int: "an integer"}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>#|])")
# Names Windows will not create, whatever the extension.
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


@dataclass
class ChatExport:
    """A chat export, checked: what ``ChatStore.import_chat`` takes, and where it was filed."""

    chat: StoredChat  # id "", folder None: both are the store's
    attachments: list[StoredAttachment] = field(default_factory=list)  # those the chat names
    versions: list[StoredVersion] = field(default_factory=list)  # in the order they were accepted
    folder: tuple[str, str] | None = None  # (name, system prompt) of the folder it was in


class _Invalid(Exception):
    """What is wrong with an import, said once at the top (chat or folder)."""


# -- Markdown --------------------------------------------------------------------------


def to_markdown(chat: StoredChat) -> str:
    parts = [f"# {chat.title or 'Untitled chat'}"]
    if chat.system:
        parts.append("\n".join(f"> {line}".rstrip() for line in f"**System:** {chat.system}".splitlines()))
    for message in chat.messages:
        parts.append(f"## {_HEADINGS.get(message.role, message.role)}")
        parts.append(message.content.rstrip("\n"))
        if message.attachments:
            parts.append(f"*Attached: {_attached(message.attachments)}*")
        figures = _figures(message.stats)
        if figures:
            parts.append(f"*{figures}*")
    return "\n\n".join(parts) + "\n"


def _attached(refs: list[dict]) -> str:
    """The files a message carries, on one line; names escaped, since Markdown reads them."""
    shown = []
    for ref in refs:
        name = _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(ref.get("name", "")).split()))
        size = ref.get("size")
        shown.append(f"{name} ({format_size(size)})" if _is_int(size) and size >= 0 else name)
    return ", ".join(shown)


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


# -- JSON out ----------------------------------------------------------------------------


def to_json(chat: StoredChat, store: ChatStore | None = None) -> str:
    """The chat export. ``store`` (the chat's) brings its files, versions and folder: a
    chat naming files cannot be exported without it."""
    return _dumps(_chat_body(chat, store))


def folder_to_json(store: ChatStore, folder_id: str) -> str:
    """The folder bundle: the folder and each chat in it, newest first."""
    folder = store.folder(folder_id)
    chats = []
    for summary in store.summaries(folder=folder_id):
        try:
            chats.append(_chat_body(store.load(summary.id), store))
        except ChatNotFound:  # deleted by another tab meanwhile: not in the bundle
            continue
    body = {
        "format": FOLDER_FORMAT,
        "version": FOLDER_VERSION,
        "name": folder.name,
        "system": folder.system,
        "created": folder.created,
        "chats": chats,
    }
    return _dumps(body)


def _dumps(body: dict) -> str:
    return json.dumps(body, ensure_ascii=False, indent=2) + "\n"


def _chat_body(chat: StoredChat, store: ChatStore | None) -> dict[str, Any]:
    refs = [ref for message in chat.messages for ref in message.attachments or []]
    if refs and store is None:
        raise ValueError("a chat with attached files is exported with its store: to_json(chat, store)")
    versions = store.versions(chat.id) if store is not None else []
    names: dict[str, str] = {}  # each file once, under the first name it was attached as
    for ref in [*refs, *(asdict(version) for version in versions)]:
        names.setdefault(ref["sha256"], ref["name"])
    return {
        "format": FORMAT,
        "version": VERSION,
        "title": chat.title,
        "system": chat.system,
        "settings": chat.settings,
        "named": chat.named,
        "created": chat.created,
        "updated": chat.updated,
        "folder": _folder_body(chat, store),
        "messages": [asdict(message) for message in chat.messages],
        "versions": [{"name": v.name, "sha256": v.sha256, "created": v.created} for v in versions],
        "attachments": [_attachment_body(store, sha, name) for sha, name in names.items()] if store else [],
    }


def _folder_body(chat: StoredChat, store: ChatStore | None) -> dict[str, str] | None:
    if store is None or chat.folder is None:
        return None
    try:
        folder = store.folder(chat.folder)
    except FolderNotFound:  # deleted meanwhile: the chat is exported as in no folder
        return None
    return {"name": folder.name, "system": folder.system}


def _attachment_body(store: ChatStore, sha256: str, name: str) -> dict[str, Any]:
    stored = store.attachment(sha256)
    return {
        "sha256": sha256,
        "name": name,
        "kind": stored.kind,
        "size": stored.size,
        "text": stored.text,
        "data": base64.b64encode(stored.data).decode("ascii"),
    }


# -- JSON in -----------------------------------------------------------------------------


def from_json(text: str | bytes) -> StoredChat:
    """The chat in an export, checked whole; ``id`` is "" (the store gives it one).
    Anything wrong raises ``EdgespecError`` with one line naming it."""
    return read_export(text).chat


def read_export(text: str | bytes, attachment_limit: int = DEFAULT_ATTACHMENT_LIMIT) -> ChatExport:
    """The export checked whole: every field, every file's base64, sha256 and size against
    ``attachment_limit``; nothing written. Anything wrong: one-line ``EdgespecError``."""
    try:
        return _chat_export(_parsed(text, "chat"), attachment_limit)
    except _Invalid as exc:
        raise EdgespecError(f"Cannot import the chat: {exc}.") from None


def import_export(store: ChatStore, text: str | bytes) -> StoredChat:
    """The export into ``store`` as a new chat, with its files and versions, in the folder
    of its folder's name (made if there is none); checked whole first."""
    export = read_export(text, store.attachment_limit)
    folder = _folder_named(store, *export.folder) if export.folder else None
    chat = replace(export.chat, folder=folder.id if folder else None)
    return store.import_chat(chat, export.attachments, export.versions)


def import_folder(store: ChatStore, text: str | bytes) -> StoredFolder:
    """A folder bundle as a new folder (its name made unique here) holding its chats;
    every chat is checked before anything is written."""
    try:
        data = _parsed(text, "folder")
        name = " ".join(_get(data, "name", str, _REQUIRED, "").split())
        if not name:
            raise _Invalid("the folder's name is empty")
        system = _get(data, "system", str, "", "")
        exports = []
        for n, item in enumerate(_get(data, "chats", list, _REQUIRED, ""), 1):
            try:
                exports.append(_chat_export(item, store.attachment_limit))
            except _Invalid as exc:
                raise _Invalid(f"chat {n}: {exc}") from None
    except _Invalid as exc:
        raise EdgespecError(f"Cannot import the folder: {exc}.") from None
    folder = store.create_folder(_unique_name(store, name), system)
    for export in reversed(exports):  # oldest first: each import is listed above the one before
        store.import_chat(replace(export.chat, folder=folder.id), export.attachments, export.versions)
    return folder


def _folder_named(store: ChatStore, name: str, system: str) -> StoredFolder:
    """The folder here called ``name`` (ignoring case), else a new one."""
    for attempt in range(2):
        found = [f for f in store.folders() if f.name.casefold() == " ".join(name.split()).casefold()]
        if found:
            return found[0]
        try:
            return store.create_folder(name, system)
        except EdgespecError:  # another tab made it meanwhile: found on the next look
            if attempt:
                raise
    raise AssertionError("unreachable")


def _unique_name(store: ChatStore, name: str) -> str:
    taken = {folder.name.casefold() for folder in store.folders()}
    if name.casefold() not in taken:
        return name
    return next(f"{name} ({n})" for n in itertools.count(2) if f"{name} ({n})".casefold() not in taken)


def _parsed(text: str | bytes, what: str) -> dict:
    """The JSON object of an export of ``what`` ("chat" or "folder"), its format and
    version checked."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # bad JSON, bytes that are no Unicode, nested too deep
        raise _Invalid(f"not JSON ({_first_line(exc)})") from None
    return _checked_format(data, what)


def _checked_format(data: Any, what: str) -> dict:
    form, latest = (FORMAT, VERSION) if what == "chat" else (FOLDER_FORMAT, FOLDER_VERSION)
    if not isinstance(data, dict):
        raise _Invalid(f"not an edgespec {what} export (a JSON {type(data).__name__}, not an object)")
    if data.get("format") != form:
        raise _Invalid(f"not an edgespec {what} export (format {data.get('format')!r})")
    version = data.get("version")
    if not _is_int(version) or version < 1:
        raise _Invalid(f"unknown export version {version!r}")
    if version > latest:
        raise _Invalid(f"a newer export version {version}; this edgespec reads version {latest}")
    return data


def _chat_export(data: Any, limit: int) -> ChatExport:
    data = _checked_format(data, "chat")
    messages = _get(data, "messages", list, _REQUIRED, "")
    files = _attachments(_get(data, "attachments", list, [], ""), limit)
    chat = StoredChat(
        id="",
        title=_get(data, "title", str, "", ""),
        system=_get(data, "system", str, "", ""),
        settings=_get(data, "settings", dict, {}, ""),
        created=_time(data, "created", ""),
        updated=_time(data, "updated", ""),
        messages=[_message(item, f"message {n}: ", files) for n, item in enumerate(messages, 1)],
        named=_get(data, "named", bool, False, ""),
    )
    versions = [
        _version(item, f"version {n}: ", files)
        for n, item in enumerate(_get(data, "versions", list, [], ""), 1)
    ]
    named = {ref["sha256"] for m in chat.messages for ref in m.attachments or []} | {
        v.sha256 for v in versions
    }
    # Files no message or version names are left out: nothing would ever collect them.
    return ChatExport(chat, [a for sha, a in files.items() if sha in named], versions, _folder(data))


def _folder(data: dict) -> tuple[str, str] | None:
    folder = _get(data, "folder", dict, None, "")
    if folder is None:
        return None
    name = " ".join(_get(folder, "name", str, _REQUIRED, "folder ").split())
    if not name:
        raise _Invalid("folder name is empty")
    return name, _get(folder, "system", str, "", "folder ")


def _attachments(items: list, limit: int) -> dict[str, StoredAttachment]:
    """The export's files by sha256, each decoded and checked against its hash and ``limit``."""
    files: dict[str, StoredAttachment] = {}
    for n, item in enumerate(items, 1):
        where = f"attachment {n}: "
        if not isinstance(item, dict):
            raise _Invalid(f"{where}must be an object")
        sha256 = _sha256(item, where)
        where = f"attachment {n} ({_get(item, 'name', str, _REQUIRED, where)}): "
        kind, text = _get(item, "kind", str, _REQUIRED, where), _get(item, "text", str, _REQUIRED, where)
        try:
            data = base64.b64decode(_get(item, "data", str, _REQUIRED, where), validate=True)
        except (binascii.Error, ValueError):
            raise _Invalid(f"{where}data is not base64") from None
        if len(data) > limit:
            raise _Invalid(
                f"{where}it is {format_size(len(data))}, over the limit of {format_size(limit)} per file"
            )
        if hashlib.sha256(data).hexdigest() != sha256:
            raise _Invalid(f"{where}its data does not match its sha256 (the file was changed)")
        size = _get(item, "size", int, len(data), where)
        if size != len(data):
            raise _Invalid(f"{where}size {size} is not its data's {len(data)} bytes")
        files.setdefault(sha256, StoredAttachment(sha256, len(data), data, text, kind))
    return files


def _sha256(item: dict, where: str) -> str:
    sha256 = item.get("sha256")
    if not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise _Invalid(f"{where}sha256 must be 64 lowercase hex digits, not {sha256!r:.80}")
    return sha256


def _message(item: Any, where: str, files: dict[str, StoredAttachment]) -> StoredMessage:
    if not isinstance(item, dict):
        raise _Invalid(f"{where}must be an object")
    if item.get("role") not in _HEADINGS:
        raise _Invalid(f"{where}role must be user or assistant, not {item.get('role')!r}")
    steps = _get(item, "steps", list, None, where)
    if steps is not None and not all(isinstance(step, dict) for step in steps):
        raise _Invalid(f"{where}steps must be objects")
    refs = _get(item, "attachments", list, None, where)
    return StoredMessage(
        role=item["role"],
        content=_get(item, "content", str, _REQUIRED, where),
        stats=_get(item, "stats", dict, None, where),
        provenance=_provenance(item.get("provenance"), where),
        steps=steps,
        settings=_get(item, "settings", dict, None, where),
        created=_time(item, "created", where),
        attachments=None if refs is None else [_reference(ref, where, files) for ref in refs],
    )


def _reference(ref: Any, where: str, files: dict[str, StoredAttachment]) -> dict[str, Any]:
    """A message's file, as the store keeps it (the fields it knows, nothing else)."""
    if not isinstance(ref, dict):
        raise _Invalid(f"{where}attachments must be objects")
    sha256 = _sha256(ref, f"{where}attachment ")
    name = _get(ref, "name", str, _REQUIRED, f"{where}attachment ")
    if not name.strip():
        raise _Invalid(f"{where}an attachment's name is empty")
    if sha256 not in files:
        raise _Invalid(f"{where}attached file {name!r:.80} is not in the export")
    size = _get(ref, "size", int, _REQUIRED, f"{where}attachment ")
    tokens = _get(ref, "tokens", int, None, f"{where}attachment ")
    kind = _get(ref, "kind", str, _REQUIRED, f"{where}attachment ")
    return {"sha256": sha256, "name": name, "size": size, "tokens": tokens, "kind": kind}


def _version(item: Any, where: str, files: dict[str, StoredAttachment]) -> StoredVersion:
    if not isinstance(item, dict):
        raise _Invalid(f"{where}must be an object")
    sha256, name = _sha256(item, where), _get(item, "name", str, _REQUIRED, where)
    if not name.strip():
        raise _Invalid(f"{where}name is empty")
    if sha256 not in files:
        raise _Invalid(f"{where}file {name!r:.80} is not in the export")
    return StoredVersion(name, 0, sha256, _time(item, "created", where))  # numbered by the store


def _provenance(runs: Any, where: str) -> list[list[str]] | None:
    if runs is None:
        return None
    if not isinstance(runs, list):
        raise _Invalid(f"{where}provenance must be a list of [text, source] runs")
    for run in runs:
        if not (isinstance(run, list) and len(run) == 2 and all(isinstance(s, str) for s in run)):
            raise _Invalid(f"{where}provenance runs must be [text, source] pairs of strings, not {run!r:.60}")
        if run[1] not in SOURCES:
            raise _Invalid(
                f"{where}provenance source must be one of {', '.join(sorted(SOURCES))}, not {run[1]!r:.40}"
            )
    return runs


def _get(obj: dict, key: str, kind: type, default: Any, where: str) -> Any:
    """``obj[key]`` of type ``kind``; missing or null gives ``default``, or fails if required."""
    value = obj.get(key)
    if value is None:
        if default is _REQUIRED:
            raise _Invalid(f"{where}{key} is missing")
        return default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _Invalid(f"{where}{key} must be {_KINDS[kind]}, not {type(value).__name__}")
    return value


def _time(obj: dict, key: str, where: str) -> float:
    value = obj.get(key)
    if value is None:
        return 0.0  # the store stamps it
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Invalid(f"{where}{key} must be a number of seconds, not {value!r:.40}")
    return float(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def export_filename(chat: StoredChat, suffix: str) -> str:
    """A file name safe on every system: the title as an ASCII slug, else "chat"."""
    ascii_title = unicodedata.normalize("NFKD", chat.title).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_title.lower()).strip("-")[:60].rstrip("-") or "chat"
    if slug in _RESERVED:
        slug = f"chat-{slug}"
    return f"{slug}.{suffix.lstrip('.')}"

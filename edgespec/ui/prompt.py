"""What the model is sent for a chat: the one place a stored chat, its attachments and a new
question become chat messages. Every path that renders a chat (an answer, Regenerate, an
edit, whether a chat is warm, reading ahead) goes through here, so the same chat always
renders to the same tokens and its cached prefix is found again."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgespec.ui.chat_store import StoredMessage
from edgespec.ui.files import attachment_prefix, message_text

# sha256 -> the attachment's text (what the model reads); the store's lookup.
TextOf = Callable[[str], str]


@dataclass(frozen=True)
class Attached:
    """A file attached to a message: stored by its content's hash, shown as a chip."""

    name: str
    sha256: str
    size: int
    kind: str
    tokens: int

    def ref(self) -> dict:
        """How a stored message names it."""
        return {"sha256": self.sha256, "name": self.name, "size": self.size, "tokens": self.tokens,
                "kind": self.kind}  # fmt: skip


def user_content(message: StoredMessage, text_of: TextOf) -> str:
    """A stored message's text as the model reads it: its files first, then what was typed."""
    files = [(ref["name"], text_of(ref["sha256"])) for ref in message.attachments or []]
    return message_text(message.content, files) if files else message.content


def chat_prompt(system: str, kept: Sequence[StoredMessage], text_of: TextOf) -> list[dict[str, str]]:
    """The chat's messages, the system prompt first where there is one."""
    prompt = [{"role": "system", "content": system}] if system.strip() else []
    for message in kept:
        content = user_content(message, text_of) if message.role == "user" else message.content
        prompt.append({"role": message.role, "content": content})
    return prompt


def asked(question: str, files: Sequence[Attached], text_of: TextOf) -> dict[str, str]:
    """A new user message: its files first, then the question."""
    pairs = [(file.name, text_of(file.sha256)) for file in files]
    return {"role": "user", "content": message_text(question, pairs) if pairs else question}


def files_prefix(files: Sequence[Attached], text_of: TextOf) -> str:
    """The start every question sent with ``files`` begins with: what can be read ahead."""
    return attachment_prefix([(file.name, text_of(file.sha256)) for file in files])

"""The wire formats answered through the chat pipeline, each as a ``Wire``: how its body
becomes a chat body, how the chat answer (whole, or chunk by chunk) becomes its answer,
and its error shape. The translations themselves live in ``server.anthropic`` (Anthropic
Messages) and ``server.responses`` (OpenAI Responses)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from edgespec.server import anthropic, anthropic_out, responses
from edgespec.server.errors import ApiError
from edgespec.server.pipeline import SSE_COMMENT
from edgespec.server.schemas import Job


class Translator(Protocol):
    def feed(self, chunk: dict) -> list[str]: ...

    def finish(self) -> list[str]: ...


@dataclass(frozen=True)
class Wire:
    """``translate``: (the request's body, the server's response store) → (chat body,
    ignored field names); ``whole``: (chat answer, the request's body, the chat body, its
    job, the store) → the answer; ``streamer``: the same but the answer → a translator of
    chat chunks into events; ``error``: a refusal in the format's own shape."""

    translate: Callable[[Any, responses.ResponseStore], tuple[dict, list[str]]]
    whole: Callable[[dict, Any, dict, Job, responses.ResponseStore], dict]
    streamer: Callable[[Any, dict, Job, responses.ResponseStore], Translator]
    error: Callable[[ApiError], dict]
    keepalive: str = SSE_COMMENT  # what is sent while a stream waits (a long prompt)


def _asked_model(body: Any) -> str:
    """The model name the client sent, which Anthropic's answers echo."""
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else "default"


ANTHROPIC = Wire(
    translate=lambda body, _store: anthropic.chat_body(body),
    whole=lambda answer, body, _chat, _job, _store: anthropic.whole(answer, _asked_model(body)),
    streamer=lambda body, _chat, job, _store: anthropic.MessageStream(
        _asked_model(body), anthropic.message_id(job.id), input_tokens=len(job.request.prompt)
    ),
    error=lambda exc: anthropic.error_body(exc.status, exc.message),
    keepalive=anthropic_out.event("ping", {"type": "ping"}),  # Anthropic's own keep-alive
)


def _response(answer: dict, body: dict, chat: dict, store: responses.ResponseStore) -> dict:
    response = responses.whole(answer, body, responses.new_response_id())
    store.keep(body, chat, response)
    return response


class _KeptStream:
    """A Responses stream whose finished response is kept for ``previous_response_id``."""

    def __init__(self, body: dict, chat: dict, store: responses.ResponseStore):
        self.stream = responses.ResponseStream(body, responses.new_response_id())
        self.body, self.chat, self.store = body, chat, store

    def feed(self, chunk: dict) -> list[str]:
        return self.stream.feed(chunk)

    def finish(self) -> list[str]:
        events = self.stream.finish()
        if self.stream.response is not None:
            self.store.keep(self.body, self.chat, self.stream.response)
        return events


RESPONSES = Wire(
    translate=responses.chat_body,
    whole=lambda answer, body, chat, _job, store: _response(answer, body, chat, store),
    streamer=lambda body, chat, _job, store: _KeptStream(body, chat, store),
    error=lambda exc: exc.body(),  # OpenAI's own shape
)

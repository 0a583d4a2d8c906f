"""Every wire format the server answers in, each a ``Wire``: OpenAI's chat and text
completions, and Anthropic's Messages and OpenAI's Responses, translated over the chat
pipeline. A wire says how its body becomes a job (through a chat body, for a translated
format), how the answer (whole, or chunk by chunk) becomes its answer, and its error
shape; the routes (``server.app``) run every wire the same way. The translations
themselves live in ``server.anthropic`` (Anthropic Messages) and ``server.responses``
(OpenAI Responses)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from edgespec.api import EdgeSpec
from edgespec.server import anthropic, anthropic_out, chunks, responses
from edgespec.server.errors import ApiError
from edgespec.server.pipeline import SSE_COMMENT
from edgespec.server.schemas import Job, parse_chat, parse_completion


class Translator(Protocol):
    def feed(self, chunk: dict) -> list[str]: ...

    def finish(self) -> list[str]: ...


@dataclass(frozen=True)
class Exchange:
    """One request as its answer needs it: the body as sent, the OpenAI body it became
    (the same body for OpenAI's own formats), its job, and the server's store of
    Responses answers."""

    body: Any
    chat: Any
    job: Job
    store: responses.ResponseStore


@dataclass(frozen=True)
class Wire:
    """``translate``: (the request's body, the store) → (OpenAI body, ignored field
    names); ``parse``: that body → its job (it renders and tokenizes the prompt);
    ``whole``: (the OpenAI answer, the exchange) → the answer; ``streamer``: the exchange
    → a translator of OpenAI chunks into events; ``error``: a refusal, whatever it was,
    in the format's own shape."""

    translate: Callable[[Any, responses.ResponseStore], tuple[Any, list[str]]]
    parse: Callable[[Any, EdgeSpec], Job]
    whole: Callable[[dict, Exchange], dict]
    streamer: Callable[[Exchange], Translator]
    error: Callable[[ApiError], dict]
    keepalive: str = SSE_COMMENT  # what is sent while a stream waits (a long prompt)


class _Events:
    """OpenAI's own stream: each chunk an event as it is, then ``[DONE]``."""

    def feed(self, chunk: dict) -> list[str]:
        return [chunks.sse(chunk)]

    def finish(self) -> list[str]:
        return [chunks.sse("[DONE]")]


def _as_sent(body: Any, _store: responses.ResponseStore) -> tuple[Any, list[str]]:
    return body, []


def _openai(parse: Callable[[Any, EdgeSpec], Job]) -> Wire:
    return Wire(
        translate=_as_sent,
        parse=parse,
        whole=lambda answer, _exchange: answer,
        streamer=lambda _exchange: _Events(),
        error=lambda exc: exc.body(),
    )


CHAT_COMPLETIONS = _openai(parse_chat)
COMPLETIONS = _openai(parse_completion)


def _asked_model(body: Any) -> str:
    """The model name the client sent, which Anthropic's answers echo."""
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else "default"


ANTHROPIC = Wire(
    translate=lambda body, _store: anthropic.chat_body(body),
    parse=parse_chat,
    whole=lambda answer, exchange: anthropic.whole(answer, _asked_model(exchange.body)),
    streamer=lambda exchange: anthropic.MessageStream(
        _asked_model(exchange.body),
        anthropic.message_id(exchange.job.id),
        input_tokens=len(exchange.job.request.prompt),
    ),
    error=lambda exc: anthropic.error_body(exc.status, exc.message),
    keepalive=anthropic_out.event("ping", {"type": "ping"}),  # Anthropic's own keep-alive
)


def _response(answer: dict, exchange: Exchange) -> dict:
    response = responses.whole(answer, exchange.body, responses.new_response_id())
    exchange.store.keep(exchange.body, exchange.chat, response)
    return response


class _KeptStream:
    """A Responses stream whose finished response is kept for ``previous_response_id``."""

    def __init__(self, exchange: Exchange):
        self.stream = responses.ResponseStream(exchange.body, responses.new_response_id())
        self.exchange = exchange

    def feed(self, chunk: dict) -> list[str]:
        return self.stream.feed(chunk)

    def finish(self) -> list[str]:
        events = self.stream.finish()
        if self.stream.response is not None:
            kept = self.exchange
            kept.store.keep(kept.body, kept.chat, self.stream.response)
        return events


RESPONSES = Wire(
    translate=responses.chat_body,
    parse=parse_chat,
    whole=_response,
    streamer=_KeptStream,
    error=lambda exc: exc.body(),  # OpenAI's own shape
)

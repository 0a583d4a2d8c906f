"""The FastAPI application: routes, authentication, and errors in each wire's shape.

The app is created before the model pair is loaded (``ServerState.ready`` turns true
afterwards), so that ``/health`` can say "loading" while the weights and the cost profile
come in. Every answering route runs one path for its ``Wire`` (authorize, translate, parse,
submit, stream or answer whole). No traceback ever reaches a client: what is not an
``ApiError`` becomes a 500, in the wire's own error shape on a wire's route (OpenAI's
elsewhere), and the server goes on serving.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from edgespec.api import EdgeSpec
from edgespec.errors import EdgespecError
from edgespec.server import anthropic, pipeline, unavailable, wires
from edgespec.server.errors import ApiError, error_body
from edgespec.server.extras import add_extra_routes
from edgespec.server.metrics import Metrics, track_requests
from edgespec.server.pipeline import RETRY_AFTER_S
from edgespec.server.responses import ResponseStore
from edgespec.server.schemas import chat_prompt
from edgespec.server.wires import Exchange, Translator, Wire

log = logging.getLogger("edgespec.server")


@dataclass
class ServerState:
    """What the routes need, filled in once the pair is loaded."""

    api_key: str | None = None
    max_queue: int = 8
    lm: EdgeSpec | None = None
    load_error: str | None = None
    # Why the loaded target cannot answer now (a worker it is split over was lost), until
    # the process restarts: every model endpoint refuses with 503, ``/health`` says why.
    unavailable: str | None = None
    started: float = field(default_factory=time.time)
    ignored_seen: set[str] = field(default_factory=set)  # unknown request fields logged once
    metrics: Metrics = field(default_factory=Metrics)
    # Answers of /v1/responses, for a later request's ``previous_response_id``.
    responses: ResponseStore = field(default_factory=ResponseStore)

    @property
    def ready(self) -> bool:
        return self.lm is not None

    def attach(self, lm: EdgeSpec) -> None:
        """Serve ``lm`` from now on (its cost profile must already be measured). Another
        front end (the mounted chat app) may generate on it too: each stops only its own
        answers. The pair's loop runs on its engine thread (``RuntimeOptions.engine_thread``):
        it hands each answer's events to the server's event loop."""
        if not lm.threaded:
            raise EdgespecError("a served pair runs its loop on an engine thread (engine_thread=True)")
        self.lm = lm

    def lose(self, reason: str) -> int:
        """The target cannot answer any more (``reason``): from now on every model endpoint
        refuses, and every answer running or waiting ends at once with the refusal; how
        many there were."""
        self.unavailable = reason
        lm = self.lm
        if lm is None:  # lost while loading
            return 0
        error = unavailable.refusal(reason)
        ended = lm.end_answers(error)
        unavailable.sweep(lm, error)
        return ended


def create_app(
    state: ServerState, cors: list[str] | None = None, embedding_model: Path | None = None
) -> FastAPI:
    """``cors``: origins a browser may call the API from (``--cors``; none by default);
    ``embedding_model``: a GGUF for ``/v1/embeddings`` (the target's weights otherwise)."""
    app = FastAPI(title="edgespec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.edgespec = state
    if cors:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=cors,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=[IGNORED_HEADER],
        )
    _add_error_handlers(app)
    _add_answering_routes(app, state)
    track_requests(app, state.metrics)
    # Before the chat app's fallback and mount (``add_api_fallback``), which would take /v1/….
    app.state.embeddings = add_extra_routes(
        app, state, _authorize, _pair, state.metrics, embedding_model=embedding_model
    )
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error a client gets is a JSON body in OpenAI's shape (a wire's route answers
    in its own, ``_answer``); a traceback never leaves the server."""

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return JSONResponse(
            error_body(str(exc.detail), code=code), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return JSONResponse(
            error_body(f"internal error: {type(exc).__name__}", type="server_error"), status_code=500
        )


def _add_answering_routes(app: FastAPI, state: ServerState) -> None:
    """``/health``, ``/v1/models`` and a route for each wire. (On the app itself: the
    request metrics name a request by the app's own routes.)"""

    @app.get("/health")
    async def health() -> JSONResponse:
        return _health(state)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        _authorize(state, request)
        lm = _pair(state)
        entries = [_model_entry(lm.target.name, "target", state.started)]
        if lm.draft is not None:
            entries.append(_model_entry(lm.draft.name, "draft", state.started))
        return JSONResponse({"object": "list", "data": entries})

    for path, wire in WIRE_ROUTES.items():
        app.add_api_route(path, _wire_route(state, wire), methods=["POST"])

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        return await _count_tokens(state, request)


def _wire_route(state: ServerState, wire: Wire) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        return await _answer(state, request, wire)

    return route


def _health(state: ServerState) -> JSONResponse:
    if state.unavailable:
        return JSONResponse(
            {"status": "unavailable", "message": f"the target is unavailable: {state.unavailable}"},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if state.load_error:
        return JSONResponse({"status": "error", "message": state.load_error}, status_code=503)
    if not state.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


def add_api_fallback(app: FastAPI) -> None:
    """A 404 in OpenAI's shape for every other /v1 path. Needed only when the chat app is
    mounted at "/": it would otherwise answer those paths itself, in its own shape."""

    @app.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unknown(rest: str) -> JSONResponse:
        return ApiError(404, f"no such endpoint: /v1/{rest}", code="not_found").response()


def _model_entry(name: str, role: str, created: float) -> dict:
    return {"id": name, "object": "model", "created": int(created), "owned_by": "edgespec", "role": role}


def _pair(state: ServerState) -> EdgeSpec:
    if state.unavailable:
        raise unavailable.refusal(state.unavailable)
    if state.lm is None:
        raise ApiError(
            503,
            "the model is still loading; try again shortly",
            type="server_error",
            code="model_loading",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return state.lm


def _authorize(state: ServerState, request: Request) -> None:
    """Only the API needs the key: /health stays open for supervisors, and the chat app
    (--ui) is a page in a browser that cannot send a bearer token. The key comes as a
    bearer token (OpenAI's clients) or in ``x-api-key`` (Anthropic's)."""
    if not state.api_key:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        token = request.headers.get("x-api-key", "")
    if not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise ApiError(
            401,
            "missing or wrong API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def _answer(state: ServerState, request: Request, wire: Wire) -> Response:
    """One request in ``wire``'s format; every refusal, even a 500, in that format."""
    try:
        return await _answered(state, request, wire)
    except Exception as exc:  # the catch-all: never a traceback to the client
        return _refused(wire, exc)


async def _answered(state: ServerState, request: Request, wire: Wire) -> Response:
    _authorize(state, request)
    lm = _pair(state)
    body = await pipeline.read_json(request)
    chat, ignored = wire.translate(body, state.responses)
    # Tokenizing renders the chat template: off the event loop, so other clients stay served.
    job = await run_in_threadpool(wire.parse, chat, lm)
    exchange = Exchange(body, chat, job, state.responses)
    # Made before the job is queued: a failure here leaves no job behind unread.
    translator = wire.streamer(exchange) if job.stream else None
    asked = pipeline.ask(lm, job, state.max_queue)
    headers = _ignored(state, ignored + job.ignored)
    if translator is not None:
        items = pipeline.stream(asked, lm.target.piece, state.metrics.answer)
        events = pipeline.keepalive(_events(items, translator), wire.keepalive)
        return StreamingResponse(events, media_type="text/event-stream", headers={**headers, **SSE_HEADERS})
    answer = await pipeline.whole(asked, lm.target.piece, request, state.metrics.answer)
    return JSONResponse(wire.whole(answer, exchange), headers=headers)


def _refused(wire: Wire, exc: Exception) -> JSONResponse:
    """``exc`` as ``wire``'s error body; what is not an ``ApiError`` is a logged 500."""
    if not isinstance(exc, ApiError):
        log.exception("unexpected error")
        exc = ApiError(500, f"internal error: {type(exc).__name__}", type="server_error")
    return JSONResponse(wire.error(exc), status_code=exc.status, headers=exc.headers)


async def _events(items: AsyncIterator[dict], translator: Translator) -> AsyncIterator[str]:
    async for item in items:
        for event in translator.feed(item):
            yield event
    for event in translator.finish():
        yield event


async def _count_tokens(state: ServerState, request: Request) -> Response:
    """Anthropic's count_tokens: the prompt a Messages body would make, in tokens; every
    refusal, even a 500, in Anthropic's shape."""
    try:
        _authorize(state, request)
        lm = _pair(state)
        chat, ignored = anthropic.count_tokens_body(await pipeline.read_json(request))
        tokens = await run_in_threadpool(chat_prompt, chat, lm)
        return JSONResponse(anthropic.count_tokens_response(len(tokens)), headers=_ignored(state, ignored))
    except Exception as exc:  # the catch-all: never a traceback to the client
        return _refused(wires.ANTHROPIC, exc)


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Every answering route, by path (``/v1/messages/count_tokens`` counts, and is no wire).
WIRE_ROUTES = {
    "/v1/chat/completions": wires.CHAT_COMPLETIONS,
    "/v1/completions": wires.COMPLETIONS,
    "/v1/messages": wires.ANTHROPIC,
    "/v1/responses": wires.RESPONSES,
}
IGNORED_HEADER = "X-Edgespec-Ignored-Fields"


def _ignored(state: ServerState, names: list[str]) -> dict[str, str]:
    """The request's unknown fields: logged once per name for the server's life, and
    named on every response that ignored them."""
    if not names:
        return {}
    new = [name for name in names if name not in state.ignored_seen]
    if new:
        state.ignored_seen.update(new)
        log.info("ignoring request fields this server does not know: %s", ", ".join(new))
    return {IGNORED_HEADER: ", ".join(names)}

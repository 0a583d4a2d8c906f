"""The FastAPI application: routes, authentication, and errors in OpenAI's shape.

The app is created before the model pair is loaded (``ServerState.ready`` turns true
afterwards), so that ``/health`` can say "loading" while the weights and the cost profile
come in. No traceback ever reaches a client: what is not an ``ApiError`` becomes a 500
with an OpenAI error body, and the server goes on serving.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from edgespec.api import EdgeSpec
from edgespec.decoding.events import Done, Step, Token
from edgespec.errors import EdgespecError
from edgespec.server import chunks
from edgespec.server.errors import ApiError, error_body
from edgespec.server.queue import EngineQueue, QueueFull, Ticket
from edgespec.server.schemas import Job, parse_chat, parse_completion

log = logging.getLogger("edgespec.server")

# Seconds a client turned away (queue full, still loading) is told to wait.
RETRY_AFTER_S = 5
# How often a non-streaming request checks whether its client is still there.
DISCONNECT_POLL_S = 0.25


@dataclass
class ServerState:
    """What the routes need, filled in once the pair is loaded."""

    api_key: str | None = None
    max_queue: int = 8
    lm: EdgeSpec | None = None
    queue: EngineQueue | None = None
    load_error: str | None = None
    started: float = field(default_factory=time.time)

    @property
    def ready(self) -> bool:
        return self.queue is not None

    def attach(self, lm: EdgeSpec) -> None:
        """Serve ``lm`` from now on (its cost profile must already be measured). Another
        front end (the mounted chat app) may generate on it too: each stops only its own
        answers."""
        self.lm = lm
        self.queue = EngineQueue(lm, self.max_queue)


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="edgespec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.edgespec = state

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

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.load_error:
            return JSONResponse({"status": "error", "message": state.load_error}, status_code=503)
        if not state.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        _authorize(state, request)
        lm = _engine(state).lm
        entries = [_model_entry(lm.target.name, "target", state.started)]
        if lm.draft is not None:
            entries.append(_model_entry(lm.draft.name, "draft", state.started))
        return JSONResponse({"object": "list", "data": entries})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _complete(state, request, parse_chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(state, request, parse_completion)

    return app


def add_api_fallback(app: FastAPI) -> None:
    """A 404 in OpenAI's shape for every other /v1 path. Needed only when the chat app is
    mounted at "/": it would otherwise answer those paths itself, in its own shape."""

    @app.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unknown(rest: str) -> JSONResponse:
        return ApiError(404, f"no such endpoint: /v1/{rest}", code="not_found").response()


def _model_entry(name: str, role: str, created: float) -> dict:
    return {"id": name, "object": "model", "created": int(created), "owned_by": "edgespec", "role": role}


def _engine(state: ServerState) -> EngineQueue:
    if state.queue is None:
        raise ApiError(
            503,
            "the model is still loading; try again shortly",
            type="server_error",
            code="model_loading",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return state.queue


def _authorize(state: ServerState, request: Request) -> None:
    """Only the API needs the key: /health stays open for supervisors, and the chat app
    (--ui) is a page in a browser that cannot send a bearer token."""
    if not state.api_key:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise ApiError(
            401,
            "missing or wrong API key: send 'Authorization: Bearer KEY'",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


# Deeper than any request a client sends (a tool's JSON schema included), and far from
# Python's recursion limit, which a template or a schema converter would otherwise hit.
MAX_DEPTH = 64


def _check_depth(value: object, depth: int = 0) -> None:
    """Refuse a body nested deeper than MAX_DEPTH (as a RecursionError, like the parser)."""
    if depth > MAX_DEPTH:
        raise RecursionError
    if isinstance(value, dict):
        for item in value.values():
            _check_depth(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_depth(item, depth + 1)


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


async def _complete(state: ServerState, request: Request, parse) -> Response:
    try:
        return await _answer(state, request, parse)
    except ApiError:
        raise
    except Exception as exc:  # the catch-all: a 500 body, never a traceback to the client
        log.exception("unexpected error")
        raise ApiError(500, f"internal error: {type(exc).__name__}", type="server_error") from None


async def _answer(state: ServerState, request: Request, parse) -> Response:
    _authorize(state, request)
    engine = _engine(state)
    raw = await request.body()
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, NaN/Infinity, a 5,000-digit number
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "the request body nests too deep to be a request") from None
    try:
        _check_depth(body)
    except RecursionError:
        raise ApiError(400, "the request body nests too deep to be a request") from None
    # Tokenizing renders the chat template: off the event loop, so other clients stay served.
    job: Job = await run_in_threadpool(parse, body, engine.lm)
    try:
        ticket = engine.submit(job)
    except QueueFull:
        raise ApiError(
            503,
            f"the server is busy: {engine.max_waiting} requests are already waiting; retry later",
            type="server_error",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    if job.stream:
        return StreamingResponse(
            _stream(engine, ticket),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _whole(engine, ticket, request)


async def _events(ticket: Ticket) -> AsyncIterator[Token | Step | Done]:
    while True:
        item = await ticket.events.get()
        if item is None:
            return
        if isinstance(item, Exception):
            raise item
        yield item


def _failure(exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, EdgespecError):
        return ApiError(400, str(exc))
    log.error("generation failed: %s: %s", type(exc).__name__, exc)
    return ApiError(500, f"generation failed: {type(exc).__name__}", type="server_error")


async def _whole(engine: EngineQueue, ticket: Ticket, request: Request) -> JSONResponse:
    """A non-streaming answer; a client that hangs up meanwhile cancels its job."""

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        engine.cancel(ticket)

    watcher = asyncio.create_task(watch())
    answer = chunks.Answer(ticket.job, engine.lm.target.piece)
    done: Done | None = None
    try:
        async for event in _events(ticket):
            if isinstance(event, Done):
                done = event
            else:
                answer.add(event)
    except Exception as exc:
        raise _failure(exc) from None
    finally:
        watcher.cancel()
        if done is None:
            engine.cancel(ticket)
    if done is None:
        raise ApiError(500, "the generation ended without an answer", type="server_error")
    return JSONResponse(answer.whole(done))


async def _stream(engine: EngineQueue, ticket: Ticket) -> AsyncIterator[str]:
    """Server-sent events; Starlette cancels this generator when the client hangs up,
    and the ``finally`` hands that on to the engine."""
    job = ticket.job
    answer = chunks.Answer(job, engine.lm.target.piece)
    finished = False
    try:
        # The role comes first, at once: the client knows it is heard even while queued.
        if job.kind == "chat":
            yield chunks.sse(chunks.chunk(job, role=True, text=""))
        async for event in _events(ticket):
            found = answer.finish(event) if isinstance(event, Done) else answer.add(event)
            for piece in found:
                yield chunks.sse(piece)
        finished = True
    except Exception as exc:
        # Headers are gone already: the error travels as an event, then the stream ends.
        finished = True
        yield chunks.sse(_failure(exc).body())
    finally:
        if not finished:
            engine.cancel(ticket)
    yield chunks.sse("[DONE]")

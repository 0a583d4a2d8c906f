"""The routes beside the completions: llama-server's ``/tokenize``, ``/detokenize``,
``/props`` and ``/metrics``, and OpenAI's ``/v1/embeddings``.

Every route asks for the API key where the server has one (as llama-server does: only
``/health`` is open). ``/metrics`` answers while the pair loads (its gauges read 0); the
others answer 503 "loading" until then.

Embeddings come from a context of their own over the target's weights (or another GGUF,
``embedding_model``), made on the first request (``runtime.embedding``). Every llama.cpp
call for them runs on the engine thread, one batch of one input per turn, so an embedding
never overlaps a decode and a long input does not hold up the answers streaming meanwhile.
One embedding request computes at a time (they share the one context); up to
``state.max_queue`` more wait their turn, and further ones get the queue's 503.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import llama_cpp
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from edgespec.api import EdgeSpec
from edgespec.errors import EdgespecError, RequestError
from edgespec.runtime.chat_template import CHATML
from edgespec.runtime.embedding import Embedder
from edgespec.runtime.model import Model
from edgespec.server import pipeline
from edgespec.server.errors import ApiError, bad_request
from edgespec.server.metrics import CONTENT_TYPE, Metrics


class ServerState(Protocol):
    """What the routes read of the server's state (``server.app.ServerState``)."""

    max_queue: int
    lm: EdgeSpec | None


log = logging.getLogger("edgespec.server")

# OpenAI's own limit on inputs in one embeddings request.
MAX_INPUTS = 2048
ENCODINGS = ("float", "base64")


# -- request bodies -------------------------------------------------------------------------


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false", name)
    return value


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class TokenizeRequest:
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


def parse_tokenize(body: Any) -> TokenizeRequest:
    """llama-server's ``/tokenize`` body."""
    body = _object(body)
    content = body.get("content")
    if not isinstance(content, str):
        raise bad_request("'content' must be a string", "content")
    return TokenizeRequest(
        content,
        add_special=_flag(body, "add_special", False),
        parse_special=_flag(body, "parse_special", True),
        with_pieces=_flag(body, "with_pieces", False),
    )


def parse_detokenize(body: Any, n_vocab: int) -> list[int]:
    """llama-server's ``/detokenize`` body: its token ids, each in the vocabulary."""
    tokens = _object(body).get("tokens")
    if not isinstance(tokens, list) or not all(_is_id(t) and 0 <= t < n_vocab for t in tokens):
        raise bad_request(f"'tokens' must be a list of token ids in [0, {n_vocab})", "tokens")
    return tokens


def piece_json(piece: bytes) -> str | list[int]:
    """A token's text as llama-server gives it: a string, or its bytes where they are not
    UTF-8 on their own (part of a character)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


@dataclass(frozen=True)
class EmbeddingRequest:
    inputs: list[str | list[int]]  # texts and token lists, in the order asked
    encoding_format: str = "float"
    dimensions: int | None = None


def parse_embeddings(body: Any) -> EmbeddingRequest:
    """OpenAI's embeddings body: ``input`` a string, a list of strings, a list of token ids
    or a list of such lists; ``encoding_format``; ``dimensions`` (checked against the
    model once it is known); ``model`` any name."""
    body = _object(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    encoding = body.get("encoding_format")
    encoding = "float" if encoding is None else encoding
    if encoding not in ENCODINGS:
        raise bad_request("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and not (_is_id(dimensions) and dimensions > 0):
        raise bad_request("'dimensions' must be a positive integer", "dimensions")
    return EmbeddingRequest(_inputs(body.get("input")), encoding, dimensions)


def _inputs(value: Any) -> list[str | list[int]]:
    shape = "'input' must be a non-empty string, a list of them, a list of token ids or a list of such lists"
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad_request(shape, "input")
    if all(_is_id(item) for item in value):
        return [list(value)]
    if len(value) > MAX_INPUTS:
        raise bad_request(
            f"'input' holds {len(value)} inputs; at most {MAX_INPUTS} go in one request", "input"
        )
    if all(isinstance(item, str) and item for item in value):
        return list(value)
    if all(isinstance(item, list) and item and all(_is_id(t) for t in item) for item in value):
        return [list(item) for item in value]
    raise bad_request(shape, "input")


def _refusal(exc: RequestError) -> ApiError:
    return ApiError(400, str(exc), param=exc.param, code=exc.code)


# -- embeddings -----------------------------------------------------------------------------


class Embeddings:
    """The server's embedder, made on first use and computed on the engine thread."""

    def __init__(self, path: Path | None = None, max_waiting: int = 8):
        """``path``: a GGUF to embed with (None: the served target)."""
        self.path = path
        self.max_waiting = max_waiting
        self.embedder: Embedder | None = None
        self._lm: EdgeSpec | None = None
        self._lock = asyncio.Lock()  # one request on the context at a time
        self._waiting = 0

    async def compute(self, lm: EdgeSpec, request: EmbeddingRequest) -> tuple[list[list[float]], int, str]:
        """The request's vectors in order, the tokens they took, and the model's name."""
        if self._waiting > self.max_waiting:
            raise ApiError(
                503,
                f"the server is busy: {self.max_waiting} embedding requests are already waiting; retry later",
                type="server_error",
                code="queue_full",
                headers={"Retry-After": str(pipeline.RETRY_AFTER_S)},
            )
        self._waiting += 1
        try:
            async with self._lock:
                embedder = await self._ready(lm)
                if request.dimensions is not None and request.dimensions != embedder.n_embd:
                    raise bad_request(
                        f"'dimensions' must be {embedder.n_embd}: these embeddings cannot be shortened",
                        "dimensions",
                    )
                tokens = await run_in_threadpool(_tokens_of, embedder, request.inputs)
                try:
                    vectors = await run_in_threadpool(self._vectors, lm, embedder, tokens)
                except EdgespecError as exc:  # a failed decode, or closed meanwhile
                    log.error("embedding failed: %s", exc)
                    raise ApiError(500, f"embedding failed: {exc}", type="server_error") from None
        finally:
            self._waiting -= 1
        return vectors, sum(len(t) for t in tokens), embedder.name

    async def _ready(self, lm: EdgeSpec) -> Embedder:
        if self.embedder is None:
            try:
                self.embedder = await run_in_threadpool(lm.call, self._make, lm)
            except EdgespecError as exc:
                log.error("embeddings unavailable: %s", exc)
                raise ApiError(500, f"embeddings are unavailable: {exc}", type="server_error") from None
            self._lm = lm
        return self.embedder

    def _make(self, lm: EdgeSpec) -> Embedder:
        threads = lm.target.options.n_threads
        if self.path is None:
            return Embedder(lm.target, n_threads=threads)
        return Embedder.load(self.path, n_threads=threads, n_gpu_layers=lm.options.n_gpu_layers)

    @staticmethod
    def _vectors(lm: EdgeSpec, embedder: Embedder, inputs: list[list[int]]) -> list[list[float]]:
        """Each input a batch per turn: an answer streaming meanwhile gets its steps between."""
        run = lm.call
        vectors = []
        for tokens in inputs:
            run(embedder.begin, tokens)
            while not run(embedder.advance):
                pass
            vectors.append(embedder.result())
        return vectors

    def describe(self) -> dict[str, Any]:
        """For /props: which model embeds, and the context once it exists."""
        embedder = self.embedder
        return {
            "model_path": str(self.path) if self.path is not None else None,  # None: the target
            "loaded": embedder is not None,
            "n_ctx": embedder.max_tokens if embedder is not None else None,
            "n_embd": embedder.n_embd if embedder is not None else None,
        }

    def close(self) -> None:
        """Free the embedding context: call before the pair is closed (it may borrow the
        target's weights). On the engine thread, between an input's batches; a request
        caught midway fails with a 500."""
        embedder, lm = self.embedder, self._lm
        self.embedder = None
        if embedder is None or lm is None:
            return
        try:
            lm.call(embedder.close)
        except RuntimeError:  # the engine thread is gone already: nothing runs on it
            embedder.close()


def _tokens_of(embedder: Embedder, inputs: list[str | list[int]]) -> list[list[int]]:
    try:
        return [embedder.check(embedder.tokenize(item) if isinstance(item, str) else item) for item in inputs]
    except RequestError as exc:
        raise _refusal(exc) from None


def encode_vector(vector: list[float], encoding: str) -> list[float] | str:
    """A vector as OpenAI sends it: floats, or base64 of little-endian float32."""
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def embeddings_body(vectors: list[list[float]], encoding: str, model: str, n_tokens: int) -> dict[str, Any]:
    data = [
        {"object": "embedding", "index": i, "embedding": encode_vector(vector, encoding)}
        for i, vector in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


# -- /props ---------------------------------------------------------------------------------


def model_facts(model: Model) -> dict[str, Any]:
    return {
        "name": model.name,
        "path": str(model.path),
        "n_ctx": model.n_ctx,
        "n_ctx_train": model.n_ctx_train,
        "n_vocab": model.n_vocab,
        # Where the weights are: llama.cpp's buffers (MiB by buffer type; a worker's are
        # RPCn[HOST:PORT]) and, for a target split over machines, its layers by device.
        "buffers_mib": dict(model.buffers),
        "placement": model.placement.facts() if model.placement is not None else None,
    }


def props(lm: EdgeSpec, embeddings: Embeddings) -> dict[str, Any]:
    """llama-server's ``/props``, and edgespec's own facts under ``edgespec``."""
    target = lm.target
    slots = lm.occupancy().total
    return {
        "default_generation_settings": {
            "n_ctx": target.n_ctx,
            # A request without max_tokens may use the rest of its context (llama-server's
            # n_predict -1); n_ctx is the most that can be.
            "params": {
                "temperature": 0.0,
                "top_p": 1.0,
                "top_k": 0,
                "max_tokens": target.n_ctx,
                "n_predict": -1,
            },
        },
        "total_slots": slots,
        "model_path": str(target.path),
        "model_alias": target.name,
        "chat_template": target.chat_template or CHATML,  # what renders chats: edgespec's fallback if none
        "build_info": f"llama-cpp-python {llama_cpp.__version__}",
        "modalities": {"vision": False},
        "edgespec": {
            "target": model_facts(target),
            "draft": model_facts(lm.draft) if lm.draft is not None else None,
            "drafters": list(lm.drafters),
            "parallel": slots,
            "prompt_cache": lm.prompt_cache.describe() if lm.prompt_cache is not None else None,
            "embeddings": embeddings.describe(),
        },
    }


def _metrics_text(lm: EdgeSpec | None, metrics: Metrics) -> str:
    """``/metrics``' text; while loading the counters are there, the slots are not yet."""
    if lm is None:
        return metrics.render(0, 0, 0)
    now = lm.occupancy()
    return metrics.render(now.busy, now.total, now.waiting)


# -- routes -----------------------------------------------------------------------------------


def add_extra_routes(
    app: FastAPI,
    state: ServerState,
    authorize: Callable[[ServerState, Request], None],
    pair: Callable[[ServerState], EdgeSpec],
    metrics: Metrics,
    *,
    embedding_model: Path | None = None,
) -> Embeddings:
    """Register the routes on ``app``. ``authorize(state, request)`` raises for a wrong API
    key; ``pair(state)`` returns the loaded pair or raises 503 while loading. Returns
    the embeddings' owner, to ``close()`` before the pair is closed."""
    embeddings = Embeddings(embedding_model, state.max_queue)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        authorize(state, request)
        lm = pair(state)
        asked = parse_tokenize(await pipeline.read_json(request))
        tokens = await run_in_threadpool(
            lm.target.tokenize,
            asked.content,
            add_special=asked.add_special,
            parse_special=asked.parse_special,
        )
        if asked.with_pieces:
            found: list[Any] = [{"id": t, "piece": piece_json(lm.target.piece(t))} for t in tokens]
            return JSONResponse({"tokens": found})
        return JSONResponse({"tokens": tokens})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        authorize(state, request)
        lm = pair(state)
        tokens = parse_detokenize(await pipeline.read_json(request), lm.target.n_vocab)
        return JSONResponse({"content": await run_in_threadpool(lm.target.detokenize, tokens)})

    @app.get("/props")
    async def get_props(request: Request) -> JSONResponse:
        authorize(state, request)
        return JSONResponse(props(pair(state), embeddings))

    @app.get("/metrics")
    async def get_metrics(request: Request) -> Response:
        authorize(state, request)
        return Response(_metrics_text(state.lm, metrics), media_type=CONTENT_TYPE)

    @app.post("/v1/embeddings")
    async def create_embeddings(request: Request) -> JSONResponse:
        authorize(state, request)
        lm = pair(state)
        asked = parse_embeddings(await pipeline.read_json(request))
        vectors, n_tokens, name = await embeddings.compute(lm, asked)
        return JSONResponse(embeddings_body(vectors, asked.encoding_format, name, n_tokens))

    return embeddings

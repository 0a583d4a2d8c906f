"""One request through the engine, whatever its wire format.

Every endpoint that answers (chat and text completions, Anthropic's Messages, OpenAI's
Responses) reads its body here, turns it into one ``Job`` and has it answered here: as
OpenAI chat-completion chunks while it streams, or as one chat-completion body. The
other wire formats translate those (``server.anthropic``, ``server.responses``), so
every format gives the same tokens for the same conversation, and tool calls, thinking
and figures are read in one place (``server.chunks``).

A job's answer is asked of the pair with ``EdgeSpec.submit`` (``ask``), which hands its
events straight to the request's event loop: no thread of the server's stands between the
pair's loop and a client. Past ``max_waiting`` answers waiting for a slot, a new one is
refused (a 503). A client that goes away stops its own answer (``answer.stop()``): a
waiting one leaves the queue at once, a running one ends at its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from edgespec.api import EdgeSpec, QueueFull
from edgespec.decoding.events import Done, Step, Token
from edgespec.decoding.generation import Generation
from edgespec.decoding.runner import END
from edgespec.errors import EdgespecError
from edgespec.server import chunks
from edgespec.server.errors import ApiError
from edgespec.server.schemas import Job

log = logging.getLogger("edgespec.server")

# Seconds a client turned away (queue full, still loading) is told to wait.
RETRY_AFTER_S = 5
# How often a non-streaming request checks whether its client is still there.
DISCONNECT_POLL_S = 0.25
# Deeper than any request a client sends (a tool's JSON schema included), and far from
# Python's recursion limit, which a template or a schema converter would otherwise hit.
MAX_DEPTH = 64
# A surrogate left alone: the parser pairs every high one followed by a low one.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# Seconds a stream may stay silent before a keep-alive is sent: a long prompt on a CPU can
# take minutes before its first token, and clients (Claude Code among them) give up on an
# idle stream and send the whole request again, which doubles the work.
KEEPALIVE_S = 10.0
# What keeps an OpenAI-style stream alive: an SSE comment, which every SSE parser skips.
SSE_COMMENT = ": keep-alive\n\n"

# Called with each finished answer and its speculation summary (the server's metrics).
OnDone = Callable[[Done, dict], None]


async def read_json(request: Request) -> Any:
    """The request's body as JSON; a 400 naming what is wrong with it otherwise."""
    raw = await request.body()
    try:
        body = _mended(json.loads(raw, parse_constant=_no_constants))
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, NaN/Infinity, a 5,000-digit number
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "the request body nests too deep to be a request") from None
    return body


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _mended(value: Any, depth: int = 0) -> Any:
    """``value`` with each lone surrogate in its strings made U+FFFD, the replacement
    character; a RecursionError, like the parser's, past MAX_DEPTH.

    JSON may escape half of a surrogate pair (``"\\ud83d"``, from a client that cut a
    string between the two), and no tokenizer takes it. Refusing it would refuse every
    later turn of an agent that resends its history; one character replaced loses less."""
    if depth > MAX_DEPTH:
        raise RecursionError
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_mended(key, depth + 1): _mended(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_mended(item, depth + 1) for item in value]
    return value


@dataclass(eq=False)
class Asked:
    """A job and its live answer, whose events arrive on ``events`` in lists, the last
    ending with ``decoding.runner.END`` or an exception."""

    job: Job
    answer: Generation | None = None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)


def ask(lm: EdgeSpec, job: Job, max_waiting: int) -> Asked:
    """Submit ``job``'s answer, its events put on this event loop's queue; a 503 when
    ``max_waiting`` answers wait already."""
    loop = asyncio.get_running_loop()
    asked = Asked(job)

    def deliver(events: list[object]) -> None:
        # RuntimeError: the event loop is gone (server shutting down), nobody listens.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(asked.events.put_nowait, events)

    try:
        asked.answer = lm.submit(job.request, owner=job.id, deliver=deliver, limit=max_waiting)
    except QueueFull:
        raise ApiError(
            503,
            f"the server is busy: {max_waiting} requests are already waiting; retry later",
            type="server_error",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    return asked


async def _events(asked: Asked) -> AsyncIterator[Token | Step | Done]:
    while True:
        for item in await asked.events.get():
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def _stop(asked: Asked) -> None:
    """The client is gone: stop its answer (never anyone else's)."""
    if asked.answer is not None:
        asked.answer.stop()


def failure(exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, EdgespecError):
        return ApiError(400, str(exc))
    log.error("generation failed: %s: %s", type(exc).__name__, exc)
    return ApiError(500, f"generation failed: {type(exc).__name__}", type="server_error")


async def whole(
    asked: Asked, piece: Callable[[int], bytes], request: Request, on_done: OnDone | None = None
) -> dict:
    """A non-streaming answer's chat-completion body; a client that hangs up meanwhile
    cancels its job."""

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        _stop(asked)

    watcher = asyncio.create_task(watch())
    answer = chunks.Answer(asked.job, piece)
    done: Done | None = None
    try:
        async for event in _events(asked):
            if isinstance(event, Done):
                done = event
            else:
                answer.add(event)
    except Exception as exc:
        raise failure(exc) from None
    finally:
        watcher.cancel()
        if done is None:
            _stop(asked)
    if done is None:
        raise ApiError(500, "the generation ended without an answer", type="server_error")
    body = answer.whole(done)
    if on_done is not None:
        on_done(done, body["speculation"])
    return body


async def stream(
    asked: Asked, piece: Callable[[int], bytes], on_done: OnDone | None = None
) -> AsyncIterator[dict]:
    """The answer as chat-completion chunks (an error, once headers are gone, as an
    ``{"error": …}`` item, the last). Starlette cancels the consumer when the client hangs
    up, and the ``finally`` hands that on to the engine."""
    answer = chunks.Answer(asked.job, piece)
    finished = False
    try:
        for piece in answer.opening():
            yield piece
        async for event in _events(asked):
            found = answer.finish(event) if isinstance(event, Done) else answer.add(event)
            if isinstance(event, Done) and on_done is not None:
                on_done(event, found[-1]["speculation"])
            for piece in found:
                yield piece
        finished = True
    except Exception as exc:
        finished = True
        yield failure(exc).body()
    finally:
        if not finished:
            _stop(asked)


async def keepalive(
    events: AsyncIterator[str], beat: str, every_s: float = KEEPALIVE_S
) -> AsyncIterator[str]:
    """``events``, with ``beat`` sent whenever none came for ``every_s`` seconds. The
    pending read is waited on, never cancelled: cancelling it would end the answer."""
    source = aiter(events)
    pending: asyncio.Task | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield beat
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        # The client is gone (or the source ended): the source's own ``finally`` cancels
        # its answer, once its pending read has wound down.
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await source.aclose()

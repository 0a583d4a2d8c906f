"""Streams kept alive while a long prompt is read (``server.pipeline.keepalive``),
model-free: beats go out only while the source is silent, the source's items come through
whole and in order, the pending read is never cancelled; and each SDK skips the beats its
wire format gets (an SSE comment for OpenAI's streams, Anthropic's ``ping`` event)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from edgespec.server import wires
from edgespec.server.pipeline import SSE_COMMENT, keepalive
from tests.anthropic_wire_cases import Answer, chat_chunks, sdk_stream, translate
from tests.responses_wire_cases import STREAMS, chat_answer, run_stream, sdk_client

BEAT = "beat"


async def _slow(delays: list[float], finished: list[str]) -> AsyncIterator[str]:
    try:
        for i, delay in enumerate(delays):
            await asyncio.sleep(delay)
            yield f"item{i}"
        finished.append("done")
    finally:
        finished.append("closed")


def _collect(delays: list[float], every_s: float) -> tuple[list[str], list[str]]:
    finished: list[str] = []

    async def run() -> list[str]:
        return [item async for item in keepalive(_slow(delays, finished), BEAT, every_s)]

    return asyncio.run(run()), finished


def test_beats_only_while_the_source_is_silent() -> None:
    out, finished = _collect([0.0, 0.35, 0.0], every_s=0.1)
    assert [x for x in out if x != BEAT] == ["item0", "item1", "item2"]
    beats_before_item1 = out[out.index("item0") + 1 : out.index("item1")]
    assert 2 <= len(beats_before_item1) <= 4 and set(beats_before_item1) == {BEAT}
    assert out.index("item2") == out.index("item1") + 1  # no beat when items keep coming
    assert finished == ["done", "closed"]  # the source ran to its end, never cancelled


def test_a_consumer_that_stops_closes_the_source() -> None:
    finished: list[str] = []

    async def run() -> list[str]:
        stream = keepalive(_slow([0.0, 5.0], finished), BEAT, 0.05)
        first = [await anext(stream), await anext(stream)]
        await stream.aclose()  # the client hung up while the source waits
        return first

    assert asyncio.run(run()) == ["item0", BEAT]
    assert finished == ["closed"]


def test_the_openai_sdk_skips_the_comment() -> None:
    _stream, texts, _events = run_stream(chat_chunks_for_responses())
    beaten = [SSE_COMMENT, *(t for text in texts for t in (text, SSE_COMMENT))]
    plain = sdk_client(lambda: "".join(texts).encode()).responses.create(model="m", input="hi", stream=True)
    kept = sdk_client(lambda: "".join(beaten).encode()).responses.create(model="m", input="hi", stream=True)
    assert [e.model_dump() for e in kept] == [e.model_dump() for e in plain]


def test_the_anthropic_sdk_skips_the_ping() -> None:
    texts = translate(chat_chunks(Answer(text=["Hel", "lo."])))
    beat = wires.ANTHROPIC.keepalive
    assert beat.startswith("event: ping\n")
    beaten = [texts[0], beat, *(t for text in texts[1:] for t in (text, beat))]
    assert sdk_stream(beaten).model_dump() == sdk_stream(texts).model_dump()


def chat_chunks_for_responses() -> list[dict]:
    """A text answer's chat chunks, as the Responses tests build them."""
    return chat_answer(**STREAMS["text"])[1]

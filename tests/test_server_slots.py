"""Several answers at once on a real ``edgespec serve --parallel 2``, over loopback: a
short question asked while a long answer streams is answered before that answer ends, each
answer is the one it would have had alone, stopping one leaves the other whole, and a
request beyond the slots and the queue is a 503."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server_fixtures import Server, ask, long_story, serve, sse_events

pytestmark = [pytest.mark.slow, pytest.mark.needs_models]

SHORT = "What is the capital of France? One word."
LONG = long_story(400)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve("--parallel", "2", "--max-queue", "0") as running:
        yield running


def texts(events: Iterator[dict | str]) -> Iterator[str]:
    for event in events:
        if isinstance(event, dict) and event["choices"] and event["choices"][0]["delta"].get("content"):
            yield event["choices"][0]["delta"]["content"]


def test_a_short_question_is_answered_while_a_long_answer_streams(server: Server) -> None:
    idle(server)  # a hang-up of a test before (in any order) reaches the server asynchronously
    alone = ask(server, SHORT)
    url = f"{server.base_url}/chat/completions"
    with httpx.stream("POST", url, json=LONG, timeout=300) as long_answer:
        pieces = texts(sse_events(long_answer))
        next(pieces)  # the long answer is decoding
        during: list[str] = []
        asker = threading.Thread(target=lambda: during.append(ask(server, SHORT)))
        asker.start()
        streamed = 0
        while asker.is_alive():
            next(pieces)  # the long answer goes on meanwhile: it is not held up either
            streamed += 1
        assert during == [alone]
        assert streamed > 0


def test_beyond_the_slots_and_the_queue_is_a_503(server: Server) -> None:
    url = f"{server.base_url}/chat/completions"
    idle(server)  # the hang-up of the test before reaches the server asynchronously
    with (
        httpx.stream("POST", url, json=LONG, timeout=300) as one,
        httpx.stream("POST", url, json=LONG, timeout=300) as two,
    ):
        ones, twos = texts(sse_events(one)), texts(sse_events(two))
        next(ones), next(twos)  # both slots decode
        turned_away = httpx.post(url, json={**LONG, "stream": False}, timeout=60)
        assert turned_away.status_code == 503 and int(turned_away.headers["Retry-After"]) > 0
        assert next(ones) and next(twos)  # both are still being served


def idle(server: Server) -> None:
    """Wait until both slots are free (a client's hang-up reaches the server asynchronously)."""
    deadline = time.monotonic() + 30
    while not server_is_free(server):
        assert time.monotonic() < deadline, "the server's slots did not come free"
        time.sleep(0.2)


def server_is_free(server: Server) -> bool:
    """Two one-token answers at once both get a slot."""
    body = {**LONG, "max_tokens": 1, "stream": False}
    url = f"{server.base_url}/chat/completions"
    answers: list[int] = []
    threads = [
        threading.Thread(target=lambda: answers.append(httpx.post(url, json=body, timeout=60).status_code))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return answers == [200, 200]


def test_stopping_one_answer_leaves_the_other_whole(server: Server) -> None:
    body = {
        **LONG,
        "max_tokens": 48,
        "messages": [{"role": "user", "content": "Count from 1 to 30 in words."}],
    }
    url = f"{server.base_url}/chat/completions"
    idle(server)
    alone = "".join(texts(sse_events_of(url, body)))
    with httpx.stream("POST", url, json=LONG, timeout=300) as stopped:
        first = texts(sse_events(stopped))
        next(first)
        together: list[str] = []
        begun: list[str] = []

        def answer_alongside() -> None:
            for piece in texts(sse_events_of(url, body)):
                begun.append(piece)
            together.append("".join(begun))

        other = threading.Thread(target=answer_alongside)
        other.start()
        while not begun and other.is_alive():  # the first is read on until the other decodes too
            next(first)
        next(first)  # and is still decoding as its client goes
    # The first client hung up mid-answer; the other answer goes on to its end, unchanged.
    other.join(300)
    assert together == [alone]


def sse_events_of(url: str, body: dict) -> Iterator[dict | str]:
    with httpx.stream("POST", url, json=body, timeout=300) as response:
        yield from sse_events(response)

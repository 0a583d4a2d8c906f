"""Many clients, one slot: a real ``edgespec serve --max-queue 1 --parallel 1`` serves requests one
at a time in arrival order, turns away what does not fit in its queue, and lets a client
that hangs up free the engine at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server_fixtures import Server, ask, long_story, serve, sse_events

pytestmark = [pytest.mark.slow, pytest.mark.needs_models]

ASKS = ["Write a Python function that reverses a string.", "What is the capital of France? One word."]
# Long enough that finishing it would take far longer than the test allows.
LONG = long_story(1500)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve("--max-queue", "1", "--parallel", "1") as running:
        yield running


def first_text(events: Iterator[dict | str]) -> None:
    """Read a stream until its first piece of answer text: its job holds the engine."""
    for event in events:
        if isinstance(event, dict) and event["choices"] and event["choices"][0]["delta"].get("content"):
            return
    raise AssertionError("the stream ended before any text")


def test_two_clients_at_once_both_get_their_answers(server: Server) -> None:
    alone = [ask(server, content) for content in ASKS]
    together: dict[int, str] = {}
    threads = [
        threading.Thread(target=lambda i=i: together.__setitem__(i, ask(server, ASKS[i]))) for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert together == {0: alone[0], 1: alone[1]}


def test_client_that_hangs_up_frees_the_engine(server: Server) -> None:
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=LONG, timeout=300) as response:
        events = sse_events(response)
        first_text(events)
        for _ in range(3):
            next(events)
    # The stream is closed: the next request must not wait for 1500 abandoned tokens.
    started = time.monotonic()
    assert ask(server, ASKS[1], max_tokens=4)
    assert time.monotonic() - started < 20


def test_full_queue_is_a_503_with_retry_after(server: Server) -> None:
    url = f"{server.base_url}/chat/completions"
    with httpx.stream("POST", url, json=LONG, timeout=300) as first:
        # The event iterators stay referenced: closing one (even by garbage collection)
        # would close its connection, which is a hang-up.
        first_events = sse_events(first)
        first_text(first_events)
        with httpx.stream("POST", url, json=LONG, timeout=300) as second:
            second_events = sse_events(second)
            # The role chunk comes at once, while the job waits in the queue.
            assert next(second_events)["choices"][0]["delta"]["role"] == "assistant"
            turned_away = httpx.post(url, json={**LONG, "stream": False}, timeout=60)
            assert turned_away.status_code == 503
            assert int(turned_away.headers["Retry-After"]) > 0
            error = turned_away.json()["error"]
            assert error["code"] == "queue_full"
            assert error["type"] == "server_error"
            assert next(first_events)  # the first client is still being served
    # Both hung up: the engine serves the next client at once (once the server has seen
    # the hang-ups, which travel asynchronously: a 503 meanwhile is retried).
    started = time.monotonic()
    body = {"messages": [{"role": "user", "content": ASKS[1]}], "max_tokens": 4}
    while (answer := httpx.post(url, json=body, timeout=60)).status_code == 503:
        assert time.monotonic() - started < 5
        time.sleep(0.1)
    assert answer.status_code == 200
    assert time.monotonic() - started < 20

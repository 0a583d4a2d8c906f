"""``edgespec serve --ui``: the chat app at "/" and the API beside it, one engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from gradio_client import Client

from tests.server_fixtures import Server, serve
from tests.test_app import FAST, HELD, LONG_PROMPT, OUT, answer_text, wait_for_text

pytestmark = [pytest.mark.slow, pytest.mark.needs_models]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # One slot: the app and an API client then take turns, so a Stop can find an answer
    # waiting as well as running. Its chats in a folder of the test's own.
    data = str(tmp_path_factory.mktemp("chats"))
    with serve("--ui", "--parallel", "1", "--data-dir", data) as running:
        yield running


def test_with_a_key_the_app_asks_for_it_and_keeps_its_chats(tmp_path) -> None:
    with serve("--ui", "--parallel", "1", "--data-dir", str(tmp_path), api_key="s3cret") as keyed:
        page = httpx.get(f"{keyed.url}/", timeout=30)
        assert page.status_code == 200 and "type it as the password" in page.text
        assert httpx.get(f"{keyed.url}/config", timeout=30).status_code == 401, "the app needs the key"
        wrong = httpx.post(f"{keyed.url}/login", data={"username": "me", "password": "guess"}, timeout=30)
        assert wrong.status_code == 400
        with httpx.Client(base_url=keyed.url, timeout=60) as browser:
            assert browser.post("/login", data={"username": "me", "password": "s3cret"}).status_code == 200
            assert browser.get("/config").status_code == 200
    assert (tmp_path / "chats.sqlite3").exists(), "the app's store is where --data-dir says"


def test_chat_app_and_api_share_the_port(server: Server) -> None:
    page = httpx.get(f"{server.url}/", timeout=60)
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    answer = server.client().chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
    )
    assert answer.choices[0].message.content


def test_unknown_api_path_is_an_openai_404_not_the_apps(server: Server) -> None:
    response = httpx.get(f"{server.base_url}/nothing")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


class ApiAnswer(threading.Thread):
    """A streamed chat completion over the API, read in a thread: its chunks' text and
    how many brought text, its finish reason, when the server took it (its first chunk,
    sent at once, even while it waits for the engine) and when its first text came.
    ``hang_up`` closes the stream, as a client that goes away does."""

    def __init__(self, server: Server, prompt: str, max_tokens: int):
        super().__init__(daemon=True)
        self.server, self.prompt, self.max_tokens = server, prompt, max_tokens
        self.text, self.finish, self.first = "", None, threading.Event()
        self.pieces, self.taken, self.hang_up = 0, threading.Event(), threading.Event()

    def run(self) -> None:
        stream = self.server.client().chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": self.prompt}],
            max_tokens=self.max_tokens,
            stream=True,
        )
        with stream:
            for chunk in stream:
                self.taken.set()
                if chunk.choices and chunk.choices[0].delta.content:
                    self.text += chunk.choices[0].delta.content
                    self.pieces += 1
                    self.first.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    self.finish = chunk.choices[0].finish_reason
                if self.hang_up.is_set():
                    return


def test_a_stop_in_the_app_ends_its_own_answer_and_never_the_apis(server: Server) -> None:
    """The app and an API client each ask; the app's Stop ends the app's answer, waiting
    or running, and the API client's answer runs to its end either way."""
    app = Client(f"{server.url}/", verbose=False)
    try:
        # The API's answer runs, held in flight by its budget; the app's waits behind it
        # and is stopped while waiting.
        running = ApiAnswer(server, LONG_PROMPT, max_tokens=HELD)
        running.start()
        assert running.first.wait(180)
        waiting = app.submit("Say hello in one word.", **{**FAST, "max_tokens": 16}, api_name="/chat")
        while not waiting.done():  # (until the app has queued it: a Stop before is a no-op)
            app.predict(api_name="/stop")
            time.sleep(0.2)
        withdrawn = waiting.result(timeout=180)
        assert "stopped before the first token" in withdrawn[OUT["error"]]
        # The Stops left the API's answer running: it goes on well past the step a Stop
        # ends an answer at (one chunk a token, at most 17 a step); then its client goes.
        pieces = running.pieces
        while running.is_alive() and running.pieces < pieces + 40:
            running.join(0.1)
        assert running.finish is None and running.pieces >= pieces + 40, "the API's answer must run on"
        running.hang_up.set()
        running.join(180)

        # The app's answer runs; the API's waits; the app's Stop ends only the app's.
        job = app.submit(LONG_PROMPT, **{**FAST, "max_tokens": HELD}, api_name="/chat")
        wait_for_text(job)
        behind = ApiAnswer(server, "Say hello in one word.", max_tokens=8)
        behind.start()
        assert behind.taken.wait(180), "the server never took the API's request"
        app.predict(api_name="/stop")
        assert "(stopped)" in job.result(timeout=120)[OUT["stats"]]
        assert answer_text(job.result()[OUT["chatbot"]])
        behind.join(180)
        assert behind.text and behind.finish in ("stop", "length")
    finally:
        app.close()

"""The chat app over HTTP, driven with gradio_client against the real default model pair.

The app runs in this process on a free loopback port; each test opens its own client, and
so its own Gradio session (conversation, Stop ownership).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from gradio_client import Client
from gradio_client.utils import Status

from edgespec.api import EdgeSpec
from edgespec.ui.handlers import View
from edgespec.ui.layout import build_app

pytestmark = [
    pytest.mark.slow,
    # Gradio's own queue metrics trip pandas 3 deprecations: noise, not ours to fix.
    pytest.mark.filterwarnings("ignore:'future.no_silent_downcasting' is deprecated"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

APP = Path(__file__).resolve().parent.parent / "app.py"
OUT = {name: index for index, name in enumerate(View.names())}
# Explicit drafter and γ: these tests must not depend on the adaptive controller.
FAST = {
    "drafter": "model",
    "gamma": "4",
    "verify": "token",
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "seed": "",
    "max_tokens": 32,
    "lenience": 1.0,
    "colour": True,
}
CODE_PROMPT = "Write a Python function that adds two numbers."
LONG_PROMPT = "Write a long, detailed story about a robot who learns to paint."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def launch(lm: EdgeSpec | None, load_error: str | None = None) -> Iterator[str]:
    demo = build_app(lm, load_error=load_error).queue()
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="module")
def lm() -> Iterator[EdgeSpec]:
    model = EdgeSpec(quiet=True)
    yield model
    model.close()


@pytest.fixture(scope="module")
def app_url(lm: EdgeSpec) -> Iterator[str]:
    with launch(lm) as url:
        yield url


@pytest.fixture
def client(app_url: str) -> Iterator[Client]:
    c = Client(app_url, verbose=False)
    yield c
    c.close()


def ask(client: Client, message: str, **overrides: Any):
    return client.submit(message, **{**FAST, **overrides}, api_name="/chat")


def answer_text(chatbot: Any) -> str:
    """The last assistant message of a Chatbot value ("" when there is none yet)."""
    if not isinstance(chatbot, list) or not chatbot or chatbot[-1]["role"] != "assistant":
        return ""
    return "".join(part.get("text", "") for part in chatbot[-1]["content"])


def gauge_value(plot: dict) -> float:
    figure = json.loads(plot["plot"])
    return figure["data"][0]["value"]


def wait_for_text(job, timeout: float = 120) -> str:
    """Poll a running chat job until some answer text has streamed back."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for outputs in reversed(job.outputs()):
            text = answer_text(outputs[OUT["chatbot"]])
            if text:
                return text
        if job.done():
            break
        time.sleep(0.05)
    raise AssertionError("no answer text streamed back")


def test_answer_streams_with_stats_and_continues_the_conversation(client: Client):
    job = ask(client, CODE_PROMPT)
    final = job.result(timeout=180)
    texts = [answer_text(o[OUT["chatbot"]]) for o in job.outputs()]
    streamed = [t for t in dict.fromkeys(texts) if t]
    assert len(streamed) >= 3, f"expected several streamed updates, got {streamed}"
    answer = answer_text(final[OUT["chatbot"]])
    assert all(answer.startswith(t) for t in streamed), "updates must only ever extend the answer"
    stats = final[OUT["stats"]]
    for label in ("tokens/s", "τ", "acceptance", "time to first token", "prefill", "verify", "other"):
        assert label in stats
    assert "32 (max tokens reached)" in stats
    assert 'data-source="draft"' in final[OUT["provenance"]]
    assert final[OUT["steps_table"]]["data"][0][1] == "model"
    assert json.loads(final[OUT["steps_plot"]]["plot"])["data"]
    gauges = [o[OUT["gauge"]] for o in job.outputs() if "plot" in o[OUT["gauge"]]]
    assert max(gauge_value(g) for g in gauges) > 0
    assert "speedup ×" not in final[OUT["speedup"]], "no speedup figure before a measured baseline"

    second = ask(client, "Now make it multiply instead.").result(timeout=180)
    chat = second[OUT["chatbot"]]
    assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant"]
    assert answer_text(chat)
    # The first turn stayed in the caches: most of the second prompt is reused.
    reused = int(second[OUT["stats"]].split(" reused")[0].rsplit(",", 1)[1].split()[0])
    assert reused > 30


def test_empty_message_shows_an_error_and_the_app_keeps_answering(client: Client):
    failed = ask(client, "   ").result(timeout=60)
    assert "empty" in failed[OUT["error"]]
    ok = ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    assert answer_text(ok[OUT["chatbot"]])
    assert ok[OUT["error"]] == ""


def test_prompt_longer_than_the_context_is_reported(client: Client, lm: EdgeSpec):
    message = "cache " * (lm.target.n_ctx + 200)
    failed = ask(client, message).result(timeout=120)
    assert "context holds" in failed[OUT["error"]]
    assert failed[OUT["message"]] == message, "the message is given back for editing"
    ok = ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    assert answer_text(ok[OUT["chatbot"]])


def test_stop_ends_the_generation_at_once_and_the_session_goes_on(client: Client):
    job = ask(client, LONG_PROMPT, max_tokens=400)
    wait_for_text(job)
    stopped_at = time.monotonic()
    client.predict(api_name="/stop")
    final = job.result(timeout=60)
    assert time.monotonic() - stopped_at < 10
    assert "(stopped)" in final[OUT["stats"]]
    assert answer_text(final[OUT["chatbot"]]), "the partial answer stays in the chat"

    ok = ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    assert answer_text(ok[OUT["chatbot"]])
    assert len(ok[OUT["chatbot"]]) == 4


def test_second_session_waits_its_turn_and_cannot_stop_the_first(app_url: str, client: Client):
    other = Client(app_url, verbose=False)
    try:
        # The first answer is long enough that it cannot end before the second is queued;
        # it ends when its own session stops it, at a point the test chooses.
        first = ask(client, LONG_PROMPT, max_tokens=400)
        wait_for_text(first)
        second = ask(other, "Say hello in one word.", max_tokens=16)
        other.predict(api_name="/stop")  # not its generation: must change nothing
        deadline = time.monotonic() + 30
        while second.status().code != Status.IN_QUEUE and time.monotonic() < deadline:
            time.sleep(0.02)
        assert second.status().code == Status.IN_QUEUE
        assert not first.done(), "another session's Stop must not end this answer"
        client.predict(api_name="/stop")
        assert "stopped" in first.result(timeout=180)[OUT["stats"]]
        assert answer_text(second.result(timeout=180)[OUT["chatbot"]])
    finally:
        other.close()


def test_baseline_is_measured_before_any_speedup_is_shown(client: Client):
    missing = client.predict(api_name="/measure_baseline")
    assert "send a message first" in missing[OUT["error"]]
    ask(client, CODE_PROMPT).result(timeout=180)
    measured = client.predict(api_name="/measure_baseline")
    speedup = measured[OUT["speedup"]]
    assert "speedup ×" in speedup and "vs measured baseline (" in speedup and "tok/s)" in speedup


def test_clear_mid_generation_starts_over(client: Client):
    ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    job = ask(client, LONG_PROMPT, max_tokens=400)
    wait_for_text(job)
    cleared = client.predict(api_name="/clear")
    assert cleared[OUT["chatbot"]] == []
    job.result(timeout=60)  # Clear also stopped it
    fresh = ask(client, "Say hello in one word.", max_tokens=16).result(timeout=180)
    assert [m["role"] for m in fresh[OUT["chatbot"]]] == ["user", "assistant"]


def test_lenience_reaches_the_running_generation(client: Client, lm: EdgeSpec, monkeypatch):
    seen: list = []
    real_stream = lm.stream

    def spy(prompt, settings, **kwargs):
        seen.append(settings)
        yield from real_stream(prompt, settings, **kwargs)

    monkeypatch.setattr(lm, "stream", spy)
    job = ask(client, LONG_PROMPT, max_tokens=400, temperature=0.8, seed="7")
    wait_for_text(job)
    client.predict(0.5, api_name="/set_lenience")
    assert seen[-1].lenience == 0.5, "the slider must change the settings the engine is reading"
    client.predict(api_name="/stop")
    job.result(timeout=60)


def test_default_settings_use_the_adaptive_controller(client: Client):
    final = client.submit(CODE_PROMPT, max_tokens=24, api_name="/chat").result(timeout=180)
    assert final[OUT["error"]] == ""
    assert answer_text(final[OUT["chatbot"]])


def test_a_model_that_failed_to_load_is_shown_and_the_app_still_runs():
    with launch(None, load_error="no such model: missing.gguf") as url:
        page_config = httpx.get(f"{url}config", timeout=30).text
        assert "could not be loaded" in page_config and "missing.gguf" in page_config
        c = Client(url, verbose=False)
        try:
            for _ in range(2):  # and again: the app keeps working
                failed = c.submit("hello", **FAST, api_name="/chat").result(timeout=60)
                assert "could not be loaded" in failed[OUT["error"]]
                assert "missing.gguf" in failed[OUT["error"]]
        finally:
            c.close()


def test_app_script_reports_a_bad_model_in_one_line():
    result = subprocess.run(
        [sys.executable, str(APP), "--target", "/no/such/model.gguf", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    expected = "edgespec: error: model file not found: /no/such/model.gguf"
    assert result.stderr.strip().splitlines() == [expected]

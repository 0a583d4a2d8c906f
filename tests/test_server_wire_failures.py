"""Unexpected failures answered in each wire format's own error shape: a real server
(``create_app`` under uvicorn, in this process so the test can break the real loaded
pair) on a loopback port, asked with the real anthropic and openai clients. An
Anthropic endpoint never answers in OpenAI's shape, nor an OpenAI endpoint in
Anthropic's, and the server goes on answering afterwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
import uvicorn

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.server.app import ServerState, create_app
from tests.server_fixtures import HOST, free_port

pytestmark = [pytest.mark.slow, pytest.mark.needs_models]

HELLO = [{"role": "user", "content": "Say hello."}]
# What every endpoint is asked (each with its own prompt field), and answered if nothing breaks.
ASKED = {
    "/v1/messages": {"model": "m", "max_tokens": 2, "messages": HELLO, "drafter": "none"},
    "/v1/messages/count_tokens": {"model": "m", "messages": HELLO},
    "/v1/chat/completions": {"messages": HELLO, "max_tokens": 2, "drafter": "none"},
    "/v1/completions": {"prompt": "Say hello.", "max_tokens": 2, "drafter": "none"},
    "/v1/responses": {"input": "Say hello.", "max_output_tokens": 2, "drafter": "none"},
}
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
# What breaks: the prompt's tokenization (every endpoint's), or the request's building
# after it (every endpoint that answers).
BROKEN = ("prompt_tokens", "request")


@pytest.fixture(scope="module")
def pair() -> Iterator[EdgeSpec]:
    """The default pair as ``serve`` loads it: its loop on an engine thread, which hands
    each answer's events to the server's event loop."""
    lm = EdgeSpec(options=RuntimeOptions(n_ctx=2048, engine_thread=True), quiet=True)
    yield lm
    lm.close()


@pytest.fixture(scope="module")
def url(pair: EdgeSpec) -> Iterator[str]:
    state = ServerState()
    state.attach(pair)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host=HOST, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://{HOST}:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert state.lm is not None
        state.lm.stop_answers()
        assert state.lm.wait_idle(10)


def break_pair(pair: EdgeSpec, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    def broken(*_args, **_kwargs):
        raise RuntimeError("the tokenizer broke")

    monkeypatch.setattr(pair, method, broken)


def post(url: str, path: str, **extra: object) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={**ASKED[path], **extra}, timeout=120)


def anthropic_client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("method", BROKEN)
@pytest.mark.parametrize("path", ANTHROPIC_PATHS)
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_endpoints_fail_in_anthropic_shape(
    url: str, pair: EdgeSpec, monkeypatch: pytest.MonkeyPatch, method: str, path: str, stream: bool
) -> None:
    if path.endswith("count_tokens") and (stream or method == "request"):
        pytest.skip("counting tokens neither streams nor builds a request")
    break_pair(pair, monkeypatch, method)
    response = post(url, path, **({"stream": True} if stream else {}))
    assert response.status_code == 500, response.text
    assert response.json() == {
        "type": "error",
        "error": {"type": "api_error", "message": "internal error: RuntimeError"},
    }


@pytest.mark.parametrize("method", BROKEN)
@pytest.mark.parametrize("path", OPENAI_PATHS)
def test_openai_endpoints_fail_in_openai_shape(
    url: str, pair: EdgeSpec, monkeypatch: pytest.MonkeyPatch, method: str, path: str
) -> None:
    break_pair(pair, monkeypatch, method)
    response = post(url, path)
    assert response.status_code == 500, response.text
    assert response.json() == {
        "error": {
            "message": "internal error: RuntimeError",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }


def test_clients_read_the_failure_then_an_answer(
    url: str, pair: EdgeSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each client library reads its own error type from the 500, and the same server
    answers once the pair works again."""
    claude, gpt = anthropic_client(url), openai_client(url)
    break_pair(pair, monkeypatch, "prompt_tokens")
    with pytest.raises(anthropic.InternalServerError) as counted:
        claude.messages.count_tokens(model="m", messages=HELLO)
    assert counted.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "internal error: RuntimeError"},
    }
    with pytest.raises(anthropic.InternalServerError) as asked:
        claude.messages.create(model="m", max_tokens=2, messages=HELLO)
    assert asked.value.status_code == 500 and asked.value.body["error"]["type"] == "api_error"
    with pytest.raises(openai.InternalServerError) as chatted:
        gpt.chat.completions.create(model="m", max_tokens=2, messages=HELLO)
    assert chatted.value.body == {
        "message": "internal error: RuntimeError",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    monkeypatch.undo()
    assert claude.messages.count_tokens(model="m", messages=HELLO).input_tokens > 0
    message = claude.messages.create(model="m", max_tokens=2, messages=HELLO, extra_body={"drafter": "none"})
    assert message.type == "message" and message.usage.output_tokens > 0
    answer = gpt.chat.completions.create(
        model="m", max_tokens=2, messages=HELLO, extra_body={"drafter": "none"}
    )
    assert answer.choices[0].message.content


@pytest.mark.parametrize("path", ANTHROPIC_PATHS)
def test_anthropic_refusals_keep_their_status(url: str, path: str) -> None:
    """An expected refusal stays what it was, in Anthropic's shape: a 400 naming the fault."""
    response = post(url, path, messages="hello")
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "messages" in body["error"]["message"]

"""Chat and text completions through a real ``edgespec serve``, with the openai client.

The server's greedy answers must be the target's own answer (``edgespec generate
--drafter none`` in a separate process) token for token, whatever drafter runs and
whether the answer is streamed or not.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server_fixtures import Server, cli_reference, serve, sse_events

pytestmark = pytest.mark.slow

PROMPT = "Write a Python function that adds two numbers."
MAX_TOKENS = 24
MESSAGES = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve() as running:
        yield running


@pytest.fixture(scope="module")
def reference() -> str:
    return cli_reference(PROMPT, MAX_TOKENS)


def test_models_lists_the_loaded_pair(server: Server) -> None:
    models = server.client().models.list()
    ids = [model.id for model in models.data]
    assert ids == ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]
    assert all(model.object == "model" for model in models.data)


@pytest.mark.parametrize("drafter", ["auto", "ngram", "model"])
def test_greedy_answer_is_the_targets_own(server: Server, reference: str, drafter: str) -> None:
    answer = server.client().chat.completions.create(
        model="qwen2.5-coder-1.5b",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"drafter": drafter},
    )
    assert answer.choices[0].message.content == reference
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == MAX_TOKENS
    assert answer.model_extra["speculation"]["drafter"] == drafter


def test_streamed_answer_equals_the_whole_one(server: Server, reference: str) -> None:
    stream = server.client().chat.completions.create(
        model="default",
        messages=MESSAGES,
        max_completion_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_stream_shape(server: Server) -> None:
    body = {
        "messages": MESSAGES,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "drafter": "ngram",
        "gamma": 4,
    }
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(response))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:] if c["choices"])
    assert len({c["id"] for c in chunks}) == 1
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    finish = chunks[-2]
    assert finish["choices"][0]["finish_reason"] == "length"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 8
    assert usage_chunk["timings"]["predicted_n"] == 8
    assert usage_chunk["speculation"]["drafter"] == "ngram"


def test_stop_sequence_ends_the_text(server: Server, reference: str) -> None:
    # A stop string from the middle of the known answer: the text must end right before it.
    cut = reference.index("(")
    stop = reference[cut : cut + 3]
    client = server.client()
    whole = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=MAX_TOKENS, stop=stop
    )
    assert whole.choices[0].message.content == reference[: reference.index(stop)]
    assert whole.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=MAX_TOKENS, stop=[stop, "never seen"], stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reference[: reference.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_timings_match_the_engines_counts(server: Server) -> None:
    answer = server.client().chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=MAX_TOKENS, extra_body={"drafter": "model", "gamma": 3}
    )
    timings = answer.model_extra["timings"]
    speculation = answer.model_extra["speculation"]
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert timings["draft_n"] == sum(d["drafted"] for d in speculation["drafters"].values())
    assert timings["draft_n_accepted"] == sum(d["accepted"] for d in speculation["drafters"].values())
    assert timings["draft_n"] > 0  # the draft model ran: γ 3 at every step that had room
    assert speculation["steps"] == sum(run[2] for run in speculation["runs"])
    assert timings["predicted_n"] == answer.usage.completion_tokens
    # The same conversation again: its prompt is already in the target's cache.
    cached = answer.usage.prompt_tokens_details.cached_tokens
    assert timings["prompt_n"] == answer.usage.prompt_tokens - cached
    assert cached > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_text_completion(server: Server) -> None:
    answer = server.client().completions.create(
        model="default", prompt="def fibonacci(n):", max_tokens=12, extra_body={"drafter": "none"}
    )
    assert answer.object == "text_completion"
    assert answer.choices[0].text.strip()
    assert answer.usage.completion_tokens == 12
    assert answer.model_extra["timings"]["draft_n"] == 0


def test_predicted_output_is_accepted_and_changes_nothing(server: Server) -> None:
    # A prompt that does not contain its answer: the prediction is the only place the
    # copy drafters can find it.
    messages = [
        {"role": "user", "content": "Write a Python function that returns the sum of a list. Code only."}
    ]
    client = server.client()
    plain = client.chat.completions.create(
        model="default", messages=messages, max_tokens=40, extra_body={"drafter": "none"}
    )
    expected = plain.choices[0].message.content
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
    predicted = client.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=40,
        prediction={"type": "content", "content": [{"type": "text", "text": expected}]},
    )
    assert predicted.choices[0].message.content == expected
    details = predicted.usage.completion_tokens_details
    answer_tokens = predicted.usage.completion_tokens
    # The prediction is the answer: nearly all of it is used (a token or two may split
    # differently when the text is tokenized on its own), and little is rejected.
    assert details.accepted_prediction_tokens >= 0.9 * answer_tokens
    assert details.rejected_prediction_tokens <= 0.1 * answer_tokens
    assert predicted.model_extra["timings"]["draft_n_accepted"] > 0  # and it was drafted from
    # A prediction the answer does not follow is rejected, and changes nothing either.
    wrong = client.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=40,
        prediction={"type": "content", "content": "SELECT name FROM users WHERE id = 7;"},
    )
    assert wrong.choices[0].message.content == expected
    assert wrong.usage.completion_tokens_details.rejected_prediction_tokens > 0

"""Chat and text completions through a real ``edgespec serve``, with the openai client.

The server's greedy answers must be the target's own answer (``edgespec generate
--drafter none`` in a separate process) token for token, whatever drafter runs and
whether the answer is streamed or not.
"""

from __future__ import annotations

import itertools

import httpx
import pytest

from edgespec.api import settings_from
from edgespec.decoding.events import Done, Stats, Step
from edgespec.decoding.request import Request
from edgespec.server.chunks import Speculation, timings
from edgespec.server.schemas import Job
from tests.server_fixtures import Server, cli_reference, sse_events


def served(test):
    """A test against the real server, which loads the real models."""
    return pytest.mark.slow(pytest.mark.needs_models(test))


PROMPT = "Write a Python function that adds two numbers."
MAX_TOKENS = 24
MESSAGES = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def server(default_server: Server) -> Server:
    return default_server


@pytest.fixture(scope="module")
def reference() -> str:
    return cli_reference(PROMPT, MAX_TOKENS)


@served
def test_models_lists_the_loaded_pair(server: Server) -> None:
    models = server.client().models.list()
    ids = [model.id for model in models.data]
    assert ids == ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]
    assert all(model.object == "model" for model in models.data)


@served
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


@served
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


@served
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
    speculation = usage_chunk["speculation"]
    assert speculation["drafter"] == "ngram" and speculation["gamma"] == 4
    assert sum(run["steps"] for run in speculation["runs"]) == speculation["steps"]
    assert "timings" not in finish and "speculation" not in finish  # on the last chunk only


@served
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


@served
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
    assert timings["predicted_n"] == answer.usage.completion_tokens
    # The same conversation again: its prompt is already in the target's cache.
    cached = answer.usage.prompt_tokens_details.cached_tokens
    assert timings["prompt_n"] == answer.usage.prompt_tokens - cached
    assert timings["cache_n"] == cached > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    check_timings(timings)
    check_speculation(speculation, timings)
    assert speculation["drafters"]["model"]["steps"] > 0
    assert set(speculation["gamma_histogram"]) <= {"0", "1", "2", "3"}  # γ 3, shorter near the end


def check_timings(timings: dict) -> None:
    """llama-server's definitions, recomputed from the body's own counts and times."""
    n, ms = timings["predicted_n"], timings["predicted_ms"]
    assert n > 1 and ms > 0 and timings["prompt_ms"] > 0 and timings["prompt_n"] > 0
    assert timings["predicted_per_second"] == pytest.approx(n / ms * 1000, abs=1e-3)
    assert timings["predicted_per_token_ms"] == pytest.approx(ms / n, abs=1e-3)
    prompt_n, prompt_ms = timings["prompt_n"], timings["prompt_ms"]
    assert timings["prompt_per_second"] == pytest.approx(prompt_n / prompt_ms * 1000, abs=1e-3)
    assert timings["prompt_per_token_ms"] == pytest.approx(prompt_ms / prompt_n, abs=1e-3)
    # The decode phase: tokens after the first over the time after the first.
    assert timings["decode_per_second"] == pytest.approx((n - 1) / ms * 1000, abs=1e-3)
    assert timings["decode_per_second"] < timings["predicted_per_second"]


def check_speculation(speculation: dict, timings: dict) -> None:
    """The runs and the histogram cover every step of the answer, and τ and the acceptance
    rate follow from the counts."""
    steps = speculation["steps"]
    runs = speculation["runs"]
    assert "runs_truncated" not in speculation
    assert all(set(run) == {"drafter", "gamma", "steps", "accepted"} for run in runs)
    assert sum(run["steps"] for run in runs) == steps > 0
    assert sum(run["accepted"] for run in runs) == speculation["accepted"] == timings["draft_n_accepted"]
    assert sum(run["gamma"] * run["steps"] for run in runs) == speculation["drafted"] == timings["draft_n"]
    assert all((a["drafter"], a["gamma"]) != (b["drafter"], b["gamma"]) for a, b in itertools.pairwise(runs))
    histogram = {}
    for run in runs:
        histogram[str(run["gamma"])] = histogram.get(str(run["gamma"]), 0) + run["steps"]
    assert speculation["gamma_histogram"] == dict(sorted(histogram.items(), key=lambda kv: int(kv[0])))
    assert list(speculation["gamma_histogram"]) == sorted(histogram, key=int)
    assert speculation["tau"] == pytest.approx((timings["predicted_n"] - 1) / steps, abs=1e-4)
    assert speculation["acceptance_rate"] == pytest.approx(
        speculation["accepted"] / speculation["drafted"], abs=1e-4
    )


@served
def test_auto_answer_reports_every_step(server: Server) -> None:
    # The default (auto): γ and drafter change from step to step, and every step is there.
    answer = server.client().chat.completions.create(model="default", messages=MESSAGES, max_tokens=64)
    speculation = answer.model_extra["speculation"]
    assert speculation["drafter"] == "auto" and speculation["gamma"] == "auto"
    assert speculation["steps"] == sum(d["steps"] for d in speculation["drafters"].values())
    check_timings(answer.model_extra["timings"])
    if speculation["drafted"]:
        check_speculation(speculation, answer.model_extra["timings"])
    else:  # auto may judge drafting a loss on this machine: then no rate to report
        assert speculation["acceptance_rate"] is None
        assert sum(run["steps"] for run in speculation["runs"]) == speculation["steps"]


@served
def test_one_token_answer_has_no_tau(server: Server) -> None:
    answer = server.client().chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=1, extra_body={"drafter": "none"}
    )
    speculation = answer.model_extra["speculation"]
    assert speculation["steps"] == 0 and speculation["runs"] == [] and speculation["gamma_histogram"] == {}
    assert speculation["tau"] is None and speculation["acceptance_rate"] is None
    timings = answer.model_extra["timings"]
    assert timings["predicted_n"] == 1 and timings["decode_per_second"] == 0.0


def test_runs_cover_a_long_answer_whole() -> None:
    # More runs than any cut would keep: every step stays, in order.
    job = Job(
        kind="chat",
        request=Request((1,), settings_from(max_tokens=1000)),
        stream=False,
        include_usage=False,
        model="m",
    )
    speculation = Speculation()
    steps = [Step("ngram" if i % 3 else "model", 1 + i % 5, i % 2, 0.0, 0.0) for i in range(300)]
    for step in steps:
        speculation.add(step)
    stats = Stats(
        tokens=1 + sum(s.accepted + 1 for s in steps),
        target_passes=len(steps),
        drafted=sum(s.gamma for s in steps),
        accepted=sum(s.accepted for s in steps),
        wall_s=3.0,
        ttft_s=1.0,
    )
    summary = speculation.as_dict(job, Done(text="", tail="", stats=stats))
    assert len(summary["runs"]) > 32 and sum(run["steps"] for run in summary["runs"]) == 300
    unrolled = [(r["drafter"], r["gamma"]) for r in summary["runs"] for _ in range(r["steps"])]
    assert unrolled == [(s.drafter, s.gamma) for s in steps]
    assert sum(summary["gamma_histogram"].values()) == 300
    assert list(summary["gamma_histogram"]) == ["1", "2", "3", "4", "5"]
    assert summary["tau"] == pytest.approx((stats.tokens - 1) / 300, abs=1e-4)
    figures = timings(Done(text="", tail="", stats=stats))
    assert figures["predicted_ms"] == 2000.0 and figures["prompt_ms"] == 1000.0
    assert figures["predicted_per_second"] == pytest.approx(stats.tokens / 2.0, abs=1e-3)
    assert figures["decode_per_second"] == pytest.approx((stats.tokens - 1) / 2.0, abs=1e-3)


@served
def test_text_completion(server: Server) -> None:
    answer = server.client().completions.create(
        model="default", prompt="def fibonacci(n):", max_tokens=12, extra_body={"drafter": "none"}
    )
    assert answer.object == "text_completion"
    assert answer.choices[0].text.strip()
    assert answer.usage.completion_tokens == 12
    assert answer.model_extra["timings"]["draft_n"] == 0


@served
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
        # A fixed drafter: whether ``auto`` finds drafting worth it depends on this
        # machine's load at the moment, which a test must not.
        extra_body={"drafter": "copy", "gamma": 8},
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

"""A thinking model's reasoning comes back apart from its answer on all three endpoints
(chat completions' ``reasoning_content``, Messages' ``thinking`` blocks, Responses'
reasoning items), whole and streamed, against a real ``edgespec serve``.

The server runs the Qwen3 prompt format (tests/fixtures/templates/qwen3.jinja, through
``--chat-template``) on the default target, which shares Qwen3's ChatML tokens. That
target was not trained to think, so a grammar makes its answer take a thinking model's
shape, ``<think>…</think>`` then the answer: what is tested is the server's reading of
that shape, on every endpoint, and the template switch that turns thinking off. Answers are compared
across requests, so all start from the same cache state."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.server_fixtures import REPO, Server, serve

pytestmark = [pytest.mark.needs_models, pytest.mark.slow]

TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "qwen3.jinja"
# The forced text is full of near-ties, which a different verification batch can tip: the
# answers compared across requests are decoded without drafting, one token a pass.
THINKING = {
    "grammar": 'root ::= "<think>\\n" [a-z ]{8,40} "\\n</think>\\n\\n" [A-Za-z ]{2,24} "."',
    "drafter": "none",
}
QUESTION = "Is the sky blue? Think first."


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve("--parallel", "1", "--cache-ram", "0", "--chat-template", str(TEMPLATE)) as running:
        # Every later request starts from the state this one leaves (its prompt in the one
        # slot): a cold prompt and a cached one may tip a near-tie differently.
        chat(running, **THINKING)
        yield running


def chat(server: Server, **extra) -> openai.types.chat.ChatCompletion:
    return server.client().chat.completions.create(
        model="qwen3", messages=[{"role": "user", "content": QUESTION}], max_tokens=60, extra_body=extra
    )


def test_chat_completions_reasoning_content_whole_and_streamed(server: Server) -> None:
    message = chat(server, **THINKING).choices[0].message
    thought = message.model_extra["reasoning_content"]
    assert thought.strip() and "<think>" not in message.content and "</think>" not in message.content
    assert message.content.endswith(".") and not message.content.startswith("\n")
    stream = server.client().chat.completions.create(
        model="qwen3",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=60,
        stream=True,
        extra_body=THINKING,
    )
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    streamed_thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed_thought == thought
    assert "".join(d.content or "" for d in deltas) == message.content


def test_messages_thinking_blocks(server: Server) -> None:
    chat(server, **THINKING)  # the compared answers start from the state it leaves
    expected = chat(server, **THINKING).choices[0].message
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)
    ask = {
        "model": "qwen3",
        "max_tokens": 60,
        "messages": [{"role": "user", "content": QUESTION}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "extra_body": THINKING,
    }
    message = client.messages.create(**ask)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == expected.model_extra["reasoning_content"]
    assert message.content[1].text == expected.content
    with client.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == message.content[0].thinking
    assert final.content[1].text == message.content[1].text


def test_responses_reasoning_items(server: Server) -> None:
    chat(server, **THINKING)  # the compared answers start from the state it leaves
    expected = chat(server, **THINKING).choices[0].message
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
    ask = {
        "model": "qwen3",
        "input": QUESTION,
        "max_output_tokens": 60,
        "reasoning": {"effort": "high"},
        "extra_body": THINKING,
    }
    response = client.responses.create(**ask)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning = response.output[0]
    assert "".join(part.text for part in reasoning.content) == expected.model_extra["reasoning_content"]
    assert response.output_text == expected.content
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    with client.responses.stream(**ask) as stream:
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == response.output_text


def test_thinking_switched_off_answers_plainly(server: Server) -> None:
    """``reasoning_effort: none`` closes an empty thinking block in the prompt (the
    template's switch): the answer has no reasoning, and its tokens are the plain answer's."""
    message = chat(server, reasoning_effort="none").choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    assert message.content.strip() and "<think>" not in message.content

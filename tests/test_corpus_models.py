"""The corpus as the default target sees it: every agent conversation rendered by the
target's own chat template (tools, tool calls and tool results in its format), every
prompt short enough for a CPU's prefill, all built by the one helper the benchmark uses,
and a structured prompt's answer recorded under its schema."""

from __future__ import annotations

import json

import pytest

from edgespec.api import EdgeSpec
from edgespec.bench.corpus import CORPUS, conversation, prompt_tokens
from edgespec.bench.recording import record
from edgespec.runtime.chat_template import render

AGENTS = [p for p in CORPUS if p.category == "agent"]


@pytest.mark.needs_models
@pytest.mark.parametrize("prompt", AGENTS, ids=[p.id for p in AGENTS])
def test_every_agent_prompt_renders_with_the_targets_template(pair: EdgeSpec, prompt) -> None:
    messages, tools = conversation(prompt)
    text = render(pair.target, messages, tools=tools)
    # The tools are offered as the template writes them, one JSON object a line.
    offered = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
    assert [json.loads(line) for line in offered] == prompt.tools
    if messages[0]["role"] == "system":
        assert text.startswith("<|im_start|>system\n" + messages[0]["content"] + "\n\n# Tools")
    for message in messages:
        for call in message.get("tool_calls") or []:
            name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
            written = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
            assert f"<tool_call>\n{written}\n</tool_call>" in text
        if message["role"] == "tool":
            assert f"<tool_response>\n{message['content']}\n</tool_response>" in text
        elif message["content"]:
            assert message["content"] in text
    assert text.endswith("<|im_start|>assistant\n")
    assert prompt_tokens(pair, prompt) == pair.target.tokenize(text, add_special=False, parse_special=True)


@pytest.mark.needs_models
def test_every_prompt_is_under_700_tokens(pair: EdgeSpec) -> None:
    lengths = {p.id: len(prompt_tokens(pair, p)) for p in CORPUS}
    assert max(lengths.values()) < 700, sorted(lengths.items(), key=lambda item: -item[1])[:3]
    # A text prompt is its text as one user message, and nothing else.
    text = next(p for p in CORPUS if p.messages is None)
    assert prompt_tokens(pair, text) == pair.prompt_tokens(text.text, chat=True)


@pytest.mark.needs_models
def test_a_structured_answer_is_recorded_under_its_schema(pair: EdgeSpec) -> None:
    prompt = next(p for p in CORPUS if p.category == "structured")
    (recording,) = record(pair.target, pair.draft, [(prompt, prompt_tokens(pair, prompt))], 6)
    # The grammar is compact and forces the schema's first key: without it the target
    # opens with prose or a Markdown fence.
    first_key = next(iter(prompt.json_schema["properties"]))
    assert pair.target.detokenize(recording.answer).startswith(f'{{"{first_key}":')

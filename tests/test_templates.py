"""Chat templates: the families' real prompt formats, tools and tool results, template
switches (Qwen3's thinking), the sandbox, and the templates inside the real GGUFs.

The Llama 3.x, Mistral, Qwen3 and Gemma 3 templates are fixtures written for these tests
(tests/fixtures/templates/; the Gemma 3 GGUF available offline is the base model, which
has no template); Qwen2.5's and SmolLM2's are read from the GGUF files themselves. That
each family's end-of-turn token ends generation is tested on the loaded models in
test_models_cli.py."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from edgespec.errors import EdgespecError
from edgespec.models.gguf import read_info, read_token_table
from edgespec.runtime.chat_template import render_template
from edgespec.runtime.messages import normalise_messages

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a <city>",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
# A tool round trip as an OpenAI client sends it: arguments as a JSON string.
TOOL_TURNS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call12345",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "21 degrees."},
    {"role": "user", "content": "Thanks"},
]
TOOL_JSON = json.dumps(TOOLS[0])


def fixture(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def test_llama3_format_with_date_and_tools():
    source = fixture("llama3")
    chat = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    text = render_template(source, chat, bos_token="<|begin_of_text|>", date_string="26 Jul 2024")
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # Without a date the template asks strftime_now for today's.
    today = datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {today}\n" in render_template(source, chat)

    text = render_template(
        source, TOOL_TURNS, tools=TOOLS, bos_token="<|begin_of_text|>", date_string="1 Jan 2025"
    )
    assert text.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 1 Jan 2025\n\nYou are terse.<|eot_id|>"
    )
    # The tools go into the first user turn, as indented plain JSON (no HTML escapes).
    assert json.dumps(TOOLS[0], indent=4) + "\n\nWeather in Paris?<|eot_id|>" in text
    assert "\\u003c" not in text and "Weather in a <city>" in text
    assert (
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Paris"}}'
        "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"
        + json.dumps('{"temp": 21}')
        + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n21 degrees.<|eot_id|>"
    ) in text
    assert text.endswith("Thanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    # With tools_in_user_message=false they move to the system block.
    moved = render_template(source, TOOL_TURNS, tools=TOOLS, tools_in_user_message=False, date_string="x")
    system_block = moved.split("<|eot_id|>")[0]
    assert "You have access to the following functions" in system_block and '"get_weather"' in system_block


def test_mistral_format_tools_and_its_own_errors():
    source = fixture("mistral")
    chat = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Weather?"},
    ]
    assert render_template(source, chat, bos_token="<s>", eos_token="</s>") == (
        "<s>[INST] Hi[/INST] Hello!</s>[INST] You are terse.\n\nWeather?[/INST]"
    )
    text = render_template(source, TOOL_TURNS, tools=TOOLS, bos_token="<s>", eos_token="</s>")
    assert text == (
        "<s>[INST] Weather in Paris?[/INST]"
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call12345"}]</s>'
        '[TOOL_RESULTS] {"content": {"temp": 21}, "call_id": "call12345"}[/TOOL_RESULTS]'
        " 21 degrees.</s>[AVAILABLE_TOOLS] ["
        + TOOL_JSON
        + "][/AVAILABLE_TOOLS][INST] You are terse.\n\nThanks[/INST]"
    )
    # The template's own raise_exception becomes one line.
    bad_id = [dict(m) for m in TOOL_TURNS]
    bad_id[3] = {**bad_id[3], "tool_call_id": "short"}
    with pytest.raises(EdgespecError, match="chat template failed: Tool call IDs should be alphanumeric"):
        render_template(source, bad_id, tools=TOOLS)
    with pytest.raises(EdgespecError, match="roles must alternate"):
        render_template(source, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_qwen3_thinking_switch_tools_and_history():
    source = fixture("qwen3")
    hello = [{"role": "user", "content": "Hi"}]
    assert render_template(source, hello) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render_template(source, hello, enable_thinking=True).endswith("<|im_start|>assistant\n")
    assert render_template(source, hello, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # An answered turn keeps its reasoning only after the last question.
    thought = {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello"}
    assert render_template(source, [*hello, thought], add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello<|im_end|>\n"
    )
    later = render_template(source, [*hello, thought, {"role": "user", "content": "Again"}])
    assert "hmm" not in later and "<|im_start|>assistant\nHello<|im_end|>" in later

    text = render_template(source, TOOL_TURNS, tools=TOOLS)
    assert text.startswith(
        "<|im_start|>system\nYou are terse.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + TOOL_JSON
        + "\n</tools>\n\n"
    )
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
        '{"temp": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n21 degrees.<|im_end|>\n'
    ) in text
    # Consecutive tool results share one user turn.
    two = [*TOOL_TURNS[:4], {"role": "tool", "tool_call_id": "call12345", "content": "sunny"}]
    assert "</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in render_template(
        source, two
    )


def test_gemma3_format():
    source = fixture("gemma3")
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ]
    assert render_template(source, chat, bos_token="<bos>") == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(EdgespecError, match="roles must alternate"):
        render_template(source, [{"role": "assistant", "content": "first"}])


def test_messages_are_checked_and_shaped():
    shaped = normalise_messages(TOOL_TURNS)
    call = shaped[2]["tool_calls"][0]
    assert call["function"]["arguments"] == {"city": "Paris"} and shaped[2]["content"] == ""
    parts = normalise_messages(
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    )
    assert parts[0]["content"] == "ab"
    for bad, fragment in [
        ({"role": "robot", "content": "x"}, "needs a role"),
        ({"role": "user", "content": None}, "needs text content"),
        ({"role": "user", "content": "x", "tool_calls": []}, "only an assistant message"),
        (
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]},
            "function name",
        ),
        ({"role": "tool", "content": "x", "tool_call_id": 7}, "tool_call_id must be a string"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "must be text"),
    ]:
        with pytest.raises(EdgespecError, match=fragment):
            normalise_messages([bad])
    with pytest.raises(EdgespecError, match="tools must be a list"):
        render_template("{{ tools }}", [{"role": "user", "content": "x"}], tools="get_weather")


def test_sandbox_and_loop_controls():
    chat = [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    looped = (
        "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m.content }}{% endfor %}"
    )
    assert render_template(looped, chat) == "ac"
    stopped = (
        "{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    )
    assert render_template(stopped, chat) == "ab"
    for hostile in [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__base__.__subclasses__() }}",
        "{{ messages.append(1) }}",
        "{{ cycler.__init__.__globals__ }}",
    ]:
        with pytest.raises(EdgespecError, match="chat template failed"):
            render_template(hostile, chat)


def gguf_template(path: Path) -> tuple[str, str, str]:
    """A GGUF's own template with its BOS and EOS texts, read from the file (no llama.cpp)."""
    meta = read_info(path).metadata
    table = read_token_table(path)
    bos, eos = (int(meta.get(f"tokenizer.ggml.{k}_token_id", -1)) for k in ("bos", "eos"))
    return meta["tokenizer.chat_template"], table.text(bos) if bos >= 0 else "", table.text(eos)


def test_qwen25_template_from_the_gguf_with_tools(target_path):
    source, _, eos = gguf_template(target_path)
    assert eos == "<|im_end|>"
    text = render_template(source, TOOL_TURNS[1:], tools=TOOLS)
    assert "# Tools" in text and f"<tools>\n{TOOL_JSON}\n</tools>" in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in text
    )
    assert "<|im_start|>user\n<tool_response>\n" + '{"temp": 21}' + "\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_template_from_the_gguf(smol_path):
    source, _, eos = gguf_template(smol_path)
    text = render_template(
        source, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert eos == "<|im_end|>"

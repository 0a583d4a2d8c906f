"""Thinking text told apart from the answer (``server.reasoning``), model-free: the split
of a whole answer and of the same answer streamed in every chunking agree; the template
switches a request asks for reach the Qwen3 and DeepSeek-R1 templates (fixtures written
for these tests, in tests/fixtures/templates/)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from edgespec.runtime.chat_template import render_template
from edgespec.server.errors import ApiError
from edgespec.server.reasoning import ReasoningSetup, ThinkSplitter, reasoning_setup, split, template_switches

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
QWEN3 = (TEMPLATES / "qwen3.jinja").read_text()
R1 = (TEMPLATES / "deepseek_r1.jinja").read_text()
HELLO = [{"role": "user", "content": "Hi"}]
PARSE = ReasoningSetup(parse=True)
OPEN = ReasoningSetup(parse=True, open=True)


@pytest.mark.parametrize(
    ("text", "setup", "expected"),
    [
        ("<think>\nhmm, 2+2\n</think>\n\nFour.", PARSE, ("\nhmm, 2+2\n", "Four.")),
        ("  <think>a</think>b", PARSE, ("a", "b")),
        ("Four.", PARSE, (None, "Four.")),
        ("Four. <think>x</think>", PARSE, (None, "Four. <think>x</think>")),  # not at the start
        ("<think>cut before the end", PARSE, ("cut before the end", "")),
        ("<think></think>\n\nFour.", PARSE, ("", "Four.")),
        ("the prompt opened it\n</think>\n\nFour.", OPEN, ("the prompt opened it\n", "Four.")),
        ("<think>x</think>y", ReasoningSetup(), (None, "<think>x</think>y")),  # not parsed
        ("<thin", PARSE, (None, "<thin")),  # an answer that only looked like a marker
        ("", PARSE, (None, "")),
    ],
)
def test_split_whole(text: str, setup: ReasoningSetup, expected: tuple) -> None:
    assert split(text, setup) == expected


def test_stream_agrees_with_whole_in_every_chunking() -> None:
    rng = random.Random(7)
    texts = [
        "<think>\nstep one </thin k> step two\n</think>\n\nThe answer is <b>4</b>.",
        "  \n<think>a<</think>\n  b</think>c",
        "plain <think> text",
        "<think>never closed </th",
    ]
    for text in texts:
        for setup in (PARSE, OPEN, ReasoningSetup()):
            expected = split(text, setup)
            for _ in range(50):
                cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 8))))
                pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
                splitter = ThinkSplitter(setup)
                out = [p for piece in pieces for p in splitter.feed(piece)] + splitter.finish()
                reasoning = "".join(t for kind, t in out if kind == "reasoning")
                content = "".join(t for kind, t in out if kind == "content")
                assert (reasoning if splitter.thought else None, content) == expected, (text, pieces)
                kinds = [kind for kind, _ in out]
                assert kinds == sorted(kinds, key=lambda k: k == "content"), "reasoning comes first"


def test_switches_from_the_request() -> None:
    assert template_switches({}) == {}
    assert template_switches({"reasoning_effort": "low"}) == {
        "enable_thinking": False,
        "reasoning_effort": "low",
    }
    assert template_switches({"reasoning_effort": "high"})["enable_thinking"] is True
    assert template_switches({"chat_template_kwargs": {"enable_thinking": False}}) == {
        "enable_thinking": False
    }
    # The explicit switch wins over the effort.
    assert (
        template_switches({"reasoning_effort": "high", "enable_thinking": False})["enable_thinking"] is False
    )
    for body, param in [
        ({"reasoning_effort": "max"}, "reasoning_effort"),
        ({"enable_thinking": "yes"}, "enable_thinking"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        ({"reasoning_format": "xml"}, "reasoning_format"),
    ]:
        with pytest.raises(ApiError) as raised:
            reasoning_setup(body, QWEN3, "", template_switches(body))
        assert raised.value.status == 400 and raised.value.param == param


def test_qwen3_template_switch_and_setup() -> None:
    on = render_template(QWEN3, HELLO, **template_switches({"reasoning_effort": "high"}))
    off = render_template(QWEN3, HELLO, **template_switches({"reasoning_effort": "none"}))
    assert on.endswith("<|im_start|>assistant\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # Thinking on: the model opens <think> itself; off: the block is closed in the prompt.
    assert reasoning_setup({}, QWEN3, on[-40:], {}) == PARSE
    assert reasoning_setup({}, QWEN3, off[-40:], {}) == PARSE
    assert split("Hello!", reasoning_setup({}, QWEN3, off[-40:], {})) == (None, "Hello!")
    # reasoning_format none keeps the thinking in the content, as generated.
    assert reasoning_setup({"reasoning_format": "none"}, QWEN3, on[-40:], {}) == ReasoningSetup()
    # A template with no thinking is not read for it, unless the request turns it on.
    assert reasoning_setup({}, "{{ messages }}", "x", {}) == ReasoningSetup()
    assert reasoning_setup({}, "{{ messages }}", "x", {"enable_thinking": True}) == PARSE


def test_deepseek_r1_prompt_opens_the_thinking() -> None:
    text = render_template(R1, [{"role": "system", "content": "Be brief."}, *HELLO], bos_token="<s>")
    assert text == "<s>Be brief.<｜User｜>Hi<｜Assistant｜><think>\n"
    setup = reasoning_setup({}, R1, text[-30:], {})
    assert setup == OPEN
    assert split("2+2 is 4.\n</think>\n\n4", setup) == ("2+2 is 4.\n", "4")
    # An earlier answer comes back without its reasoning.
    history = [
        *HELLO,
        {"role": "assistant", "content": "<think>x</think>\n\nHello"},
        {"role": "user", "content": "Again"},
    ]
    again = render_template(R1, history)
    assert "<｜Assistant｜>Hello<｜end▁of▁sentence｜><｜User｜>Again" in again and "x</think>" not in again


def _vendored_templates() -> Path | None:
    """The real templates llama.cpp ships (models/templates/ of its source), where the
    llama-server build for the sessions benchmark left that source in the cache."""
    from edgespec.bootstrap import llama_cpp_source

    templates = llama_cpp_source() / "models" / "templates"
    return templates if templates.is_dir() else None


REAL = _vendored_templates()


@pytest.mark.skipif(
    REAL is None, reason="llama.cpp's source is not in the cache (edgespec bench --sessions builds it)"
)
@pytest.mark.parametrize(
    ("name", "effort", "opens", "closed_in_prompt"),
    [
        ("Qwen-Qwen3-0.6B.jinja", None, False, False),
        ("Qwen-Qwen3-0.6B.jinja", "none", False, True),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "high", True, False),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", None, True, False),
    ],
)
def test_the_real_templates(name: str, effort: str | None, opens: bool, closed_in_prompt: bool) -> None:
    """Qwen3 and the DeepSeek-R1 distills as their GGUFs ship them: where the prompt leaves
    the thinking, and how the answer is read."""
    assert REAL is not None
    source = (REAL / name).read_text()
    body = {} if effort is None else {"reasoning_effort": effort}
    switches = template_switches(body)
    history = [*HELLO, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}]
    text = render_template(source, history, bos_token="<s>", **switches)
    setup = reasoning_setup(body, source, text[-40:], switches)
    assert setup == ReasoningSetup(parse=True, open=opens)
    assert text.rstrip().endswith("</think>") == closed_in_prompt
    answer = (
        "so 4\n</think>\n\nFour." if opens else ("Four." if closed_in_prompt else "<think>so 4</think>Four.")
    )
    assert split(answer, setup)[1] == "Four."

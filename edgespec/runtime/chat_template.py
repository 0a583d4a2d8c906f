"""Chat messages to prompt tokens, with the chat template embedded in the GGUF.

Templates are Jinja2 (the Hugging Face convention) and are rendered in a sandbox: a
model file is data and must not run arbitrary code. The environment offers what the
main families' templates use (Llama 3.x, Mistral, Qwen2.5, Qwen3, Gemma 3): ``tojson``
that writes plain JSON, ``raise_exception``, ``strftime_now``, ``{% break %}`` and
``{% continue %}``; and the context they read: ``messages`` (with assistant
``tool_calls`` and ``tool`` results), ``tools`` (an OpenAI tools list), ``bos_token``,
``eos_token``, ``add_generation_prompt``, plus any template switch a caller passes
(Qwen3's ``enable_thinking``).

How a turn ends is the model's business, not the template's: every family's end-of-turn
token (``<|eot_id|>``, ``<|im_end|>``, ``<end_of_turn>``, ``</s>``) is one of llama.cpp's
end-of-generation tokens (``Model.is_eog``), where generation stops.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgespec.errors import EdgespecError
from edgespec.runtime.messages import normalise_messages
from edgespec.runtime.model import Model

# Used only when a GGUF carries no template: ChatML, which most small instruct models know.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False
):
    """Plain JSON, as the templates expect (Jinja's own filter escapes <, > and & for HTML)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _check_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if (
        not isinstance(tools, Sequence)
        or isinstance(tools, str)
        or not all(isinstance(t, Mapping) for t in tools)
    ):
        raise EdgespecError("tools must be a list of tool definitions (objects)")
    return [dict(t) for t in tools] or None


def render_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> str:
    """Render a chat template's ``source``; ``template_kwargs`` are switches the template
    reads (``enable_thinking=False`` for Qwen3)."""
    context = {
        **template_kwargs,
        "messages": normalise_messages(messages),
        "add_generation_prompt": add_generation_prompt,
        "bos_token": bos_token,
        "eos_token": eos_token,
    }
    checked = _check_tools(tools)
    if checked is not None:
        context["tools"] = checked
    try:
        return _compile(source).render(**context)
    except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise EdgespecError(f"the model's chat template failed: {exc}") from None


def render(
    model: Model,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> str:
    source = model.chat_template or CHATML
    return render_template(
        source,
        messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=model.token_text(model.bos) if model.bos >= 0 else "",
        eos_token=model.token_text(model.eos) if model.eos >= 0 else "",
        tools=tools,
        **template_kwargs,
    )


def chat_tokens(
    model: Model,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> list[int]:
    """Render and tokenize; special tokens in the template (<|im_start|> …) are parsed as
    such, and a BOS the template already wrote is not added twice."""
    text = render(model, messages, tools=tools, **template_kwargs)
    bos_text = model.token_text(model.bos) if model.bos >= 0 else ""
    add_bos = model.adds_bos and not (bos_text and text.startswith(bos_text))
    return model.tokenize(text, add_special=add_bos, parse_special=True)

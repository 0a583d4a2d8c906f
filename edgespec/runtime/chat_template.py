"""Chat messages to prompt tokens, with the chat template embedded in the GGUF.

Templates are Jinja2 (the Hugging Face convention) and are rendered in a sandbox: a
model file is data and must not run arbitrary code.
"""

from __future__ import annotations

from functools import lru_cache

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgespec.errors import EdgespecError
from edgespec.runtime.model import Model

# Used only when a GGUF carries no template: ChatML, which most small instruct models know.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

ROLES = ("system", "user", "assistant")


def _raise(message: str) -> None:
    raise TemplateError(message)


@lru_cache(maxsize=8)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def render(model: Model, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    for message in messages:
        if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise EdgespecError("each chat message needs a role (system, user, assistant) and text content")
    source = model.metadata("tokenizer.chat_template") or CHATML
    bos = model.token_text(model.bos) if model.bos >= 0 else ""
    eos = model.token_text(model.eos) if model.eos >= 0 else ""
    try:
        return _compile(source).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
        )
    except TemplateError as exc:
        raise EdgespecError(f"the model's chat template failed: {exc}") from None


def chat_tokens(model: Model, messages: list[dict[str, str]]) -> list[int]:
    """Render and tokenize; special tokens in the template (<|im_start|> …) are parsed as
    such, and a BOS the template already wrote is not added twice."""
    text = render(model, messages)
    bos_text = model.token_text(model.bos) if model.bos >= 0 else ""
    add_bos = model.adds_bos and not (bos_text and text.startswith(bos_text))
    tokens = model.tokenize(text, add_special=add_bos, parse_special=True)
    return tokens

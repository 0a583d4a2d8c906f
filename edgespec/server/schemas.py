"""Request bodies → validated generation jobs.

Validation is done by hand rather than with pydantic models so that every refusal is one
sentence naming the field, in OpenAI's error shape. Tools (``server.tools``), structured
output, log-probabilities and penalties (``server.fields``) are honoured; what the engine
cannot honour (several choices, audio, ``echo``, ``suffix``, ``best_of``) is refused
with a 400, never ignored: a client that asked for it would otherwise get something else
than it believes.

Besides OpenAI's fields a request may carry edgespec's own, named like the CLI's flags:
``drafter`` (``auto``, the default, a registered drafter's name, or ``none``), ``gamma``
(``auto``, the default, or tokens drafted per step from 0 to 64), ``verify`` (``token``
or ``block``) and ``lenience`` (in (0, 1]; 1 keeps the output exact). Drafter and γ are
checked by ``decoding.choice.check_choice`` (γ by its one parser, ``parse_gamma``), the one
check every front end shares; a refusal names the field in ``param``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from edgespec.api import EdgeSpec
from edgespec.decoding.choice import DEFAULT_DRAFTER, DEFAULT_GAMMA
from edgespec.decoding.request import Request
from edgespec.errors import EdgespecError, RequestError
from edgespec.server import fields, reasoning
from edgespec.server.errors import ApiError, bad_request
from edgespec.server.tools import ToolSetup, parse_tools

DEFAULT_MODEL = "default"

# Fields shared by both endpoints that are accepted as they are.
_COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "prediction",
    # structured output, log-probabilities and penalties (server.fields)
    "response_format",
    "grammar",
    "json_schema",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "logit_bias",
    # edgespec's own speculation fields, named like the CLI's flags
    "drafter",
    "gamma",
    "verify",
    "lenience",
    # reasoning models: the chat template's switches (``server.reasoning``)
    "chat_template_kwargs",
    "reasoning_effort",
    "enable_thinking",
    "reasoning_format",
    # bookkeeping fields that change nothing about the answer
    "user",
    "metadata",
    "store",
}
_CHAT = _COMMON | {
    "messages",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "top_logprobs",
}
_TEXT = _COMMON | {"prompt"}

# Fields the engine cannot honour, with the value that means "not used" (sent by some
# clients by default, so that value is accepted).
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "web_search_options": (None,),
    "service_tier": (None, "auto", "default"),
}


@dataclass(frozen=True)
class Form:
    """One of OpenAI's two answer shapes: a chat completion (messages in, a message out)
    or a text completion (a prompt in, its continuation out): what tells them apart, as
    data (their choices are shaped in ``server.chunks``)."""

    kind: str  # a Job's ``kind``
    id_prefix: str
    object: str  # a whole answer's ``object``
    chunk_object: str  # a stream chunk's
    prompt_param: str  # the field holding the prompt, which a refusal of the prompt names
    logprobs_param: str  # the field asking for the most likely tokens per position


CHAT = Form("chat", "chatcmpl", "chat.completion", "chat.completion.chunk", "messages", "top_logprobs")
TEXT = Form("text", "cmpl", "text_completion", "text_completion", "prompt", "logprobs")
FORMS = {form.kind: form for form in (CHAT, TEXT)}


@dataclass
class Job:
    """One validated request, ready for the engine."""

    kind: str  # "chat" or "text": a ``Form``'s kind
    request: Request
    stream: bool
    include_usage: bool
    model: str
    tools: ToolSetup = field(default_factory=ToolSetup)
    reasoning: reasoning.ReasoningSetup = field(default_factory=reasoning.ReasoningSetup)
    # Request fields the server did not know and ignored (named in a response header).
    ignored: list[str] = field(default_factory=list)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{self.form.id_prefix}-{uuid.uuid4().hex[:24]}"

    @property
    def form(self) -> Form:
        return FORMS[self.kind]


@dataclass(frozen=True)
class _Asked:
    """Every field of a body but its prompt, checked as the wire format types them, in
    one pass before the prompt is rendered: what the request and its job are built from."""

    model: str
    stream: bool
    include_usage: bool
    limit: str  # the field the answer's length limit came in (a refusal names it)
    max_tokens: int | None  # None: what the context leaves after the prompt
    keywords: dict[str, Any]  # for ``lm.request``: drafting and ``settings_from``'s


def parse_chat(body: Any, lm: EdgeSpec) -> Job:
    body = _object(body)
    ignored = _check_fields(body, _CHAT)
    # The template's tools come first: a required call's grammar is a sampling field.
    tools = parse_tools(body, lm.target.chat_template, lm.target.name)
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    asked = _asked(body, CHAT, lm, limit, tools)
    tokens, switches = _chat_tokens(body, lm, tools)
    thinking = reasoning.reasoning_setup(body, lm.target.chat_template, _prompt_end(lm, tokens), switches)
    return _job(CHAT, asked, tokens, lm, tools=tools, thinking=thinking, ignored=ignored)


def chat_prompt(body: dict, lm: EdgeSpec) -> list[int]:
    """A chat body's prompt tokens: its messages and tools through the model's template,
    with the template switches it asks for."""
    return _chat_tokens(body, lm, parse_tools(body, lm.target.chat_template, lm.target.name))[0]


def _chat_tokens(body: dict, lm: EdgeSpec, tools: ToolSetup) -> tuple[list[int], dict[str, Any]]:
    """The prompt's tokens and the template switches they were rendered with."""
    messages = body.get("messages")
    if isinstance(messages, str):  # (the Python API's shorthand for one user message)
        raise bad_request("'messages' must be a list of messages", "messages")
    switches = reasoning.template_switches(body)
    try:
        tokens = lm.prompt_tokens(messages, chat=True, tools=tools.tools, **switches)
    except RequestError as exc:
        raise bad_request(str(exc), exc.param) from None
    except EdgespecError as exc:
        raise bad_request(str(exc), "messages") from None
    return tokens, switches


def _prompt_end(lm: EdgeSpec, tokens: list[int], count: int = 8) -> str:
    """The prompt's last tokens as text, special tokens written out (``<think>``)."""
    return lm.target.detokenize(tokens[-count:])


def parse_completion(body: Any, lm: EdgeSpec) -> Job:
    body = _object(body)
    ignored = _check_fields(body, _TEXT)
    asked = _asked(body, TEXT, lm, "max_tokens", ToolSetup())
    return _job(TEXT, asked, _text_tokens(body.get("prompt"), lm), lm, ignored=ignored)


def _text_tokens(prompt: Any, lm: EdgeSpec) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of one: the common client shape
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return list(prompt)  # (their range: the request builder checks it)
    if isinstance(prompt, str):
        try:
            return lm.prompt_tokens(prompt)
        except EdgespecError as exc:
            raise bad_request(str(exc), "prompt") from None
    if prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    raise bad_request("'prompt' must be a string (batches of prompts are not supported)", "prompt")


def check_model(requested: Any, lm: EdgeSpec) -> str:
    """The served name: any ``model`` is answered by the loaded target (agents name their
    own models, "claude-…", "gpt-…"), as llama-server does; ``/v1/models`` says what is
    loaded."""
    if requested is not None and not isinstance(requested, str):
        raise bad_request("'model' must be a string", "model")
    return lm.target.name


# -- helpers -------------------------------------------------------------------------------


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _check_fields(body: dict, allowed: set[str]) -> list[str]:
    """Fields this server does not know, which it ignores (as llama-server and vLLM do:
    front ends and SDKs add vendor fields of their own); a known field the engine cannot
    honour, set to something other than its "not used" value, is refused."""
    ignored = []
    for name, value in body.items():
        if name in _UNSUPPORTED:
            if any(value == ok and type(value) is type(ok) for ok in _UNSUPPORTED[name]) or value is None:
                continue
            raise bad_request(f"'{name}' is not supported by this server", name, "unsupported_parameter")
        if name not in allowed:
            ignored.append(name)
    return ignored


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text_content(content: Any, param: str) -> str:
    """A message's content: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            is_text = isinstance(part, dict) and part.get("type") == "text"
            if not is_text or not isinstance(part.get("text"), str):
                raise bad_request(f"'{param}' may only hold parts of type 'text'", param)
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"'{param}' must be a string or a list of text parts", param)


def _prediction(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "content":
        raise bad_request("'prediction' must be {'type': 'content', 'content': ...}", "prediction")
    return _text_content(value.get("content"), "prediction.content") or None


def _typed(body: dict, name: str, check, what: str, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if not check(value):
        raise bad_request(f"'{name}' must be {what} (got {value!r})", name)
    return value


def _asked(body: dict, form: Form, lm: EdgeSpec, limit: str, tools: ToolSetup) -> _Asked:
    """This module checks the wire format's types; the request builder what the values
    mean."""
    stream, include_usage = _stream_options(body)
    keywords = {
        "drafter": _or(body, "drafter"),
        "gamma": _or(body, "gamma"),
        "prediction": _prediction(body.get("prediction")),
        **_sampling(body, form, lm, tools),
    }
    return _Asked(
        model=check_model(body.get("model"), lm),
        stream=stream,
        include_usage=include_usage,
        limit=limit,
        max_tokens=_typed(body, limit, _is_int, "an integer", None),
        keywords=keywords,
    )


def _job(
    form: Form,
    asked: _Asked,
    tokens: list[int],
    lm: EdgeSpec,
    *,
    tools: ToolSetup | None = None,
    thinking: reasoning.ReasoningSetup | None = None,
    ignored: list[str],
) -> Job:
    """The job, its request built by the one request builder (``lm.request``) in one call."""
    # Without a limit the answer may fill what is left of the context (a prompt that
    # leaves no room is refused for its length by the builder).
    max_tokens = asked.max_tokens if asked.max_tokens is not None else max(lm.target.n_ctx - len(tokens), 1)
    try:
        request = lm.request(tokens, max_tokens=max_tokens, **asked.keywords)
    except RequestError as exc:
        raise _refusal(exc, form, asked.limit) from None
    except EdgespecError as exc:
        raise bad_request(str(exc)) from None
    return Job(
        kind=form.kind,
        request=request,
        stream=asked.stream,
        include_usage=asked.include_usage,
        model=asked.model,
        tools=tools or ToolSetup(),
        reasoning=thinking or reasoning.ReasoningSetup(),
        ignored=ignored,
    )


def _or(body: dict, name: str) -> Any:
    """edgespec's own drafting fields: absent means the default."""
    value = body.get(name)
    return (DEFAULT_DRAFTER if name == "drafter" else DEFAULT_GAMMA) if value is None else value


def _refusal(exc: RequestError, form: Form, limit: str) -> ApiError:
    """A builder's refusal in the wire format's words: its field names, OpenAI's codes."""
    param = exc.param
    if param == "max_tokens":
        param = limit
    elif param == "prompt":
        param = form.prompt_param
    elif param == "top_logprobs":
        param = form.logprobs_param
    return bad_request(str(exc), param, exc.code)


def _stream_options(body: dict) -> tuple[bool, bool]:
    """(stream, include usage): one answer per request, streamed or whole."""
    n = _typed(body, "n", _is_int, "an integer", 1)
    if n != 1:
        raise bad_request(f"'n' must be 1: one answer per request (got {n})", "n", "unsupported_parameter")
    stream = _typed(body, "stream", lambda v: isinstance(v, bool), "true or false", False)
    options = _typed(body, "stream_options", lambda v: isinstance(v, dict), "an object", {})
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad_request("'stream_options.include_usage' must be true or false", "stream_options")
    if options and not stream:
        raise bad_request("'stream_options' is only allowed with 'stream': true", "stream_options")
    return stream, include_usage


def _sampling(body: dict, form: Form, lm: EdgeSpec, tools: ToolSetup) -> dict[str, Any]:
    """``settings_from`` keywords from the body's sampling, penalty and shaping fields."""
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("'stop' must be a non-empty string or a list of them", "stop")
    sampling = {
        "stop": stop,
        "temperature": _typed(body, "temperature", _is_number, "a number", 0.0),
        "top_p": _typed(body, "top_p", _is_number, "a number", 1.0),
        "top_k": _typed(body, "top_k", _is_int, "an integer", 0),
        "min_p": _typed(body, "min_p", _is_number, "a number", 0.0),
        "seed": _typed(body, "seed", _is_int, "an integer", None),
        "lenience": _typed(body, "lenience", _is_number, "a number", 1.0),
        "verify": _typed(body, "verify", lambda v: isinstance(v, str), "'token' or 'block'", "token"),
    }
    if sampling["temperature"] > 2:  # OpenAI's bound: the engine itself takes any
        raise bad_request(f"'temperature' must be in [0, 2] (got {sampling['temperature']})", "temperature")
    extras = fields.penalties(body)
    extras["logprobs"] = fields.logprobs(body, form.kind)
    grammar = fields.constraint(body, lm.target)
    if tools.grammar is not None:
        if grammar is not None:
            raise bad_request(
                "a required tool call and 'response_format' cannot both shape the answer", "tool_choice"
            )
        grammar = tools.grammar
    return {**sampling, **extras, "grammar": grammar}

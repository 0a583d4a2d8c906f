"""The OpenAI request fields beyond plain text generation, checked one by one (each refusal
a 400 naming its field), and log-probabilities in OpenAI's two response shapes.

* ``response_format``: ``text``, ``json_object`` or ``json_schema`` (``{"name", "schema",
  "strict"}``); llama-server's ``grammar`` (GBNF) and ``json_schema`` fields too.
* ``logprobs`` / ``top_logprobs`` (chat: a flag and 0-20; completions: ``logprobs`` 0-20);
  each token's log-probability is the target's own at its position.
* ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, and llama-server's
  ``repeat_penalty`` and ``repeat_last_n`` (see ``edgespec.decoding.penalties``).
"""

from __future__ import annotations

import math
from typing import Any

from edgespec.decoding.events import Token
from edgespec.decoding.grammar import (
    GrammarError,
    GrammarSpec,
    compile_grammar,
    json_object_grammar,
    schema_grammar,
)
from edgespec.decoding.request import MAX_TOP_LOGPROBS
from edgespec.server.errors import bad_request


def _number(body: dict, name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number (got {value!r})", name)
    if not low <= value <= high:
        raise bad_request(f"'{name}' must be in [{low:g}, {high:g}] (got {value!r})", name)
    return float(value)


def penalties(body: dict, n_vocab: int) -> dict[str, Any]:
    """Keyword arguments for ``settings_from``."""
    out: dict[str, Any] = {
        "presence_penalty": _number(body, "presence_penalty", -2.0, 2.0, 0.0),
        "frequency_penalty": _number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        "repeat_penalty": _number(body, "repeat_penalty", 1e-6, 1e6, 1.0),
    }
    last_n = body.get("repeat_last_n")
    if last_n is not None:
        if isinstance(last_n, bool) or not isinstance(last_n, int) or last_n < -1:
            raise bad_request(f"'repeat_last_n' must be an integer >= -1 (got {last_n!r})", "repeat_last_n")
        out["repeat_last_n"] = last_n
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise bad_request("'logit_bias' must map token ids to numbers", "logit_bias")
        parsed: dict[int, float] = {}
        for key, value in bias.items():
            token = int(key) if isinstance(key, str) and key.strip().isdigit() and len(key) < 12 else None
            if token is None or not 0 <= token < n_vocab:
                raise bad_request(
                    f"'logit_bias' keys must be token ids in [0, {n_vocab}) (got {key!r})", "logit_bias"
                )
            if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
                raise bad_request(
                    f"'logit_bias' values must be numbers in [-100, 100] (got {value!r})", "logit_bias"
                )
            parsed[token] = float(value)
        out["logit_bias"] = parsed
    return out


def logprobs(body: dict, kind: str) -> int | None:
    """How many of the most likely tokens to report beside each chosen one (None: no
    log-probabilities at all)."""
    value = body.get("logprobs")
    if kind == "text":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
            raise bad_request(
                f"'logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS} (got {value!r})", "logprobs"
            )
        return value
    if value is not None and not isinstance(value, bool):
        raise bad_request(f"'logprobs' must be true or false (got {value!r})", "logprobs")
    top = body.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad_request(
                f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS} (got {top!r})",
                "top_logprobs",
            )
        if not value:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if value else None


def constraint(body: dict, model: Any) -> GrammarSpec | None:
    """The grammar the answer must follow: from ``response_format``, or llama-server's
    ``grammar`` / ``json_schema`` fields (one of them)."""
    given = [name for name in ("response_format", "grammar", "json_schema") if body.get(name) is not None]
    if len(given) > 1:
        raise bad_request(f"give one of {', '.join(given)}, not several", given[1])
    try:
        if body.get("grammar") is not None:
            grammar = body["grammar"]
            if not isinstance(grammar, str) or not grammar.strip():
                raise bad_request("'grammar' must be a GBNF grammar (a string)", "grammar")
            return compile_grammar(grammar, model=model)
        if body.get("json_schema") is not None:
            return GrammarSpec(schema_grammar(body["json_schema"]))
        return _response_format(body.get("response_format"))
    except GrammarError as exc:
        raise bad_request(str(exc), exc.param) from None


def _response_format(value: Any) -> GrammarSpec | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec(json_object_grammar())
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise bad_request(
                "'response_format.json_schema' must be {'name': …, 'schema': {…}, 'strict': …}",
                "response_format",
            )
        return GrammarSpec(schema_grammar(spec.get("schema") or {"type": "object"}))
    raise bad_request(
        "'response_format.type' must be 'text', 'json_object' or 'json_schema'", "response_format"
    )


# -- responses ---------------------------------------------------------------------------


def _entry(piece: bytes, logprob: float) -> dict[str, Any]:
    return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(piece)}


def chat_logprobs(tokens: list[Token], piece) -> list[dict[str, Any]]:
    """Chat's ``logprobs.content``: one entry per token, with its top alternatives."""
    return [
        {
            **_entry(piece(t.token), t.logprob if t.logprob is not None else 0.0),
            "top_logprobs": [_entry(piece(i), lp) for i, lp in t.top_logprobs],
        }
        for t in tokens
    ]


def text_logprobs(tokens: list[Token], piece, offset: int = 0) -> dict[str, Any]:
    """Completions' ``logprobs``: parallel lists of tokens, their log-probabilities, their
    top alternatives and where each starts in the text."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in tokens:
        text = piece(t.token).decode("utf-8", errors="replace")
        out["tokens"].append(text)
        out["token_logprobs"].append(t.logprob)
        out["top_logprobs"].append(
            {piece(i).decode("utf-8", errors="replace"): lp for i, lp in t.top_logprobs}
        )
        out["text_offset"].append(offset)
        offset += len(text)
    return out

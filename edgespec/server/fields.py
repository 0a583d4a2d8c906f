"""The OpenAI request fields beyond plain text generation, read as the wire types them
(each refusal a 400 naming its field; what the values may be, the request builder checks,
for every front end alike), and log-probabilities in OpenAI's two response shapes.

* ``response_format``: ``text``, ``json_object`` or ``json_schema`` (``{"name", "schema",
  "strict"}``); llama-server's ``grammar`` (GBNF) and ``json_schema`` fields too.
* ``logprobs`` / ``top_logprobs`` (chat: a flag and 0-20; completions: ``logprobs`` 0-20);
  each token's log-probability is the target's own at its position.
* ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, and llama-server's
  ``repeat_penalty`` and ``repeat_last_n`` (see ``edgespec.decoding.penalties``).
"""

from __future__ import annotations

from typing import Any

from edgespec.api import constraint_from, one_constraint
from edgespec.decoding.events import Token
from edgespec.decoding.grammar import GrammarError, GrammarSpec
from edgespec.errors import RequestError
from edgespec.server.errors import bad_request


def penalties(body: dict) -> dict[str, Any]:
    """Keyword arguments for ``settings_from``: the fields as the request builder takes
    them (their ranges, and ``logit_bias``'s ids against the vocabulary, it checks)."""
    out: dict[str, Any] = {
        name: body[name]
        for name in ("presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n")
        if body.get(name) is not None
    }
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise bad_request("'logit_bias' must map token ids to numbers", "logit_bias")
        out["logit_bias"] = {_token_id(key): value for key, value in bias.items()}
    return out


def _token_id(key: str) -> int:
    """A ``logit_bias`` key: JSON writes the token id as a string."""
    text = key.strip() if isinstance(key, str) else ""
    try:
        if text.isascii() and text.isdigit():
            return int(text)
    except ValueError:  # more digits than Python reads: no token id either
        pass
    raise bad_request(f"'logit_bias' keys must be token ids, whole numbers (got {key!r})", "logit_bias")


def logprobs(body: dict, kind: str) -> int | None:
    """How many of the most likely tokens to report beside each chosen one (None: no
    log-probabilities at all); how many may be asked for, the request builder checks."""
    value = body.get("logprobs")
    if kind == "text":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad_request(f"'logprobs' must be an integer (got {value!r})", "logprobs")
        return value
    if value is not None and not isinstance(value, bool):
        raise bad_request(f"'logprobs' must be true or false (got {value!r})", "logprobs")
    top = body.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int):
            raise bad_request(f"'top_logprobs' must be an integer (got {top!r})", "top_logprobs")
        if not value:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if value else None


def constraint(body: dict, model: Any) -> GrammarSpec | None:
    """The grammar the answer must follow: from ``response_format``, or llama-server's
    ``grammar`` / ``json_schema`` fields (one of them), built by the one builder every front
    end uses (``constraint_from``); this reads only the wire's shapes."""
    given = [name for name in ("response_format", "grammar", "json_schema") if body.get(name) is not None]
    try:
        one_constraint(given)  # in the wire's names, before they become the builder's
        return constraint_from(**_constraint_keywords(body), model=model)
    except (GrammarError, RequestError) as exc:
        raise bad_request(str(exc), exc.param) from None


_NO_CONSTRAINT: dict[str, Any] = {"grammar": None, "json_schema": None, "json_object": False}


def _constraint_keywords(body: dict) -> dict[str, Any]:
    """``constraint_from``'s keywords for the one constraint the body gives."""
    if body.get("grammar") is not None:
        return {**_NO_CONSTRAINT, "grammar": body["grammar"]}
    if body.get("json_schema") is not None:
        return {**_NO_CONSTRAINT, "json_schema": body["json_schema"]}
    return _response_format(body.get("response_format"))


def _response_format(value: Any) -> dict[str, Any]:
    if value is None:
        return _NO_CONSTRAINT
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return _NO_CONSTRAINT
    if kind == "json_object":
        return {**_NO_CONSTRAINT, "json_object": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise bad_request(
                "'response_format.json_schema' must be {'name': …, 'schema': {…}, 'strict': …}",
                "response_format",
            )
        return {**_NO_CONSTRAINT, "json_schema": spec.get("schema") or {"type": "object"}}
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

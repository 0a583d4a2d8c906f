"""OpenAI-shaped response bodies and stream chunks, with edgespec's additions.

Every finished answer carries OpenAI ``usage`` (predicted-output counts included) and two
objects of edgespec's own: in a whole answer beside ``usage``, in a stream on its last
chunk (the usage chunk when ``stream_options.include_usage`` asks for one). Plain OpenAI
clients ignore the fields they do not know.

``timings`` follows llama-server's definitions, so that tools reading llama-server's
figures read ours alike. The first token closes the prompt phase:

* ``prompt_n``: prompt tokens computed for this request; ``cache_n``: prompt tokens
  already in the target's cache (a conversation's earlier turns), not computed again.
* ``prompt_ms``: from the start of the request's work to its first token;
  ``prompt_per_token_ms`` = prompt_ms / prompt_n; ``prompt_per_second`` =
  prompt_n / prompt_ms × 1000.
* ``predicted_n``: tokens generated, the first included; ``predicted_ms``: from the first
  token to the last; ``predicted_per_token_ms`` = predicted_ms / predicted_n;
  ``predicted_per_second`` = predicted_n / predicted_ms × 1000 (llama-server's own rate,
  which counts the first token but not its time).
* ``decode_per_second``: edgespec's decode-phase rate, tokens after the first over the
  time after the first: (predicted_n − 1) / predicted_ms × 1000. This is the figure the
  CLI calls "decode" and speculation speeds up.
* ``draft_n``, ``draft_n_accepted``: tokens drafted and, of those, accepted.

A rate whose time or count is zero is 0.

``speculation`` says how the answer was drafted:

* ``drafter``, ``gamma``: what the request asked for (``auto`` unless it named one).
* ``steps``: target passes after the first token; ``drafted``, ``accepted``: their totals.
* ``tau``: tokens per target pass after the first token (1.0 with no drafting);
  ``acceptance_rate``: accepted / drafted. Each is null where it has nothing to stand on
  (no step; nothing drafted).
* ``drafters``: per drafter that ran ("none": steps with no draft), its ``steps``,
  ``drafted`` and ``accepted``.
* ``runs``: every step of the answer in order, run-length encoded: one object per run of
  consecutive steps with the same drafter and γ, ``{"drafter", "gamma", "steps",
  "accepted"}`` (``accepted``: over the run's steps). The runs' steps add up to ``steps``.
* ``gamma_histogram``: steps per drafted length, ``{"γ": steps}`` in increasing γ (keys
  are strings, as JSON wants): how often long drafts ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from edgespec.decoding.events import Done, Step, Token
from edgespec.server import fields, reasoning, toolcalls
from edgespec.server.schemas import CHAT, Job

FINISH_REASONS = {
    "eos": "stop",
    "stop_string": "stop",
    "cancelled": "stop",
    "max_tokens": "length",
    "context_full": "length",
}


class Speculation:
    """Folds ``Step`` events into per-drafter totals, runs of equal steps and the
    histogram of drafted lengths (the ``speculation`` object above)."""

    def __init__(self) -> None:
        self.drafters: dict[str, dict[str, int]] = {}
        self.runs: list[dict] = []
        self.gammas: dict[int, int] = {}

    def add(self, step: Step) -> None:
        totals = self.drafters.setdefault(step.drafter, {"steps": 0, "drafted": 0, "accepted": 0})
        totals["steps"] += 1
        totals["drafted"] += step.gamma
        totals["accepted"] += step.accepted
        self.gammas[step.gamma] = self.gammas.get(step.gamma, 0) + 1
        last = self.runs[-1] if self.runs else None
        if last is not None and last["drafter"] == step.drafter and last["gamma"] == step.gamma:
            last["steps"] += 1
            last["accepted"] += step.accepted
        else:
            self.runs.append(
                {"drafter": step.drafter, "gamma": step.gamma, "steps": 1, "accepted": step.accepted}
            )

    def as_dict(self, job: Job, done: Done) -> dict:
        s = done.stats
        return {
            "drafter": job.request.drafter,
            "gamma": job.request.gamma,
            "steps": sum(t["steps"] for t in self.drafters.values()),
            "drafted": s.drafted,
            "accepted": s.accepted,
            "tau": round(s.tau, 4) if s.target_passes else None,
            "acceptance_rate": round(s.acceptance_rate, 4) if s.drafted else None,
            "drafters": self.drafters,
            "runs": self.runs,
            "gamma_histogram": {str(gamma): self.gammas[gamma] for gamma in sorted(self.gammas)},
        }


def _ending(done: Done) -> dict:
    """Why the answer ended, in edgespec's (llama.cpp's) words beside OpenAI's
    ``finish_reason``: the other wire formats tell a stop string from an end of turn."""
    return {"stop_reason": done.stop_reason, "stop_sequence": done.stop_sequence}


def usage(done: Done, reasoning_tokens: int = 0) -> dict:
    s = done.stats
    return {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.tokens,
        "total_tokens": s.prompt_tokens + s.tokens,
        "prompt_tokens_details": {"cached_tokens": s.reused_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": s.prediction_accepted,
            "rejected_prediction_tokens": s.prediction_rejected,
            "reasoning_tokens": reasoning_tokens,
        },
    }


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 3) if numerator > 0 and denominator > 0 else 0.0


def timings(done: Done) -> dict:
    """llama-server's ``timings`` (see the module's docstring), computed from the rounded
    milliseconds, so that a client recomputing a rate from the body gets the same figure."""
    s = done.stats
    # With no token at all, the whole request was the prompt's.
    first_s = s.ttft_s if s.tokens else s.wall_s
    prompt_n = s.prompt_tokens - s.reused_tokens
    prompt_ms = round(1000 * first_s, 3)
    predicted_ms = round(1000 * max(0.0, s.wall_s - first_s), 3)
    return {
        "cache_n": s.reused_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": _ratio(prompt_ms, prompt_n),
        "prompt_per_second": _ratio(1000 * prompt_n, prompt_ms),
        "predicted_n": s.tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": _ratio(predicted_ms, s.tokens),
        "predicted_per_second": _ratio(1000 * s.tokens, predicted_ms),
        "decode_per_second": _ratio(1000 * max(0, s.tokens - 1), predicted_ms),
        "draft_n": s.drafted,
        "draft_n_accepted": s.accepted,
    }


def finish_reason(done: Done) -> str:
    return FINISH_REASONS.get(done.stop_reason, "stop")


class Answer:
    """One answer's events folded for the client: the speculation summary, the tokens'
    log-probabilities where asked, and, where the request offered tools, the text read
    for tool calls in the model's format (``server.toolcalls``): content while it cannot
    be a call, the calls as OpenAI's ``tool_calls`` once the answer is complete. A
    malformed call leaves the whole text as content."""

    def __init__(self, job: Job, piece: Callable[[int], bytes]):
        self.job = job
        self.piece = piece
        self.speculation = Speculation()
        self.logprobs = job.request.settings.logprobs is not None
        self.tokens: list[Token] = []  # with log-probabilities, in a whole answer
        self.pending: list[Token] = []  # ... not yet sent, in a stream
        self.sent_chars = 0  # where the next completions chunk's text starts
        tools = job.tools
        self.calls = tools.tools is not None and tools.format != "none"  # (a text job has none)
        self.parser = (
            toolcalls.StreamParser(tools.format, set(tools.names), parallel=tools.parallel)
            if self.calls
            else None
        )
        # Models taught the Hermes format also call as a bare or fenced JSON object: an
        # answer that opens with "{" or "```" is held whole and read both ways at its end.
        self.lead: str | None = "" if self.calls and tools.format == "hermes" else None
        self.held: str | None = None
        # Thinking text goes out as ``reasoning_content``, apart from the answer.
        self.thinking = reasoning.ThinkSplitter(job.reasoning)
        self.reasoning_tokens = 0

    def opening(self) -> list[dict]:
        """What a stream sends at once: a chat answer's role, so the client knows it is
        heard even while queued."""
        return [chunk(self.job, role=True, text="")] if self.job.form is CHAT else []

    def add(self, event: Token | Step) -> list[dict]:
        """Stream chunks for one event (none for most: text comes with its token)."""
        if isinstance(event, Step):
            self.speculation.add(event)
            return []
        if self.logprobs:
            self.tokens.append(event)
            self.pending.append(event)
        if self.thinking.thinking:
            self.reasoning_tokens += 1
        return self._split(self.thinking.feed(event.text)) if event.text else []

    def _split(self, pieces: list[tuple[str, str]]) -> list[dict]:
        out: list[dict] = []
        for kind, text in pieces:
            if kind == "reasoning":
                piece = chunk(self.job)
                piece["choices"][0]["delta"] = {"reasoning_content": text}
                out.append(piece)
            else:
                out += self._text(text)
        return out

    def _text(self, text: str) -> list[dict]:
        if self.parser is None:
            return [self._with_logprobs(chunk(self.job, text=text))]
        if self.held is not None:
            self.held += text
            return []
        if self.lead is not None:
            self.lead += text
            start = self.lead.lstrip()
            if not start:
                return []
            text, self.lead = self.lead, None
            if start[0] in "{`":
                self.held = text
                return []
        return [self._delta(delta) for delta in self.parser.feed(text)]

    def _read(self, text: str) -> toolcalls.Parsed:
        return read_calls(text, self.job.tools.format, set(self.job.tools.names))

    def _delta(self, delta: toolcalls.Delta) -> dict:
        out = chunk(self.job)
        out["choices"][0]["delta"] = delta.as_dict()
        return self._with_logprobs(out) if delta.content is not None else out

    def _with_logprobs(self, out: dict) -> dict:
        if self.pending:
            out["choices"][0]["logprobs"] = self._logprobs(self.pending)
            self.pending = []
        return out

    def _logprobs(self, tokens: list[Token]) -> dict:
        if self.job.form is CHAT:
            return {"content": fields.chat_logprobs(tokens, self.piece)}
        found = fields.text_logprobs(tokens, self.piece, self.sent_chars)
        self.sent_chars += sum(len(t) for t in found["tokens"])
        return found

    def finish(self, done: Done) -> list[dict]:
        """The stream's last chunks: held text and tool calls, the finish reason, usage."""
        out = self._split(self.thinking.feed(done.tail) if done.tail else [])
        out += self._split(self.thinking.finish())
        reason = finish_reason(done)
        whole = self.held if self.held is not None else self.lead
        if whole is not None:
            parsed = self._read(whole)
            if parsed.ok and parsed.calls:
                deltas = [toolcalls.Delta(content=parsed.content)] if parsed.content else []
                calls = toolcalls.kept_calls(parsed.calls, self.job.tools.parallel)
                out += [self._delta(delta) for delta in deltas + toolcalls.call_deltas(calls)]
                reason = parsed.finish_reason(reason)
            elif whole:
                out.append(self._with_logprobs(chunk(self.job, text=whole)))
        elif self.parser is not None:
            out += [self._delta(delta) for delta in self.parser.finish()]
            reason = self.parser.finish_reason(reason)
        last = chunk(self.job, finish=reason)
        last["choices"][0] |= _ending(done)
        out.append(self._with_logprobs(last))
        if self.job.include_usage:
            out.append({**chunk(self.job), "choices": [], "usage": usage(done, self.reasoning_tokens)})
        out[-1]["timings"] = timings(done)
        out[-1]["speculation"] = self.speculation.as_dict(self.job, done)
        return out

    def whole(self, done: Done) -> dict:
        """The whole answer (``stream: false``)."""
        job = self.job
        reason = finish_reason(done)
        logprobs = self._logprobs(self.tokens) if self.logprobs else None
        if job.form is CHAT:
            thought, text = reasoning.split(done.text, job.reasoning)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.calls:
                parsed = self._read(text)
                if parsed.ok and parsed.calls:
                    calls = toolcalls.kept_calls(parsed.calls, job.tools.parallel)
                    message = {
                        "role": "assistant",
                        "content": parsed.content,
                        "tool_calls": [call.as_dict() for call in calls],
                    }
                    reason = parsed.finish_reason(reason)
            if thought is not None:
                message["reasoning_content"] = thought
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": done.text, "logprobs": logprobs, "finish_reason": reason}
        body = _body(job, done, self.speculation, choice | _ending(done))
        body["usage"] = usage(done, self.reasoning_tokens)
        return body


def read_calls(text: str, fmt: str, names: set[str]) -> toolcalls.Parsed:
    """Tool calls in an answer, in the model's format; for the Hermes format also a bare
    or fenced JSON object ``{"name": …, "arguments": …}`` naming an offered function (or
    that object in doubled braces), the way small models taught that format often call."""
    parsed = toolcalls.parse(text, fmt, allowed=names)
    if fmt != "hermes" or not parsed.ok or parsed.calls:
        return parsed
    bare = text.strip()
    if bare.startswith("```"):
        bare = bare.partition("\n")[2].rstrip().removesuffix("```").strip()
    if not bare.startswith("{"):
        return parsed
    found = toolcalls.parse(bare, "llama3", allowed=names)
    if not found.calls and bare.startswith("{{") and bare.endswith("}}"):
        # Some GGUFs' templates show the format as {{"name": …}} (Jinja's escaped
        # braces left in), and the model copies the doubled braces.
        found = toolcalls.parse(bare[1:-1], "llama3", allowed=names)
    return found if found.ok and found.calls else parsed


def _body(job: Job, done: Done, speculation: Speculation, choice: dict) -> dict:
    return {
        "id": job.id,
        "object": job.form.object,
        "created": job.created,
        "model": job.model,
        "choices": [choice],
        "usage": usage(done),
        "timings": timings(done),
        "speculation": speculation.as_dict(job, done),
    }


def chunk(job: Job, *, text: str | None = None, role: bool = False, finish: str | None = None) -> dict:
    """One stream chunk with one choice."""
    if job.form is CHAT:
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {
        "id": job.id,
        "object": job.form.chunk_object,
        "created": job.created,
        "model": job.model,
        "choices": [choice],
    }


def sse(data: dict | str) -> str:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"

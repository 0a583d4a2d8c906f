"""OpenAI-shaped response bodies and stream chunks, with edgespec's additions.

Every finished answer carries OpenAI ``usage`` (predicted-output counts included), a
llama.cpp-style ``timings`` object and a small ``speculation`` summary of which drafter
ran with which γ. Plain OpenAI clients ignore the fields they do not know.
"""

from __future__ import annotations

import json

from edgespec.decoding.events import Done, Step
from edgespec.server.schemas import Job

FINISH_REASONS = {
    "eos": "stop",
    "stop_string": "stop",
    "cancelled": "stop",
    "max_tokens": "length",
    "context_full": "length",
}
# The run-length list stays small even for a long answer: past this many runs only the
# per-drafter totals grow.
MAX_RUNS = 32


class Speculation:
    """Folds ``Step`` events into per-drafter totals and (drafter, γ, steps) runs."""

    def __init__(self) -> None:
        self.drafters: dict[str, dict[str, int]] = {}
        self.runs: list[list] = []
        self.truncated = False

    def add(self, step: Step) -> None:
        totals = self.drafters.setdefault(step.drafter, {"steps": 0, "drafted": 0, "accepted": 0})
        totals["steps"] += 1
        totals["drafted"] += step.gamma
        totals["accepted"] += step.accepted
        if self.runs and self.runs[-1][0] == step.drafter and self.runs[-1][1] == step.gamma:
            self.runs[-1][2] += 1
        elif len(self.runs) < MAX_RUNS:
            self.runs.append([step.drafter, step.gamma, 1])
        else:
            self.truncated = True

    def as_dict(self, job: Job) -> dict:
        summary = {
            "drafter": job.drafter,
            "gamma": job.gamma,
            "steps": sum(t["steps"] for t in self.drafters.values()),
            "drafters": self.drafters,
            "runs": self.runs,
        }
        if self.truncated:
            summary["runs_truncated"] = True
        return summary


def usage(done: Done) -> dict:
    s = done.stats
    return {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.tokens,
        "total_tokens": s.prompt_tokens + s.tokens,
        "prompt_tokens_details": {"cached_tokens": s.reused_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": s.prediction_accepted,
            "rejected_prediction_tokens": s.prediction_rejected,
        },
    }


def timings(done: Done) -> dict:
    s = done.stats
    decode_s = max(0.0, s.wall_s - s.ttft_s)
    return {
        "prompt_n": s.prompt_tokens - s.reused_tokens,
        "prompt_ms": round(1000 * s.ttft_s, 3),
        "predicted_n": s.tokens,
        "predicted_ms": round(1000 * decode_s, 3),
        "predicted_per_second": round(s.decode_tokens_per_second, 3),
        "draft_n": s.drafted,
        "draft_n_accepted": s.accepted,
    }


def finish_reason(done: Done) -> str:
    return FINISH_REASONS.get(done.stop_reason, "stop")


def _object_name(job: Job, chunk: bool) -> str:
    if job.kind == "chat":
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"


def response(job: Job, done: Done, speculation: Speculation) -> dict:
    """The whole answer (``stream: false``)."""
    if job.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": done.text},
            "logprobs": None,
            "finish_reason": finish_reason(done),
        }
    else:
        choice = {"index": 0, "text": done.text, "logprobs": None, "finish_reason": finish_reason(done)}
    return {
        "id": job.id,
        "object": _object_name(job, chunk=False),
        "created": job.created,
        "model": job.model,
        "choices": [choice],
        "usage": usage(done),
        "timings": timings(done),
        "speculation": speculation.as_dict(job),
    }


def chunk(job: Job, *, text: str | None = None, role: bool = False, finish: str | None = None) -> dict:
    """One stream chunk with one choice."""
    if job.kind == "chat":
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
        "object": _object_name(job, chunk=True),
        "created": job.created,
        "model": job.model,
        "choices": [choice],
    }


def final_chunks(job: Job, done: Done, speculation: Speculation) -> list[dict]:
    """The chunk with the finish reason, then (when asked) the usage chunk with no
    choices; the last of them carries timings and the speculation summary."""
    chunks = [chunk(job, finish=finish_reason(done))]
    if job.include_usage:
        last = {**chunk(job), "choices": [], "usage": usage(done)}
        chunks.append(last)
    chunks[-1]["timings"] = timings(done)
    chunks[-1]["speculation"] = speculation.as_dict(job)
    return chunks


def sse(data: dict | str) -> str:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"

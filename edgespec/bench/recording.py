"""Recordings for the replay: each prompt's greedy answer from the real target (under the
prompt's JSON schema where it has one) and the draft model's greedy guess and confidence
at every position of it, computed once with llama.cpp and kept on disk."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.api import EdgeSpec, settings_from
from edgespec.bench.corpus import CorpusPrompt, prompt_tokens, select, settings_extras
from edgespec.bootstrap import LLAMA_CPP_VERSION
from edgespec.decoding.engine import Engine
from edgespec.decoding.events import Done
from edgespec.decoding.request import GenerationSettings
from edgespec.errors import EdgespecError
from edgespec.host import write_atomically
from edgespec.models import store
from edgespec.runtime.model import Model


@dataclass
class Recording:
    """One prompt's answer and the draft's view of it, as llama.cpp computed them."""

    id: str
    category: str
    prompt: list[int]
    answer: list[int]
    ended: bool  # the answer ended with an end-of-generation token (not at max tokens)
    guesses: list[int]  # guesses[q]: the draft's greedy token for answer position q
    confidences: list[float]  # ... and its probability
    extras: dict = field(default_factory=dict)  # the prompt's settings (its JSON schema)

    def settings(self, max_tokens: int) -> GenerationSettings:
        """The settings the answer was recorded with, as a replay needs them: its grammar
        too, so that the grammar's drafter and the constrained verification run again."""
        return settings_from(max_tokens=max_tokens, **self.extras)


def record(
    target: Model,
    draft: Model,
    prompts: Iterable[tuple[CorpusPrompt, list[int]]],
    max_tokens: int,
    progress: Callable[[str], None] | None = None,
) -> list[Recording]:
    """Greedy target answers (plain decoding, under the prompt's JSON schema where it has
    one) and the draft's teacher-forced guesses."""
    recordings = []
    for prompt, tokens in prompts:
        engine = Engine(target)
        target.sequence(0).reset()  # (where an unthreaded answer decodes)
        done = None
        settings = settings_from(max_tokens=max_tokens, **settings_extras(prompt))
        for event in engine.stream(list(tokens), settings):
            if isinstance(event, Done):
                done = event
        assert done is not None
        answer = list(done.token_ids)
        guesses, confidences = _teacher_forced(draft, tokens + answer, len(tokens))
        recordings.append(
            Recording(
                prompt.id,
                prompt.category,
                list(tokens),
                answer,
                done.stop_reason == "eos",
                guesses,
                confidences,
                settings_extras(prompt),
            )
        )
        if progress:
            agree = np.mean([g == a for g, a in zip(guesses, answer, strict=False)]) if answer else 0.0
            progress(f"{prompt.id}: {len(answer)} tokens, the draft guesses {agree:.0%} of them")
    return recordings


_RECORDING_VERSION = 2


def cached_record(
    target: Model,
    draft: Model,
    prompts: list[tuple[CorpusPrompt, list[int]]],
    max_tokens: int,
    progress: Callable[[str], None] | None = None,
) -> list[Recording]:
    """``record``, kept on disk outside the repository, one file per prompt: recording
    takes minutes, and a replay is run again after every change to the controller, which
    does not change what is recorded, and over other selections of the same prompts. The
    key covers both model files, the llama.cpp release, the prompt (id, category, tokens,
    schema) and max tokens."""
    models = hashlib.sha256()
    for model in (target, draft):
        info = model.path.stat()
        models.update(f"{model.path.resolve()}:{info.st_size}:{info.st_mtime_ns}|".encode())
    out: dict[str, Recording] = {}
    paths: dict[str, Path] = {}
    missing = []
    for prompt, tokens in prompts:
        key = models.copy()
        described = [prompt.id, prompt.category, tokens, settings_extras(prompt)]
        key.update(json.dumps([_RECORDING_VERSION, LLAMA_CPP_VERSION, max_tokens, described]).encode())
        path = paths[prompt.id] = store.home() / "replay" / f"{key.hexdigest()[:16]}.json"
        try:
            out[prompt.id] = Recording(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            missing.append((prompt, tokens))  # none yet, or unreadable: record again
    for prompt, tokens in missing:  # each kept as soon as it is recorded
        (recording,) = record(target, draft, [(prompt, tokens)], max_tokens, progress)
        path = paths[recording.id]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(vars(recording)))
        out[recording.id] = recording
    return [out[prompt.id] for prompt, _ in prompts]


def recorded_corpus(
    split: str, categories: list[str] | None, max_tokens: int
) -> tuple[EdgeSpec, list[Recording]]:
    """The default pair, loaded, and the recordings of the corpus prompts chosen (those
    not recorded yet are recorded now, with progress on stderr)."""
    lm = EdgeSpec(quiet=True)
    if lm.draft is None:
        raise EdgespecError("recording needs the draft model")
    chosen = [(p, prompt_tokens(lm, p)) for p in select(split, categories)]
    print(f"{len(chosen)} answers: those not recorded yet are recorded with the real models (and kept)",
          file=sys.stderr)  # fmt: skip
    progress = lambda line: print(" ", line, file=sys.stderr)  # noqa: E731
    return lm, cached_record(lm.target, lm.draft, chosen, max_tokens, progress)


def _teacher_forced(draft: Model, sequence: list[int], prompt_len: int) -> tuple[list[int], list[float]]:
    """The draft's greedy token and its probability after every prefix of ``sequence``
    from the prompt on: one pass over the recorded answer, chunked to the rows it returns."""
    held = draft.sequence(0)
    held.reset()
    if prompt_len > 1:
        held.decode(sequence[: prompt_len - 1], 0)
    rest = sequence[prompt_len - 1 :]
    width = draft.options.max_outputs
    guesses: list[int] = []
    confidences: list[float] = []
    for start in range(0, len(rest), width):
        chunk = rest[start : start + width]
        rows = np.array(held.decode(chunk, len(chunk)), dtype=np.float64)
        rows -= rows.max(axis=1, keepdims=True)
        np.exp(rows, out=rows)
        guesses += rows.argmax(axis=1).tolist()
        confidences += (1.0 / rows.sum(axis=1)).tolist()  # the largest entry is exp(0)
    held.reset()
    return guesses, confidences


def write_set(path: Path, recordings: dict[str, list[Recording]], facts: dict[str, str]) -> None:
    """Recordings by split, kept as one compressed file (the replay test's fixture, which
    then needs no model to decode): ``facts`` say what recorded them. Confidences keep
    five digits: a replay prices by them, and no decision turns on the sixth."""
    rows = []
    for split, recs in recordings.items():
        for rec in recs:
            row = vars(rec) | {"split": split}
            row["confidences"] = [float(f"{c:.5g}") for c in rec.confidences]
            rows.append(row)
    body = json.dumps({"facts": facts, "recordings": rows}, separators=(",", ":")).encode()
    write_atomically(path, gzip.compress(body, mtime=0))


def read_set(path: Path) -> tuple[dict[str, str], dict[str, list[Recording]]]:
    """What ``write_set`` kept: its facts, and the recordings by split in their order."""
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
        by_split: dict[str, list[Recording]] = {}
        for row in data["recordings"]:
            split = row.pop("split")
            by_split.setdefault(split, []).append(Recording(**row))
        return data["facts"], by_split
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EdgespecError(f"{path}: not a set of recordings ({e})") from None

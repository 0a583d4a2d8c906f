"""llama.cpp's prompt-lookup loop (``ngram-simple``) replayed on a cost curve.

The live comparison (``lab.llamacpp``) runs llama.cpp's loops on the machine at hand only;
the bar "not behind the simplest loop" also stands on machines we do not have. This
replays, over a recorded greedy answer, the rule of llama.cpp's ``common_ngram_simple_draft``
(common/ngram-map.cpp, the release vendored in llama-cpp-python): the pattern is the last
``size_n`` tokens of the context, the sampled one last; the most recent earlier occurrence
of it, searched backwards, proposes the ``size_m`` tokens that followed it (fewer where the
context ends sooner, none where fewer than ``size_n`` follow); a context of at most
``size_n + size_m + 1`` tokens proposes nothing. Verification keeps the proposal's longest
prefix the recorded answer agrees with, plus the target's own token, as greedy decoding
does. Each step costs one target pass over the proposal and the sampled token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

SIZE_N, SIZE_M = 12, 48  # llama.cpp's defaults (common.h: ngram_simple.size_n, size_m)
LABEL = "llama.cpp ngram-simple"


@dataclass(frozen=True)
class LoopRun:
    """One replayed answer: decode-phase seconds, steps, and tokens drafted and kept."""

    seconds: float
    steps: int
    drafted: int
    accepted: int


def ngram_simple_draft(context: Sequence[int], size_n: int = SIZE_N, size_m: int = SIZE_M) -> list[int]:
    """What llama.cpp's ngram-simple proposes after ``context`` (its last token is the one
    just sampled)."""
    known = len(context) - 1  # llama.cpp's "tokens": the context before the sampled token
    if known <= size_n + size_m + 1:
        return []
    pattern = list(context[-size_n:])
    # Backwards, as llama.cpp searches: the first match found is the only one looked at,
    # and position 0 stands for "no match" there, so it is never found.
    for start in range(known - size_n - 1, 0, -1):
        if list(context[start : start + size_n]) == pattern:
            copy_max = min(size_m, known - (start + size_n))
            if copy_max < size_n:
                return []
            return list(context[start + size_n : start + size_n + copy_max])
    return []


# What a pass over k tokens costs beyond its size after passes of ``last`` and
# ``before_last`` tokens (replay.Curve.history_seconds: a GPU's reshaping).
History = Callable[[int, int, int], float]


def seconds_of(
    passes: Sequence[int], prompt_len: int, pass_seconds: Callable[[int], float], history: History | None
) -> float:
    """What a decode phase of target passes over ``passes`` tokens each costs, after the
    prompt's pass (``history`` prices each pass by the two before it, where the curve has one)."""
    total, last, before_last = 0.0, prompt_len, prompt_len
    for size in passes:
        total += pass_seconds(size) + (history(size, last, before_last) if history is not None else 0.0)
        last, before_last = size, last
    return total


def replay_ngram_simple(
    prompt: Sequence[int],
    answer: Sequence[int],
    pass_seconds: Callable[[int], float],
    history: History | None = None,
) -> LoopRun:
    """The loop over a recorded greedy ``answer``: its first token comes from the prompt's
    pass (not the decode phase), each later step verifies a proposal (or none) in one pass
    of ``pass_seconds(1 + drafted)``, plus ``history`` where the curve has one. A proposal
    runs past the answer's end at full price, as the tool's would, though only the
    answer's tokens are counted."""
    context = [*prompt, *answer[:1]]
    made, accepted = 1, 0
    passes: list[int] = []  # each step's pass: the sampled token and the proposal
    while made < len(answer):
        draft = ngram_simple_draft(context)
        kept = 0
        while kept < len(draft) and made + kept < len(answer) and draft[kept] == answer[made + kept]:
            kept += 1
        new = min(kept + 1, len(answer) - made)
        context += answer[made : made + new]
        made += new
        passes.append(1 + len(draft))
        accepted += kept
    seconds = seconds_of(passes, len(prompt), pass_seconds, history)
    return LoopRun(seconds, len(passes), sum(passes) - len(passes), accepted)


def speedup(
    prompt: Sequence[int],
    answer: Sequence[int],
    pass_seconds: Callable[[int], float],
    history: History | None = None,
) -> float:
    """The loop's decode-phase speed over plain decoding's on the same curve (1 for an
    answer of one token: the decode phase is empty)."""
    loop = replay_ngram_simple(prompt, answer, pass_seconds, history)
    plain = seconds_of([1] * (len(answer) - 1), len(prompt), pass_seconds, history)
    return plain / loop.seconds if loop.seconds > 0 else 1.0

"""Can this draft model speculate for this target? Decided before any generation.

The rule is llama.cpp's (``common_speculative_are_compatible``), kept in one place,
``models/vocab.py``: same vocabulary type, same BOS/EOS ids and add-BOS/add-EOS flags,
vocabulary sizes within 128 of each other (the draft not the larger), and the same text
for every token from id 5 on.

The check runs twice: on the GGUF files before any weights are loaded (so a wrong pair
fails in a second; the token texts are compared in full there), and on the loaded
vocabularies, comparing the facts llama.cpp reports and a sample of token texts.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp

from edgespec.errors import EdgespecError
from edgespec.models.vocab import CHECK_FROM_TOKEN, VocabFacts, fact_difference, gguf_difference
from edgespec.runtime.model import Model

_SAMPLE_COUNT = 512


def loaded_facts(model: Model) -> VocabFacts:
    """The vocabulary facts llama.cpp reports for a loaded model."""
    return VocabFacts(
        tokenizer=str(model.vocab_type),
        size=model.n_vocab,
        bos=model.bos,
        eos=model.eos,
        adds_bos=model.adds_bos,
        adds_eos=bool(llama_cpp.llama_vocab_get_add_eos(model.vocab)),
    )


def _raise(target_name: str, draft_name: str, problem: str | None) -> None:
    if problem:
        raise EdgespecError(f"draft '{draft_name}' cannot speculate for target '{target_name}': {problem}")


def precheck(target_name: str, target: Path, draft_name: str, draft: Path) -> None:
    """File-only check, before loading weights."""
    _raise(target_name, draft_name, gguf_difference(target, draft))


def check_pair(target: Model, draft: Model) -> None:
    """Full check on loaded models: facts, then a sample of token texts."""
    problem = fact_difference(loaded_facts(target), loaded_facts(draft))
    _raise(target.name, draft.name, problem or text_difference(target, draft))


def text_difference(target: Model, draft: Model) -> str | None:
    shared = min(target.n_vocab, draft.n_vocab)
    if shared <= CHECK_FROM_TOKEN:
        return None
    step = max(1, (shared - CHECK_FROM_TOKEN) // _SAMPLE_COUNT)
    for token in [*range(CHECK_FROM_TOKEN, shared, step), shared - 1]:
        a, b = target.token_text(token), draft.token_text(token)
        if a != b:
            return f"token {token} differs (target {a!r}, draft {b!r})"
    return None

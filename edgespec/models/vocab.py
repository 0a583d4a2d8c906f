"""Can a draft speculate for a target? The vocabulary rule, read from GGUF headers.

Speculation compares token ids, so both models must read and write text with the same
vocabulary. llama.cpp (``common_speculative_are_compatible``) accepts a draft when the
vocabulary types match, both add (or both omit) BOS and EOS, the BOS and EOS ids are the
same, the vocabulary sizes differ by at most 128, and every token from id 5 on has the
same text in both. edgespec applies the same rule with one difference: the draft may not
be the larger of the two, because a draft id the target lacks cannot be verified by it
(Qwen2.5 7B and up pad their vocabulary to 152,064; the small ones have 151,936, so the
small ones still draft for the large ones).

This module answers from the files alone, before any weights are loaded; the runtime
checks the loaded vocabularies again (``runtime/compat.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from edgespec.models.gguf import GGUFInfo, TokenTable, read_info, read_token_table
from edgespec.models.kept import file_identity, kept

MAX_VOCAB_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE in llama.cpp
CHECK_FROM_TOKEN = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID: ids below it may differ


@dataclass(frozen=True)
class VocabFacts:
    tokenizer: str
    size: int
    bos: int
    eos: int
    adds_bos: bool
    adds_eos: bool = False

    @classmethod
    def from_gguf(cls, info: GGUFInfo) -> VocabFacts:
        meta = info.metadata
        tokens = meta.get("tokenizer.ggml.tokens", 0)
        return cls(
            tokenizer=str(meta.get("tokenizer.ggml.model", "?")),
            size=tokens if isinstance(tokens, int) else len(tokens),
            bos=int(meta.get("tokenizer.ggml.bos_token_id", -1)),
            eos=int(meta.get("tokenizer.ggml.eos_token_id", -1)),
            adds_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            adds_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        )


def fact_difference(target: VocabFacts, draft: VocabFacts) -> str | None:
    """Why the facts rule the pair out, or None."""
    if target.tokenizer != draft.tokenizer:
        return f"tokenizer types differ (target {target.tokenizer}, draft {draft.tokenizer})"
    if draft.size > target.size or target.size - draft.size > MAX_VOCAB_DIFFERENCE:
        return f"vocabulary sizes differ (target {target.size:,}, draft {draft.size:,} tokens)"
    for label, a, b in (("BOS", target.bos, draft.bos), ("EOS", target.eos, draft.eos)):
        if a != b:
            return f"{label} token ids differ (target {a}, draft {b})"
    if target.adds_bos != draft.adds_bos:
        return "one model adds a BOS token to prompts and the other does not"
    if target.adds_eos != draft.adds_eos:
        return "one model adds an EOS token to prompts and the other does not"
    return None


def table_difference(target: TokenTable, draft: TokenTable) -> str | None:
    """Why the token texts rule the pair out (the first id that differs), or None."""
    shared = min(len(target), len(draft))
    if shared <= CHECK_FROM_TOKEN or target.span(CHECK_FROM_TOKEN, shared) == draft.span(
        CHECK_FROM_TOKEN, shared
    ):
        return None
    for token in range(CHECK_FROM_TOKEN, shared):
        a, b = target.text(token), draft.text(token)
        if a != b:
            return f"token {token} differs (target {a!r}, draft {b!r})"
    return None


@lru_cache(maxsize=4)
def _table(path: str, size: int, mtime_ns: int, ctime_ns: int) -> TokenTable:
    """A file's token texts, read once per identity (``file_identity``) in this process."""
    return read_token_table(Path(path))


def gguf_facts(path: Path) -> VocabFacts:
    return VocabFacts.from_gguf(read_info(path))  # read_info keeps each file's parse


def gguf_difference(target: Path, draft: Path) -> str | None:
    """Why the draft GGUF cannot speculate for the target GGUF, or None when it can."""
    problem = fact_difference(gguf_facts(target), gguf_facts(draft))
    if problem:
        return problem
    files = [file_identity(target), file_identity(draft)]
    return kept("token-texts-differ", files, lambda: table_difference(*(_table(*file) for file in files)))

"""Can this draft model speculate for this target? Decided before any generation.

Speculation compares token ids, so both models must read and write text with the same
vocabulary: same tokenizer type, same special tokens, and the same text for every id.
A draft vocabulary may be a little smaller than the target's (Qwen2.5 7B and larger pad
theirs to 152,064; the small ones have 151,936): the target then simply never sees a
draft of the missing ids.

The check runs twice: on the GGUF headers before any weights are loaded (so a wrong pair
fails in a second), and on the loaded vocabularies, comparing a sample of token texts.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.errors import EdgespecError
from edgespec.models.gguf import GGUFInfo
from edgespec.runtime.model import Model

MAX_VOCAB_PADDING = 128
_SAMPLE_COUNT = 512


@dataclass(frozen=True)
class VocabFacts:
    tokenizer: str
    size: int
    bos: int
    eos: int
    adds_bos: bool

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
        )

    @classmethod
    def from_model(cls, model: Model) -> VocabFacts:
        return cls(
            tokenizer=str(model.vocab_type),
            size=model.n_vocab,
            bos=model.bos,
            eos=model.eos,
            adds_bos=model.adds_bos,
        )


def _raise(target_name: str, draft_name: str, problem: str | None) -> None:
    if problem:
        raise EdgespecError(f"draft '{draft_name}' cannot speculate for target '{target_name}': {problem}")


def precheck(target_name: str, target: GGUFInfo, draft_name: str, draft: GGUFInfo) -> None:
    """Header-only check, before loading weights."""
    _raise(
        target_name, draft_name, fact_difference(VocabFacts.from_gguf(target), VocabFacts.from_gguf(draft))
    )


def check_pair(target: Model, draft: Model) -> None:
    """Full check on loaded models: facts, then a sample of token texts."""
    problem = fact_difference(VocabFacts.from_model(target), VocabFacts.from_model(draft))
    _raise(target.name, draft.name, problem or text_difference(target, draft))


def fact_difference(target: VocabFacts, draft: VocabFacts) -> str | None:
    if target.tokenizer != draft.tokenizer:
        return f"tokenizer types differ (target {target.tokenizer}, draft {draft.tokenizer})"
    if draft.size > target.size or target.size - draft.size > MAX_VOCAB_PADDING:
        return f"vocabulary sizes differ (target {target.size:,}, draft {draft.size:,} tokens)"
    for label, a, b in (("BOS", target.bos, draft.bos), ("EOS", target.eos, draft.eos)):
        if a != b:
            return f"{label} token ids differ (target {a}, draft {b})"
    if target.adds_bos != draft.adds_bos:
        return "one model adds a BOS token to prompts and the other does not"
    return None


def text_difference(target: Model, draft: Model) -> str | None:
    shared = draft.n_vocab
    step = max(1, shared // _SAMPLE_COUNT)
    for token in [*range(0, shared, step), shared - 1]:
        a, b = target.token_text(token), draft.token_text(token)
        if a != b:
            return f"token {token} differs (target {a!r}, draft {b!r})"
    return None

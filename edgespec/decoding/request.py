"""What an answer is asked to do, validated once and frozen: ``GenerationSettings`` (how to
sample, how long, what to stop on, what to constrain) and ``Request`` (a prompt's tokens,
its settings and the drafting choice). Every front end builds a ``Request`` through one
builder (``EdgeSpec.request``). Each field is checked in one place, as a ``RequestError``
naming it: what needs no model as the settings are made, here; what needs the loaded
target (the prompt's token ids, its length, ``logit_bias``'s ids) by the builder. Never
deeper: the engine only asserts."""

from __future__ import annotations

from dataclasses import dataclass, field
from difflib import SequenceMatcher

from edgespec.decoding.acceptance import check_lenience
from edgespec.decoding.drafters import AUTO
from edgespec.decoding.grammar import GrammarSpec
from edgespec.decoding.penalties import Penalties
from edgespec.decoding.sampling import SamplingParams
from edgespec.errors import RequestError

VERIFY_MODES = ("token", "block")
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class GenerationSettings:
    """Everything one generation is asked to do, checked as it is made.

    ``lenience`` is where an answer starts; a running answer's live control may change it
    (the UI's slider). λ = 1 is exact; any other value changes the output distribution
    (λ < 1 accepts more drafts)."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    lenience: float = 1.0
    verify: str = "token"  # "token" or "block" (sampling only; greedy compares argmaxes)
    # The answer the client expects (OpenAI's Predicted Outputs), as target token ids: a
    # source the copy drafters propose from. It never changes what the answer is.
    prediction: tuple[int, ...] = ()
    # Penalties and biases on the target's distribution (and the draft model's, alike).
    penalties: Penalties = field(default_factory=Penalties)
    # Log-probabilities on every Token: None for none, else how many of the most likely
    # tokens to report beside the chosen one (0-20).
    logprobs: int | None = None
    # A grammar every token must follow (a JSON schema's, or GBNF): see decoding.constrained.
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        self.sampling.validate()
        self.penalties.validate()
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(
                f"top logprobs must be from 0 to {MAX_TOP_LOGPROBS} (got {self.logprobs})", "top_logprobs"
            )
        if self.max_tokens < 1:
            raise RequestError(f"max tokens must be at least 1 (got {self.max_tokens})", "max_tokens")
        check_lenience(self.lenience)
        if self.verify not in VERIFY_MODES:
            raise RequestError(f"verify must be 'token' or 'block' (got {self.verify!r})", "verify")


@dataclass(frozen=True)
class Request:
    """One validated request: the prompt's token ids (not empty, in the vocabulary and
    fitting the context: the builder checks), its settings, and who drafts how much
    (``decoding.choice`` checked them)."""

    prompt: tuple[int, ...]
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    drafter: str = AUTO
    gamma: int | str = AUTO
    # Reuse at most this many cached prompt tokens (None: all there are): a baseline
    # re-timed from the cache its answer started from.
    reuse_limit: int | None = None


def prediction_tokens_used(prediction: tuple[int, ...] | list[int], answer: list[int]) -> int:
    """How many tokens of the predicted output appear in the answer, in order (OpenAI's
    accepted prediction tokens): the matched blocks of an alignment of the two. Counted on
    the answer itself, whichever drafter proposed what, so the figure means the same
    whatever the controller chose."""
    matcher = SequenceMatcher(None, list(prediction), answer, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks())

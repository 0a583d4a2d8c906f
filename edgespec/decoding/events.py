"""What a generation yields, in order: one ``Token`` per emitted token, a ``Step`` after
every target pass, and a final ``Done``. The CLI, the UI, the benchmark and the tests all
consume this one stream."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Provenance of an emitted token.
DRAFT = "draft"  # a drafted token the target accepted
TARGET = "target"  # the target's own token in place of a rejected draft: a correction
BONUS = "bonus"  # the target's extra token after every draft was accepted
PLAIN = "plain"  # the target's own token in a step with no draft (and the first token)


@dataclass(frozen=True, slots=True)
class Token:
    token: int
    text: str  # text released with this token ("" while a character or stop string is pending)
    source: str  # DRAFT, TARGET, BONUS or PLAIN
    # Asked for with GenerationSettings.logprobs: the token's log-probability under the
    # target's distribution at its position, and the most likely tokens there (id, logprob).
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """One verification pass of the target."""

    drafter: str  # a registered drafter's name, or "none"
    gamma: int  # tokens drafted (and verified) in this step
    accepted: int  # of those, accepted
    draft_s: float  # llama.cpp time spent drafting (including the draft's catch-up)
    verify_s: float  # llama.cpp time of the target pass
    planned_gamma: int = 0  # what the controller planned before early stopping (= gamma when fixed)
    reason: str = ""  # why the controller chose this step (empty for fixed settings)


@dataclass
class Stats:
    tokens: int = 0  # tokens generated (stop token excluded)
    target_passes: int = 0  # target decodes after the prefill (steps)
    shared_passes: int = 0  # of those, decoded in one batch with other answers' passes
    drafted: int = 0
    accepted: int = 0
    ttft_s: float = 0.0
    wall_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens already in the target's cache (multi-turn chat)
    prediction_tokens: int = 0  # tokens of the request's predicted output (0: none given)
    prediction_accepted: int = 0  # prediction tokens that appear in the answer, in order

    @property
    def prediction_rejected(self) -> int:
        """Prediction tokens that did not make it into the answer (OpenAI's count)."""
        return max(0, self.prediction_tokens - self.prediction_accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens produced per target pass (1.0 for plain decoding). The first token
        comes from the prefill pass and is not counted in either term."""
        produced = self.tokens - 1 if self.tokens else 0
        return produced / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """The decode phase alone: tokens after the first over the time after the first
        token, so a long prompt's prefill does not hide how fast the answer itself runs."""
        after_first = self.wall_s - self.ttft_s
        return (self.tokens - 1) / after_first if self.tokens > 1 and after_first > 0 else 0.0

    @property
    def other_s(self) -> float:
        """Python work outside llama.cpp: sampling, acceptance, bookkeeping, streaming."""
        return max(0.0, self.wall_s - self.prefill_s - self.draft_s - self.verify_s)

    def as_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "prediction_tokens": self.prediction_tokens,
            "prediction_accepted": self.prediction_accepted,
            "target_passes": self.target_passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tau": round(self.tau, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "decode_tokens_per_second": round(self.decode_tokens_per_second, 3),
            "ttft_s": round(self.ttft_s, 4),
            "wall_s": round(self.wall_s, 4),
            "time_s": {
                "prefill": round(self.prefill_s, 4),
                "draft": round(self.draft_s, 4),
                "verify": round(self.verify_s, 4),
                "other": round(self.other_s, 4),
            },
        }


@dataclass(frozen=True)
class Done:
    text: str  # the whole answer
    tail: str  # text not yet released by Token events (held back for a possible stop string)
    token_ids: list[int] = field(default_factory=list)
    stop_reason: str = ""  # "eos", "stop_string", "max_tokens", "context_full", "cancelled"
    stats: Stats = field(default_factory=Stats)
    stop_sequence: str | None = None  # the stop string that ended the answer, if one did

    def as_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "stats": self.stats.as_dict(),
        }


Event = Token | Step | Done

__all__ = ["BONUS", "DRAFT", "PLAIN", "TARGET", "Done", "Event", "Stats", "Step", "Token", "asdict"]

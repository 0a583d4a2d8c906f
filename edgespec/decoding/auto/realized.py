"""The controller checks itself: what the steps it took actually delivered, and the bans
of options whose steps fell short of plain decoding.

Predictions come from a model, so the controller keeps what each option's steps delivered
(tokens and seconds, and plain decoding's), and stops choosing an option whose realized
rate falls below plain decoding's by more than luck explains (its tokens per step vary;
its seconds, if priced right, do not). The option is banned for a while (longer each
time), and a lookup drafter's ban ends early when its proposals, judged for free, turn out
right again.
"""

from __future__ import annotations

import math

from edgespec.decoding.auto.tuning import DEFAULT, Tuning


class RealizedRates:
    """What the steps taken actually delivered, per option ("none" for plain decoding):
    decayed sums of tokens and of seconds (drafting, verifying and the Python around it)."""

    def __init__(self, tuning: Tuning = DEFAULT) -> None:
        self.tuning = tuning
        self._tokens: dict[str, float] = {}
        self._squares: dict[str, float] = {}  # of tokens per step: their spread
        self._seconds: dict[str, float] = {}
        self._steps: dict[str, float] = {}
        self._drafted: dict[str, float] = {}
        self._accepted: dict[str, float] = {}
        self._predicted: dict[str, float] = {}  # extra tokens predicted for the chosen steps
        self._delivered: dict[str, float] = {}  # ... and accepted

    def observe(self, option: str, tokens: int, seconds: float, drafted: int = 0, accepted: int = 0) -> None:
        if seconds <= 0:
            return
        d = self.tuning.realized_decay
        for table, value in (
            (self._tokens, tokens),
            (self._squares, tokens * tokens),
            (self._seconds, seconds),
            (self._steps, 1),
            (self._drafted, drafted),
            (self._accepted, accepted),
        ):
            table[option] = d * table.get(option, 0.0) + value

    def calibrate(self, option: str, predicted_extra: float, accepted: int) -> None:
        """The tokens beyond one that a chosen step was predicted to yield, against what it
        yielded: choosing the best of several noisy estimates favours the ones that came
        out too high, and this measures by how much."""
        d = self.tuning.calibration_decay
        self._predicted[option] = d * self._predicted.get(option, 0.0) + predicted_extra
        self._delivered[option] = d * self._delivered.get(option, 0.0) + accepted

    def calibration(self, option: str) -> float:
        """Delivered over predicted extra tokens, pulled toward 1 while evidence is thin."""
        pseudo = self.tuning.calibration_pseudo
        predicted = self._predicted.get(option, 0.0) + pseudo
        delivered = self._delivered.get(option, 0.0) + pseudo
        return min(max(delivered / predicted, 0.2), 1.2)

    def acceptance(self, option: str) -> float:
        drafted = self._drafted.get(option, 0.0)
        return self._accepted.get(option, 0.0) / drafted if drafted > 0 else 0.0

    def rate(self, option: str, doubt: float = 0.0) -> float | None:
        """Tokens per second, once there is enough evidence for it; with ``doubt`` > 0, the
        rate the steps could have realized with that many standard errors more tokens (an
        upper bound: luck, not a wrong price, may explain a low rate)."""
        steps = self._steps.get(option, 0.0)
        if steps < self.tuning.realized_evidence:
            return None
        tokens = self._tokens[option]
        if doubt > 0.0:
            spread = (
                max(self._squares[option] - tokens * tokens / steps, 0.0) + self.tuning.realized_spread
            ) / steps
            tokens += doubt * math.sqrt(spread * steps)
        return tokens / self._seconds[option]

    def forget(self, option: str) -> None:
        for table in (self._tokens, self._squares, self._seconds, self._steps, self._drafted, self._accepted):
            table.pop(option, None)


class Bans:
    """Options left out for a while because their steps realized less than plain decoding,
    longer at every new ban."""

    def __init__(self, tuning: Tuning = DEFAULT) -> None:
        self.tuning = tuning
        self.until: dict[str, int] = {}  # option -> first step it may be chosen again
        self._strikes: dict[str, int] = {}
        # Banned because its drafts failed (not because its steps cost more than priced):
        # then proposals judged right again are the new evidence that lifts the ban.
        self._failed_drafts: set[str] = set()

    def banned(self, option: str, step: int) -> bool:
        until = self.until.get(option)
        if until is None:
            return False
        if step >= until:
            del self.until[option]  # served: its next steps are fresh evidence
            return False
        return True

    def check(self, option: str, step: int, realized: RealizedRates, plain_rate: float) -> None:
        """Ban ``option`` if what its steps delivered fell below plain decoding's rate
        (``plain_rate``: plain decoding's realized rate where known, else its price)."""
        t = self.tuning
        if option == "none" or option in self.until:
            return
        rate = realized.rate(option, t.realized_doubt)
        if rate is None:
            return
        if rate < plain_rate * t.realized_margin:
            strikes = self._strikes.get(option, 0)
            self.until[option] = step + min(t.ban_steps * 2**strikes, t.max_ban)
            self._strikes[option] = strikes + 1
            if realized.acceptance(option) < 0.8:
                self._failed_drafts.add(option)
            else:
                self._failed_drafts.discard(option)
            realized.forget(option)

    def confirmed(self, option: str) -> None:
        """A lookup's proposal just held for a whole confirming run: a ban for failed
        drafts ends."""
        if option in self.until and option in self._failed_drafts:
            del self.until[option]

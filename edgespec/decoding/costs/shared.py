"""What a decode of several answers' passes costs, learned on the clock.

The cost curves price one sequence's pass of k tokens. A decode of several sequences'
passes is not priced by the same curve: on a 2-core AVX-512 EPYC (family 25), four
answers' single tokens cost about what one sequence's four tokens do (3.2 against 3.4
single-token passes), but a one-token draft added to them costs a whole token more (4.2),
where the curve says half of one (3.9 for five tokens). A draft priced by the curve looks
twice as cheap at once as it is, and four answers at once with ``auto`` fell behind four
with ``--drafter none``. So the loop hands every decode of several passes here (how many
sequences, how many tokens, its seconds), and a shared step is priced by what was
measured: the decode with its pass against the decode without it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from edgespec.decoding.costs.curve import CostCurve

EMA = 0.2  # each decode's weight in what is learned: a few decodes' noise averages out
TRUSTED = 2  # decodes of one size seen before its own figure is used


class SharedDecodes:
    """The seconds of decodes of several sequences' passes, by (sequences, tokens): the
    pair's, as long as it is loaded (what the engine thread learns, the same thread
    prices with). One that has seen nothing prices every decode by the curve."""

    def __init__(self) -> None:
        # By sequences, then tokens: the moving average of the decodes seen, and how many.
        self._seconds: dict[int, dict[int, float]] = {}
        self._seen: dict[int, Counter[int]] = {}
        # By sequences: what each token beyond one per pass added to a decode of that many
        # passes (a draft's), for the sizes not seen yet.
        self._per_drafted: dict[int, float] = {}

    def observe(self, sequences: int, tokens: int, seconds: float, curve: CostCurve) -> None:
        """One decode of ``sequences`` passes holding ``tokens`` tokens took ``seconds``."""
        if sequences < 2 or tokens < sequences or not seconds > 0:
            return
        if tokens > sequences:
            per = (seconds - self.seconds(sequences, sequences, curve)) / (tokens - sequences)
            self._per_drafted[sequences] = _average(self._per_drafted.get(sequences), per)
        by_tokens = self._seconds.setdefault(sequences, {})
        by_tokens[tokens] = _average(by_tokens.get(tokens), seconds)
        self._seen.setdefault(sequences, Counter())[tokens] += 1

    def seconds(self, sequences: int, tokens: int, curve: CostCurve) -> float:
        """What a decode of ``sequences`` passes holding ``tokens`` tokens costs."""
        return float(self.seconds_row(sequences, np.array([tokens]), curve)[0])

    def seconds_row(self, sequences: int, tokens: np.ndarray, curve: CostCurve) -> np.ndarray:
        """What decodes of ``sequences`` passes holding each of ``tokens`` tokens cost: as
        measured where decodes of that size were seen; else, with drafts in it, the decode
        of as many single tokens and what each drafted token added to such decodes; else
        one sequence's pass of as many tokens."""
        row = np.array(curve.estimates(tokens), dtype=float)
        if sequences < 2:
            return row
        per = self._per_drafted_near(sequences)
        if per is not None:
            plain = self._measured(sequences, sequences)
            base = curve.estimate(sequences) if plain is None else plain
            row = np.where(tokens > sequences, base + (tokens - sequences) * max(per, 0.0), row)
        for n, count in self._seen.get(sequences, Counter()).items():
            if count >= TRUSTED:
                row[tokens == n] = self._seconds[sequences][n]
        return row

    def _measured(self, sequences: int, tokens: int) -> float | None:
        if self._seen.get(sequences, Counter())[tokens] < TRUSTED:
            return None
        return self._seconds[sequences][tokens]

    def _per_drafted_near(self, sequences: int) -> float | None:
        """What a drafted token added to decodes of ``sequences`` passes, or of the nearest
        number of passes measured (a drafted token's price changes little with it)."""
        if not self._per_drafted:
            return None
        nearest = min(self._per_drafted, key=lambda seen: (abs(seen - sequences), seen))
        return self._per_drafted[nearest]

    def drafted_known(self) -> bool:
        """Whether a decode of several passes with a draft in it was measured."""
        return bool(self._per_drafted)

    def sizes_seen(self) -> int:
        """How many sizes of decode have a figure of their own: for tests and reports."""
        return sum(1 for seen in self._seen.values() for count in seen.values() if count >= TRUSTED)


def _average(before: float | None, value: float) -> float:
    return value if before is None else (1 - EMA) * before + EMA * value

"""One answer's grammar, kept in step with the committed text: constrained decoding that
stays exact under speculation.

Each verified position is judged under the grammar state its own prefix reaches (the
committed text and the drafts before it): greedy, the target's choice at a position is the
highest-scoring token the grammar allows there; sampling, its row is masked before the
acceptance test. Target-only decoding takes the very same choice at every position, so
speculative constrained output is target-only constrained output. A draft token the
grammar forbids ends the draft before verification: no row is spent on it.
"""

from __future__ import annotations

import numpy as np

from edgespec.decoding.grammar import GrammarSpec, GrammarState, constrained_argmax
from edgespec.decoding.sampling import SamplingParams, probabilities, sample
from edgespec.runtime.model import Model

_CANDIDATES = 64  # best-scoring tokens tried one by one before the whole vocabulary is masked


def best_allowed(state: GrammarState, row: np.ndarray) -> int:
    """The highest-scoring token the grammar allows (the first index among ties, as an
    argmax over the masked row would give). Checking one token costs microseconds and
    masking the vocabulary tens of milliseconds, so the best candidates are tried first."""
    top = int(np.argmax(row))
    if state.allows(top):
        return top
    count = min(_CANDIDATES, row.shape[0])
    candidates = np.argpartition(row, -count)[-count:]
    candidates = candidates[np.lexsort((candidates, -row[candidates]))]
    lowest = row[candidates[-1]]
    for token in candidates.tolist():
        if row[token] == lowest:
            break  # tokens outside the candidates may tie with it at a lower index
        if state.allows(token):
            return int(token)
    return constrained_argmax(state, row)


class Constraint:
    """The grammar state after the committed text of one answer."""

    def __init__(self, model: Model, spec: GrammarSpec):
        self.state = GrammarState(model, spec)
        self.eog = model.is_eog

    def choose(self, row: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
        """The token of a position decoded without a draft."""
        if params.greedy:
            return best_allowed(self.state, row)
        return sample(probabilities(self.state.mask(row), params), rng)

    def allowed_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the grammar allows in a row from here."""
        walker = self.state.clone()
        for i, token in enumerate(tokens):
            if not walker.allows(token):
                return i
            if not self.eog(token):
                walker.accept(token)
        return len(tokens)

    def verify_greedy(self, draft: list[int], rows: np.ndarray) -> tuple[int, int]:
        """(accepted drafts, the target's next token): drafts are kept while each equals
        the target's constrained choice at its position."""
        walker = self.state.clone()
        for i, token in enumerate(draft):
            choice = best_allowed(walker, rows[i])
            if choice != token:
                return i, choice
            walker.accept(token)
        return len(draft), best_allowed(walker, rows[len(draft)])

    def mask_rows(self, draft: list[int], rows: np.ndarray) -> np.ndarray:
        """Every verified row masked by the state its own prefix reaches. Past a draft
        token the grammar forbids no position is reached (the target refuses that token
        for sure): those rows are left as they are."""
        walker = self.state.clone()
        masked = np.array(rows, dtype=np.float32)
        for i in range(rows.shape[0]):
            masked[i] = walker.mask(rows[i])
            if i < len(draft):
                if not walker.allows(draft[i]) or self.eog(draft[i]):
                    break
                walker.accept(draft[i])
        return masked

    def commit(self, tokens: list[int]) -> None:
        """The step committed ``tokens``; an end-of-generation token ends the answer."""
        for token in tokens:
            if self.eog(token):
                return
            self.state.accept(token)

    def close(self) -> None:
        self.state.close()

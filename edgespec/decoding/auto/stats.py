"""Measured acceptance of each drafter: what the controller learns about proposals.

With p the probability that each next draft is accepted, a step that verifies γ drafts
yields E = 1 + p + p² + … + p^γ tokens (the accepted prefix plus the target's token).
Statistics react within a few steps (decayed counts whose prior weighs a couple of
observations, not a dozen): how well a drafter does depends on the text.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from edgespec.decoding.auto.tuning import DEFAULT, Tuning, measured_acceptance
from edgespec.decoding.drafters import LOOKUP_DRAFTERS, REGISTRY

ANY_COPY, HELD, PREDICTED = 0, 1, 2  # where a lookup's proposal comes from (LookupStats)
SOURCES = 3


def expected_tokens(accept: np.ndarray) -> np.ndarray:
    """E[tokens] for γ = 0..len(accept): accept[i] is the chance that draft i+1 is
    accepted given the ones before it were."""
    return np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(accept))))


Rate = float | np.ndarray  # one estimate, or one per bucket


def posterior_mean(hits: Rate, seen: Rate, prior: Rate, pseudo: float) -> Rate:
    """Decayed counts of hits among judged tokens, pulled toward ``prior`` as if it had
    been seen ``pseudo`` times: the one smoothing every acceptance estimate here uses."""
    return (hits + pseudo * prior) / (seen + pseudo)


class LengthBuckets:
    """The bucket of every effective match length up to the last edge (longer ones are in
    the last bucket), and of each token of a proposal by its match length (row) and index
    (column): looked up at every step for every judged and proposed token, where a search
    would cost more."""

    def __init__(self, edges: tuple[int, ...]):
        edges_array = np.array(edges)
        self.count = len(edges)
        self.longest = int(edges_array[-1])
        lengths = np.arange(self.longest + 1)
        self.of: list[int] = (np.searchsorted(edges_array, lengths.clip(1), side="right") - 1).tolist()
        self.from_ = np.array(self.of)[np.minimum(np.add.outer(lengths, lengths), self.longest)]


@cache
def length_buckets(edges: tuple[int, ...]) -> LengthBuckets:
    return LengthBuckets(edges)


class LookupStats:
    """Measured acceptance of one lookup drafter's proposals: evidence on whether a
    proposed token is right given that the ones before it in the proposal were, by its
    effective match length m (matched suffix plus the proposal tokens before it): a copy
    in progress is a long match. Counts decay, so the estimates follow the text.

    Tokens right after the end of a sentence or a line of the source are scored apart: that
    is where copies end (a bullet summary starts a new bullet where its source ran on; an
    answer that quotes one sentence stops after it), or, in an edit, where they go on line
    after line. Which of the two this answer does is learned like the rest, so a draft
    stops at a boundary exactly when the answer keeps leaving the source there.

    Evidence is kept apart by level: whether another lookup proposes the same first token
    (``agreement``), and where the proposal comes from (``source``): any copy (``ANY_COPY``);
    a drafter one of whose copies held long earlier in the answer (``HELD``: an answer that
    follows its source at length, lifted sentences or an edited file, goes on doing so
    after a break far more often than one that copied a phrase); or the request's
    Predicted Output (``PREDICTED``: the client said the answer would look like it)."""

    def __init__(
        self,
        tuning: Tuning = DEFAULT,
        caution: float | None = None,
        measured: tuple[float, ...] | None = None,
    ) -> None:
        self.tuning = tuning
        self.caution = tuning.caution if caution is None else caution
        self.buckets = length_buckets(tuning.length_edges)
        # the measured acceptance by length bucket, and what it is worth (none: the chain alone)
        if measured is not None and len(measured) != self.buckets.count:
            raise ValueError(f"{len(measured)} measured acceptances for {self.buckets.count} length buckets")
        self.measured = (
            [min(v, tuning.measured_cap) for v in measured]
            if measured is not None
            else [tuning.lookup_prior] * self.buckets.count
        )
        # per bucket: a short match's chance depends on the text more than on its length
        self.weights = [
            tuning.measured_pseudo if measured is not None and edge >= tuning.measured_from else 0.0
            for edge in tuning.length_edges
        ]
        # by level (agreement + agreement_levels × source), then length
        self.levels = SOURCES * tuning.agreement_levels
        self.hits = np.zeros((self.levels, self.buckets.count))
        self.seen = np.zeros((self.levels, self.buckets.count))
        self.cross_hits = 0.0
        self.cross_seen = 0.0
        # per level, rebuilt after that level's evidence (or its base level's) changed
        self._estimates: list[np.ndarray | None] = [None] * self.levels
        self._means: list[list[float] | None] = [None] * tuning.agreement_levels
        self._cross: float | None = None

    def level(self, agreement: int, source: int) -> int:
        return agreement + self.tuning.agreement_levels * source

    def observe(
        self,
        effective_len: int,
        hit: bool,
        *,
        crossing: bool = False,
        agreement: int = 0,
        source: int = ANY_COPY,
    ) -> None:
        t = self.tuning
        if crossing:
            self.cross_hits = t.cross_decay * self.cross_hits + hit
            self.cross_seen = t.cross_decay * self.cross_seen + 1
            self._cross = None
            return
        b = self.buckets.of[min(effective_len, self.buckets.longest)]
        level = self.level(agreement, source)
        self.hits[level, b] = t.decay * self.hits[level, b] + hit
        self.seen[level, b] = t.decay * self.seen[level, b] + 1
        self._estimates[level] = None
        if source == ANY_COPY:  # the other sources start from the first level's evidence
            for other in range(1, SOURCES):
                self._estimates[self.level(agreement, other)] = None
            self._means[agreement] = None

    def soften(self, keep: float) -> None:
        """Keep only a share of the evidence (see AcceptanceStats.soften)."""
        self.hits *= keep
        self.seen *= keep
        self.cross_hits *= keep
        self.cross_seen *= keep
        self._estimates = [None] * self.levels
        self._means = [None] * self.tuning.agreement_levels
        self._cross = None

    def crossing(self) -> float:
        """Chance that a copy goes on past a boundary of its source. A plain posterior mean,
        not a lower bound: boundaries come every line or sentence, so evidence arrives fast,
        and the copy's acceptance around them is already priced cautiously."""
        if self._cross is None:
            t = self.tuning
            self._cross = posterior_mean(self.cross_hits, self.cross_seen, t.cross_prior, t.cross_pseudo)
        return self._cross

    def _base_means(self, agreement: int) -> list[float]:
        """Posterior means by length bucket at a plain level (any copy), each bucket
        smoothed toward the one below."""
        means = self._means[agreement]
        if means is None:
            t = self.tuning
            prior, means = t.lookup_prior, []
            hits, seen = self.hits[agreement].tolist(), self.seen[agreement].tolist()
            for h, n, m, w in zip(hits, seen, self.measured, self.weights, strict=True):
                prior = (h + t.pseudo * prior + w * m) / (n + t.pseudo + w)  # posterior_mean, inlined
                means.append(prior)
            self._means[agreement] = means
        return means

    def estimates(self, level: int = 0) -> np.ndarray:
        """Acceptance by length bucket, for proposals at this level. Each bucket's evidence
        is smoothed toward the estimate for the bucket below (a pseudo-observation), so a
        bucket with no evidence behaves like the longest one that has some: a copy that
        holds is trusted to go on, until the lengths where copies end have been seen. At
        another source's level a bucket is pulled toward the plain level's estimate for the
        same length (``held_pseudo`` observations of it): a held copy's first breaks are
        priced like any copy's until they show otherwise, with the plain level's support."""
        row = self._estimates[level]
        if row is None:
            # Rebuilt at most once a step (every step brings evidence), a dozen scalars:
            # plain floats, as numpy calls on arrays this small would cost several times more.
            t = self.tuning
            agreement, sourced = level % t.agreement_levels, level >= t.agreement_levels  # HELD, PREDICTED
            base = self._base_means(agreement)
            base_seen = self.seen[agreement].tolist()
            extra = t.held_pseudo if sourced else 0.0
            values = []
            hits, seen = self.hits[level].tolist(), self.seen[level].tolist()
            for b, (h, n) in enumerate(zip(hits, seen, strict=True)):
                if sourced:  # its own evidence, then the base level's (itself smoothed along lengths)
                    prior = (h + extra * base[b]) / (n + extra)
                    support = n + t.pseudo + self.weights[b] + base_seen[b]
                else:
                    prior, support = base[b], n + t.pseudo + self.weights[b]
                # Price with a lower confidence bound: where evidence is thin (lengths no
                # copy has reached yet) a bet on a long draft must not rest on a guess.
                spread = math.sqrt(prior * (1 - prior) / support)
                caution = self.caution * (t.held_caution if sourced else 1.0)
                values.append(max(0.0, prior - caution * spread))
            row = self._estimates[level] = np.array(values)
        return row

    def acceptance(
        self,
        evidence: int,
        length: int,
        crossings: np.ndarray | None = None,
        agreement: int = 0,
        source: int = ANY_COPY,
    ) -> np.ndarray:
        buckets = self.buckets.from_[min(evidence, self.buckets.longest), :length]
        if length > len(buckets):  # longer than any bucket edge: the rest is in the last
            buckets = np.concatenate((buckets, np.full(length - len(buckets), self.buckets.of[-1])))
        accept = self.estimates(self.level(agreement, source))[buckets]
        if crossings is not None and crossings.any():
            accept = np.where(crossings[:length], self.crossing(), accept)
        return accept


class AcceptanceStats:
    """Measured acceptance of each drafter: the lookups' by match length, and the draft
    model's per token and by its own confidence (calibrated against what was accepted)."""

    def __init__(self, tuning: Tuning = DEFAULT) -> None:
        self.tuning = tuning
        measured = measured_acceptance()
        self.lookup = {
            name: LookupStats(
                tuning, tuning.forced_caution if REGISTRY[name].needs_grammar else None, measured.get(name)
            )
            for name in LOOKUP_DRAFTERS
        }
        self.model = tuning.model_prior  # per-token acceptance of the draft model
        self.model_hits = 0.0  # decayed counts of the draft model's judged tokens
        self.model_seen = 0.0
        buckets = tuning.confidence_buckets
        self.model_by_confidence = (np.arange(buckets) + 0.5) / buckets  # prior: calibrated
        # decayed count of judged draft tokens per confidence bucket: how sure each entry is
        self.model_confidence_seen = np.zeros(buckets)
        self.model_steps = 0  # steps the draft model has drafted for this pair

    def _confidence_bucket(self, confidence: float) -> int:
        buckets = self.tuning.confidence_buckets
        return min(int(confidence * buckets), buckets - 1)

    def model_acceptance(self, confidence: float, *, optimistic: bool = False) -> float:
        """Chance that a draft token with this confidence is accepted. ``optimistic`` adds
        one standard error where the bucket has little evidence: a draft that is always cut
        before its less confident tokens would never learn that those are often right."""
        b = self._confidence_bucket(confidence)
        p = float(self.model_by_confidence[b])
        if optimistic:
            p = min(1.0, p + math.sqrt(p * (1 - p) / (self.model_confidence_seen[b] + 1.0)))
        return p

    def observe_model(self, confidences: list[float], accepted: int) -> None:
        t = self.tuning
        self.model_steps += 1
        for i, confidence in enumerate(confidences[: accepted + 1]):
            if math.isnan(confidence):
                continue  # text a grammar forced: judged as the grammar's drafter's, not the model's
            hit = i < accepted
            self.model_hits = t.model_decay * self.model_hits + hit
            self.model_seen = t.model_decay * self.model_seen + 1.0
            b = self._confidence_bucket(confidence)
            old = self.model_by_confidence[b]
            self.model_by_confidence[b] = (1 - t.confidence_ema) * old + t.confidence_ema * float(hit)
            self.model_confidence_seen *= t.decay
            self.model_confidence_seen[b] += 1.0
        self._update_model()

    def _update_model(self) -> None:
        t = self.tuning
        self.model = posterior_mean(self.model_hits, self.model_seen, t.model_prior, t.model_pseudo)

    def soften(self, keep: float) -> None:
        """Keep only a share of every drafter's evidence, as a new answer starts: how well
        each drafts depends on the text (an edit after a summary, a sum after a chat), so
        what the last answer showed is a weak prior for this one, not a verdict."""
        for lookup in self.lookup.values():
            lookup.soften(keep)
        self.model_hits *= keep
        self.model_seen *= keep
        self._update_model()

    def model_upper(self, doubt: float) -> float:
        """The draft model's acceptance plus ``doubt`` standard errors of its evidence (a
        few tokens' worth, as the counts decay): what it could still turn out to be."""
        p = self.model
        return min(1.0, p + doubt * math.sqrt(p * (1 - p) / (self.model_seen + self.tuning.model_pseudo)))

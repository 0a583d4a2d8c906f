"""Prompt states read once per worker and restored for every answer that starts from them.

Tests that compare configurations on one prompt need each answer to start from the same
KV bytes. Reading the prompt again for each costs seconds on one core (a few hundred
tokens of the target: 5-20 s); restoring its saved state costs milliseconds and gives the
same bytes."""

from __future__ import annotations

import weakref
from collections import OrderedDict

from edgespec.api import EdgeSpec
from edgespec.runtime.model import Snapshot

# A state of a few hundred tokens is 2-15 MB for the pair: the budget holds every prompt's
# and continuation's state a module reads, so none is read twice.
KEPT_BYTES_PER_PAIR = 1 << 30

# Weakly keyed: a pair closed by its module takes its states with it, and a later pair
# never meets bytes saved on another.
_kept: weakref.WeakKeyDictionary[EdgeSpec, OrderedDict[tuple[int, ...], list[Snapshot]]] = (
    weakref.WeakKeyDictionary()
)


def start_from_prefill(lm: EdgeSpec, tokens: list[int], base: int | None = None) -> None:
    """Make both models hold ``tokens`` but the last, from the same bytes every time, and
    the drafters remember no earlier answer: every configuration compared on a prompt
    starts from one state, and the answer reads the last token itself, as it does in a
    chat. A prompt is read in one batch; a prompt continued past a near-tie
    (``tokens[:base]`` is the prompt) is read from the prompt's own state, the continuation
    in one batch: near-ties part at other places on other machines and thread counts, and
    each would otherwise read the whole prompt again."""
    models = [m.sequence(0) for m in (lm.target, lm.draft) if m is not None]
    kept = _kept.setdefault(lm, OrderedDict())
    key = tuple(tokens)
    if key not in kept:
        if base is not None and base < len(tokens):
            start_from_prefill(lm, tokens[:base])
            for model in models:
                model.decode(tokens[base - 1 : -1], n_outputs=0)
        else:
            lm.start_afresh()
            for model in models:
                model.decode(tokens[:-1], n_outputs=0)
        kept[key] = [model.snapshot() for model in models]
        while sum(len(snap.data) for snaps in kept.values() for snap in snaps) > KEPT_BYTES_PER_PAIR:
            kept.popitem(last=False)
    kept.move_to_end(key)
    lm.start_afresh()  # no sequence holds anything, and the `suffix` index is empty
    for model, snap in zip(models, kept[key], strict=True):
        # The tokens go with the bytes: a model that last held another prompt would
        # otherwise see no common prefix and read this one again, in other batches.
        model.load_state(tokens[:-1], snap.data)

"""The recorded corpus both replay suites run (``tests/fixtures/replay-corpus.json.gz``,
made by ``tools/record_replay_set.py``): every prompt of both halves, answered greedily
by the shipped target and guessed at by the draft."""

from __future__ import annotations

from pathlib import Path

from edgespec.bench.recording import Recording, read_set

FIXTURE = Path(__file__).parent / "fixtures" / "replay-corpus.json.gz"


def recorded_halves(pair) -> dict[str, list[Recording]]:
    """The recordings by half, checked to be of the loaded pair."""
    facts, by_split = read_set(FIXTURE)
    assert pair.target.path.name in facts["target"], (facts, "record the set again for this pair")
    return by_split

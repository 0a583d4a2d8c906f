"""Record the corpus for the replay and keep it as the replay test's fixture.

Every prompt of both halves is answered greedily by the default target, and the draft
model's guess and confidence at every position of the answer are recorded (kept in the
cache as they are made, so an interrupted run resumes). The set is written to
``tests/fixtures/replay-corpus.json.gz``, which ``tests/test_replay_bound.py`` replays on
every cost curve without decoding anything. Run it again when the shipped pair changes:

    .venv/bin/python tools/record_replay_set.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgespec.bench.corpus import select
from edgespec.bench.recording import recorded_corpus, write_set
from edgespec.bootstrap import LLAMA_CPP_VERSION

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "replay-corpus.json.gz"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=FIXTURE)
    args = parser.parse_args()
    lm, recordings = recorded_corpus("all", None, args.max_tokens)
    split_of = {p.id: p.split for p in select("all")}
    by_split: dict[str, list] = {"dev": [], "test": []}
    for rec in recordings:
        by_split[split_of[rec.id]].append(rec)
    facts = {
        "target": f"{lm.target.name} {lm.target.path.name}",
        "draft": f"{lm.draft.name} {lm.draft.path.name}" if lm.draft else "",
        "llama.cpp": LLAMA_CPP_VERSION,
        "max_tokens": str(args.max_tokens),
    }
    write_set(args.out, by_split, facts)
    print(f"{len(recordings)} recordings written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a returning conversation's first token costs on this machine: cold prefill against
a state brought back from the prompt cache in host memory, and from its directory after a
restart. Two conversations of N tokens take turns on one sequence (each turn throws the
other's state out to the cache), then a third pair is loaded on the same directory. Also
times the bare copies (one model's state out to host memory and back in). Run by run.sh
(TASK=cache) on the GPU machine, on the zero-weight models; runs on a CPU too.

    python tools/gpu/cache_probe.py TARGET DRAFT N [N ...]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp  # noqa: F401  (llama.cpp before numpy: docs/gpu.md)

from edgespec.api import EdgeSpec, RuntimeOptions, settings_from
from edgespec.decoding.events import Done
from edgespec.runtime.prompt_cache import GIB, CacheOptions

ROUNDS = 3


def conversation(n: int, seed: int) -> list[int]:
    """``n`` ordinary token ids (no control tokens), different for each seed."""
    return [1000 + (seed * 7919 + i * 104729) % 30000 for i in range(n)]


def first_token(lm: EdgeSpec, tokens: list[int]) -> tuple[float, int]:
    """(seconds to the first token, prompt tokens the pair already held)."""
    request = lm.request(tokens, settings_from(max_tokens=2), drafter="none")
    done = next(e for e in lm.submit(request).events() if isinstance(e, Done))
    return done.stats.ttft_s, done.stats.reused_tokens


def load(target: str, draft: str, n: int, directory: Path) -> EdgeSpec:
    cache = CacheOptions(ram_bytes=8 * GIB, directory=directory)
    options = RuntimeOptions(n_ctx=max(4096, 2 * n), cache=cache)
    return EdgeSpec(target, draft, options=options, quiet=True)


def bare_copies(lm: EdgeSpec) -> str:
    """The target's state out to host memory and back in, medians of ``ROUNDS``."""
    model = lm.target.sequence(0)  # (the pair's one sequence: one answer at a time)
    tokens, out, back = list(model.tokens), [], []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        snapshot = model.snapshot()
        out.append(time.perf_counter() - start)
        start = time.perf_counter()
        model.load_state(tokens, snapshot.data)
        back.append(time.perf_counter() - start)
    size = len(snapshot.data) / 2**20
    return (f"target state {size:.0f} MiB: out {statistics.median(out) * 1e3:.1f} ms, "
            f"in {statistics.median(back) * 1e3:.1f} ms")  # fmt: skip


def probe(target: str, draft: str, n: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="edgespec-cache-probe-"))
    a, b = conversation(n, 1), conversation(n, 2)
    lm = load(target, draft, n, directory)
    first_token(lm, conversation(64, 3))  # warm-up: the first decode of a size builds its graph
    cold = [first_token(lm, a), first_token(lm, b)]
    returning = []
    for _ in range(ROUNDS):
        returning += [first_token(lm, a), first_token(lm, b)]
    grown = first_token(lm, a + conversation(50, 4))
    copies = bare_copies(lm)
    lm.close()
    lm = load(target, draft, n, directory)
    first_token(lm, conversation(64, 3))
    restarted = first_token(lm, b)
    lm.close()
    shutil.rmtree(directory, ignore_errors=True)
    cold_s = statistics.median(t for t, _ in cold)
    back_s = statistics.median(t for t, _ in returning)
    print(f"{Path(target).stem} N={n}: cold {cold_s * 1e3:.1f} ms; returning {back_s * 1e3:.1f} ms "
          f"({back_s / cold_s:.0%} of cold; {[round(t * 1e3, 1) for t, _ in returning]}, "
          f"held {sorted({h for _, h in returning})}); 50 new tokens after it {grown[0] * 1e3:.1f} ms "
          f"(held {grown[1]}); after a restart {restarted[0] * 1e3:.1f} ms ({restarted[0] / cold_s:.0%} "
          f"of cold, held {restarted[1]}); {copies}", flush=True)  # fmt: skip


if __name__ == "__main__":
    for size in sys.argv[3:]:
        probe(sys.argv[1], sys.argv[2], int(size))

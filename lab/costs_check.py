"""Is the steep cost curve the machine's, or ours? Time the same pass sizes three ways.

1. ``profile``: the cost profile the controller prices with (``edgespec costs show``):
   a pass over k tokens asking llama.cpp for every row of logits, as verification does;
2. ``decode``: ``llama_decode`` alone through this runtime, asking for the last row only
   (no output layer for the other rows, no row read back);
3. ``llama-bench``: llama.cpp's own benchmark, built from the same vendored sources with
   the runtime's CMake arguments, prompt processing of k tokens (it too computes the last
   row only), the same threads.

If (2) and (3) agree in shape, the curve is llama.cpp's on this machine; the gap between
(1) and (2) is what asking for every row costs (the output layer over a 151,936-token
vocabulary, k times). Sizes are interleaved over rounds and each keeps its median.

    .venv/bin/python -m lab.costs_check [--sizes 1 2 4 8 9 16 17] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from edgespec.api import EdgeSpec
from edgespec.runtime import system
from lab import llamacpp


def decode_times(lm: EdgeSpec, sizes: list[int], rounds: int, all_rows: bool) -> dict[int, float]:
    model, sequence = lm.target, lm.target.sequence(0)
    filler = model.tokenize(" the quick brown fox jumps over the lazy dog" * 12, add_special=False)
    samples: dict[int, list[float]] = {k: [] for k in sizes}
    for _ in range(rounds):
        for k in sizes:
            sequence.reset()
            sequence.decode(filler[:4], 1)
            start = time.perf_counter()
            sequence.decode(filler[4 : 4 + k], k if all_rows else 1)
            samples[k].append(time.perf_counter() - start)
    sequence.reset()
    return {k: statistics.median(v) for k, v in samples.items()}


def bench_times(lm: EdgeSpec, sizes: list[int], rounds: int) -> dict[int, float]:
    binary = llamacpp.build(tool="llama-bench")
    threads = str(system.default_threads())
    cmd = [str(binary), "-m", str(lm.target.path), "-p", ",".join(map(str, sizes)), "-n", "0",
           "-r", str(rounds), "-t", threads, "-o", "json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800).stdout
    return {int(row["n_prompt"]): float(row["avg_ns"]) / 1e9 for row in json.loads(out)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 9, 12, 15, 16, 17])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lm = EdgeSpec(quiet=True)
    costs = lm.controller_state().costs.target
    profile = {k: costs.estimate(k) for k in args.sizes}
    rows = decode_times(lm, args.sizes, args.rounds, all_rows=True)
    last = decode_times(lm, args.sizes, args.rounds, all_rows=False)
    bench = bench_times(lm, args.sizes, args.rounds)
    print(f"{system.cpu_model()}, {system.default_threads()} threads; ms, and x one token")
    print(f"{'k':>3} {'profile':>15} {'every row':>15} {'last row':>15} {'llama-bench':>15}")
    for k in args.sizes:
        cells = [f"{1000 * t[k]:7.1f} x{t[k] / t[args.sizes[0]]:5.2f}" for t in (profile, rows, last, bench)]
        print(f"{k:3d} " + " ".join(f"{c:>15}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

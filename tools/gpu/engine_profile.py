"""Where the engine thread's time goes while 4 answers decode in turn or at once: the
decodes against the rest (Python: drafting, pricing, hand-overs), and a profile of the
engine thread. Run by run.sh on the GPU machine, on the zero-weight pair.

    python tools/gpu/engine_profile.py DRAFTER TOKENS AT_ONCE(0|1) TARGET DRAFT
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import llama_cpp  # noqa: F401  (llama.cpp before numpy: docs/gpu.md)

from edgespec.api import EdgeSpec, RuntimeOptions
from edgespec.bench import parallel
from edgespec.decoding import turns
from edgespec.runtime.model import Model, Sequence

PROFILE = cProfile.Profile()
SPENT = {"decode_s": 0.0, "decodes": 0, "depth": 0}


def profiled_loop(loop):
    def run(self) -> None:
        PROFILE.enable()
        try:
            loop(self)
        finally:
            PROFILE.disable()

    return run


def timed(call):
    def run(*args, **kwargs):
        SPENT["depth"] += 1
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            SPENT["depth"] -= 1
            if SPENT["depth"] == 0:
                SPENT["decode_s"] += time.perf_counter() - start
                SPENT["decodes"] += 1

    return run


def main(drafter: str, tokens: int, together: bool, target: str, draft: str) -> None:
    turns.Turns._loop = profiled_loop(turns.Turns._loop)
    Sequence.decode, Model.decode_passes = timed(Sequence.decode), timed(Model.decode_passes)
    lm = EdgeSpec(target, draft, options=RuntimeOptions(parallel=4, engine_thread=True), quiet=True)
    lm.controller_state()  # the cost profile, measured here if it must be, not in the timing
    prompts = [parallel.prompt_tokens(lm, p) for p in parallel.spread_prompts("test", 4)]
    parallel.answer(lm, prompts[0], "none", 4)
    lm.start_afresh()
    parallel.one_side(lm, prompts, "none", 1, together=True)
    SPENT.update(decode_s=0.0, decodes=0)
    start = time.perf_counter()
    answers = parallel.one_side(lm, prompts, drafter, tokens, together)
    wall = time.perf_counter() - start
    lm.close()
    passes = sum(len(a.passes) for a in answers)
    rest = wall - SPENT["decode_s"]
    print(f"{drafter} {'at once' if together else 'in turn'}: {wall:.2f} s, {SPENT['decodes']} decodes "
          f"{SPENT['decode_s']:.2f} s, {passes} passes of {sum(sum(a.passes) for a in answers)} tokens, "
          f"the rest {rest:.2f} s = {1000 * rest / passes:.2f} ms a pass")  # fmt: skip
    stats = pstats.Stats(PROFILE)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats("edgespec", 30)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], sys.argv[5])

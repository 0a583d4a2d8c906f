"""The smoke check of a llama.cpp build: one real greedy decode in this process.

``python -m edgespec.runtime.smoke --model PATH [--expect-backend cuda|metal] [--json]``

``make setup`` runs it in a separate process right after building (or reusing) the wheel:
a build that crashes (SIGSEGV, illegal instruction) or computes garbage kills or fails this
process, not the set-up, which then falls back to a portable build. Prints one JSON line
(``--json``) or one summary line; a wrong answer or a missing backend is one line on stderr
and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# No numpy import here: llama.cpp's libraries must be loaded before numpy's (see
# edgespec.runtime.preload), and runtime.system below loads them first.
from edgespec.errors import EdgespecError, run_reporting_errors
from edgespec.runtime import system
from edgespec.runtime.model import LoadOptions, Model

# A raw completion whose greedy continuation the default target (qwen2.5-coder-1.5b, Q4_K_M)
# gets right on a sound build; checked on an AMD EPYC AVX-512 build.
PROMPT = "def add(a, b):\n    return"
EXPECTED = " a + b"
N_TOKENS = 8


def greedy(model: Model, prompt: str, n_tokens: int) -> tuple[str, float]:
    """The greedy continuation of ``prompt`` and the decode speed in tokens/s."""
    tokens, sequence = model.tokenize(prompt), model.sequence(0)
    logits = sequence.decode(tokens, 1)
    out: list[int] = []
    started = time.perf_counter()
    for _ in range(n_tokens):
        token = int(logits[-1].argmax())
        if model.is_eog(token):
            break
        out.append(token)
        logits = sequence.decode([token], 1)
    elapsed = time.perf_counter() - started
    return model.detokenize(out), (len(out) / elapsed if elapsed > 0 else 0.0)


def check(model_path: Path, expect_backend: str | None) -> dict[str, object]:
    facts = system.facts()
    backends = set(facts["backends"])  # type: ignore[arg-type]
    if expect_backend:
        if not facts["gpu_offload"]:
            raise EdgespecError(f"this build has no GPU offload, but {expect_backend} was asked for")
        if expect_backend not in backends:
            raise EdgespecError(f"this build has no {expect_backend} backend (found: {', '.join(backends)})")
    model = Model(model_path, LoadOptions(n_ctx=256, n_batch=64, max_outputs=1))
    try:
        text, speed = greedy(model, PROMPT, N_TOKENS)
        buffers = dict(model.buffers)
    finally:
        model.close()
    if not text.startswith(EXPECTED):
        raise EdgespecError(f"wrong greedy output {text!r} (expected it to start with {EXPECTED!r})")
    return {**facts, "ok": True, "text": text, "tokens_per_s": round(speed, 2), "buffers": buffers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgespec.runtime.smoke", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True, type=Path, help="GGUF file of the default target")
    parser.add_argument(
        "--expect-backend", choices=("cuda", "metal"), help="fail unless this backend is there"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)

    def body() -> int:
        result = check(args.model, args.expect_backend)
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"smoke ok: {result['text']!r} at {result['tokens_per_s']} tokens/s, "
                  f"backends {', '.join(result['backends'])}")  # type: ignore[arg-type]  # fmt: skip
        return 0

    status = run_reporting_errors(body)
    return 1 if status == 2 else status


if __name__ == "__main__":
    sys.exit(main())

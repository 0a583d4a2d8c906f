"""Drive ``edgespec serve`` with the openai client: one client, then several at once.

    .venv/bin/python -m edgespec.bench.server_bench [--url http://127.0.0.1:8080/v1]
        [--clients 1 4] [--drafters auto none] [--max-tokens 96] [--rounds 2] [--engine]

Without ``--url`` it starts a server on a free loopback port and stops it afterwards.
For each drafter and number of concurrent clients it reports requests/s, time to first
token and decode tokens/s (after the first token, measured at the client, median and
p95). ``--engine`` then runs the same prompts on the engine alone, in this process and
with the server stopped, for the server's overhead. The server is started as a command,
never imported: the benchmark layer sits below the server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Rename the variable `n` to `count` in this code and reply with the code only:\n"
    "```python\ndef total(items):\n    n = 0\n    for item in items:\n        n += item\n    return n\n```",
    "Explain in three sentences what a hash map is.",
    "Write a SQL query that returns the ten most recent orders with their customer names.",
)


@dataclass
class Sample:
    ttft_s: float
    decode_tps: float
    tokens: int


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def one_request(client, prompt: str, drafter: str, max_tokens: int) -> Sample:
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"drafter": drafter},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and not first:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    wall = time.perf_counter() - started
    decode = (tokens - 1) / (wall - first) if tokens > 1 and wall > first > 0 else 0.0
    return Sample(first, decode, tokens)


def run_config(base_url: str, drafter: str, clients: int, rounds: int, max_tokens: int) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=os.environ.get("EDGESPEC_API_KEY", "unused"), max_retries=0)
    jobs = [PROMPTS[i % len(PROMPTS)] for i in range(rounds * max(clients, len(PROMPTS)))]
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        samples = list(pool.map(lambda p: one_request(client, p, drafter, max_tokens), jobs))
    wall = time.perf_counter() - started
    ttft = [s.ttft_s for s in samples]
    decode = [s.decode_tps for s in samples]
    return {
        "drafter": drafter,
        "clients": clients,
        "requests": len(samples),
        "requests_per_s": len(samples) / wall,
        "ttft_median_s": statistics.median(ttft),
        "ttft_p95_s": percentile(ttft, 0.95),
        "decode_median_tps": statistics.median(decode),
        "decode_p95_tps": percentile(decode, 0.05),  # the slow tail: 95 % of requests were faster
    }


def engine_alone(args: argparse.Namespace) -> dict[str, float]:
    from edgespec.api import EdgeSpec, RuntimeOptions

    lm = EdgeSpec(options=RuntimeOptions(n_ctx=args.ctx), quiet=True)
    lm.controller_state(quiet=True)
    rates: dict[str, float] = {}
    for drafter in args.drafters:
        values = []
        for prompt in PROMPTS:
            done = lm.generate(prompt, chat=True, max_tokens=args.max_tokens, drafter=drafter, gamma="auto")
            values.append(done.stats.decode_tokens_per_second)
        rates[drafter] = statistics.median(values)
    lm.close()
    return rates


@contextmanager
def running_server(ctx: int) -> Iterator[str]:
    """A server on a free loopback port for the length of the block; yields its /v1 URL."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile(mode="w+") as log:  # a progress bar must never block on a full pipe
        process = subprocess.Popen(
            [sys.executable, "-m", "edgespec", "serve", "--port", str(port), "--ctx", str(ctx)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 600
            while not _healthy(httpx, url):
                if process.poll() is not None:
                    log.seek(0)
                    raise SystemExit(f"edgespec serve exited:\n{log.read()}")
                if time.monotonic() > deadline:
                    raise SystemExit("edgespec serve did not become healthy")
                time.sleep(0.5)
            yield f"{url}/v1"
        finally:
            process.terminate()
            process.wait(30)


def _healthy(httpx, url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an already running server's /v1 URL (default: start one)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--drafters", nargs="+", default=["auto", "none"])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2, help="requests per prompt and client count")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--engine", action="store_true", help="also measure the engine alone")
    args = parser.parse_args(argv)

    with contextlib.nullcontext(args.url) if args.url else running_server(args.ctx) as base_url:
        rows = [
            run_config(base_url, drafter, clients, args.rounds, args.max_tokens)
            for clients in args.clients
            for drafter in args.drafters
        ]

    print(f"{'drafter':8} {'clients':>7} {'req':>4} {'req/s':>6} {'ttft med':>9} {'ttft p95':>9} "
          f"{'decode med':>11} {'decode p95':>11}")  # fmt: skip
    for r in rows:
        print(f"{r['drafter']:8} {r['clients']:>7} {r['requests']:>4} {r['requests_per_s']:>6.2f} "
              f"{r['ttft_median_s']:>8.2f}s {r['ttft_p95_s']:>8.2f}s "
              f"{r['decode_median_tps']:>7.1f} t/s {r['decode_p95_tps']:>7.1f} t/s")  # fmt: skip
    if args.engine:
        for drafter, rate in engine_alone(args).items():
            print(f"engine alone, {drafter}: decode median {rate:.1f} t/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

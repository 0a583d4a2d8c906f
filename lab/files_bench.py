"""What the app's file features save a person, measured through the same engine the app
runs (one engine thread, the prompt cache in memory), on files nobody here wrote (modules
of Python's own standard library):

* **edit**: a whole-file rename, asked as the edit pane asks it (``canvas_text``), the file
  as the Predicted Output; decode rate with the drafter ``auto`` against ``none``,
  interleaved, each run from a fresh start (no earlier answer to copy).
* **read ahead**: a ~3,000-token file and a ten-word question; first-token time cold (the
  file never seen), after the file was read ahead whole (the person read for 40 s), and
  after 8 s of reading ahead (typing).
* **branch**: a chat's first question cold, then a branch of it after its first answer:
  the branch's follow-up's first-token time.

    python -m lab.files_bench [--repeats 2] [--ctx 8192]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from collections.abc import Callable

from edgespec.decoding.events import Done
from edgespec.ui.canvas_text import edit_messages
from edgespec.ui.files import message_text

QUESTION = "Which function in this file should I read first, and why?"  # ten words


def answer(lm, messages: list[dict], **kwargs) -> Done:
    done = None
    for event in lm.submit(lm.request(messages, chat=True, **kwargs)).events():
        if isinstance(event, Done):
            done = event
    assert done is not None
    return done


def edit_rates(lm, repeats: int) -> dict[str, list[float]]:
    import colorsys

    source = inspect.getsource(colorsys)
    messages = edit_messages("colorsys.py", source, "Rename the function rgb_to_hsv to rgb_to_hsv_color "
                             "throughout the file.")  # fmt: skip
    budget = lm.target.n_ctx - len(lm.prompt_tokens(messages, chat=True)) - 1
    rates: dict[str, list[float]] = {"none": [], "auto": []}
    for _ in range(repeats):
        for drafter in ("none", "auto"):
            lm.start_afresh()
            done = answer(lm, messages, drafter=drafter, prediction=source, max_tokens=budget)
            rates[drafter].append(done.stats.decode_tokens_per_second)
            print(
                f"edit {drafter}: {done.stats.tokens} tokens, {rates[drafter][-1]:.1f} tok/s decode",
                flush=True,
            )
    return rates


def big_file(lm, tokens: int = 3000) -> str:
    import difflib

    text = inspect.getsource(difflib)
    ids = lm.target.tokenize(text, add_special=False)[:tokens]
    return lm.target.detokenize(ids)


def read_ahead_ttft(lm, text: str, nonce: int, wait: Callable[[object], None] | None) -> float:
    """First-token time of the question sent with the file (a nonce makes it unseen),
    after ``wait`` let a read-ahead of it run (None: sent at once, cold)."""
    name = f"difflib_{nonce}.py"
    messages = [{"role": "user", "content": message_text(QUESTION, [(name, text)])}]
    if wait is not None:
        prefix = message_text("", [(name, text)])
        wait(lm.read_ahead(lm.prompt_prefix_tokens([], prefix), owner="bench"))
    return answer(lm, messages, max_tokens=8).stats.ttft_s


def read_ahead_figures(lm, repeats: int) -> dict[str, list[float]]:
    text, nonce = big_file(lm), 0
    figures: dict[str, list[float]] = {"cold": [], "read 40 s": [], "typed 8 s": []}

    def whole(reading) -> None:
        reading.wait(40)

    def typed(reading) -> None:
        time.sleep(8)

    for _ in range(repeats):
        for label, wait in (("cold", None), ("read 40 s", whole), ("typed 8 s", typed)):
            nonce += 1
            figures[label].append(read_ahead_ttft(lm, text, nonce, wait))
            print(f"read ahead, {label}: first token {figures[label][-1]:.2f} s", flush=True)
    return figures


def branch_figures(lm, repeats: int) -> dict[str, list[float]]:
    import json as module

    source = inspect.getsource(module)[:6000]
    figures: dict[str, list[float]] = {"cold": [], "branch": []}
    for n in range(repeats):
        first = {
            "role": "user",
            "content": message_text("What does this module do?", [(f"json{n}.py", source)]),
        }
        done = answer(lm, [first], max_tokens=24)
        figures["cold"].append(done.stats.ttft_s)
        later = [first, {"role": "assistant", "content": done.text}]
        answer(lm, [*later, {"role": "user", "content": "Name its main function."}], max_tokens=16)
        branch = answer(lm, [*later, {"role": "user", "content": "Is it thread safe?"}], max_tokens=16)
        figures["branch"].append(branch.stats.ttft_s)
        print(f"branch: cold {figures['cold'][-1]:.2f} s, branch {figures['branch'][-1]:.2f} s", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=8192)
    args = parser.parse_args()
    from edgespec.api import EdgeSpec, RuntimeOptions
    from edgespec.runtime.prompt_cache import GIB, CacheOptions

    options = RuntimeOptions(n_ctx=args.ctx, engine_thread=True, cache=CacheOptions(ram_bytes=2 * GIB))
    lm = EdgeSpec(options=options, quiet=True)
    lm.controller_state()
    try:
        rates = edit_rates(lm, args.repeats)
        ahead = read_ahead_figures(lm, args.repeats)
        branches = branch_figures(lm, args.repeats)
    finally:
        lm.close()
    best = {k: max(v) for k, v in rates.items()}
    ratio = best["auto"] / best["none"]
    print(f"\nedit: none {rates['none']}, auto {rates['auto']} tok/s; best auto/none {ratio:.2f}")
    cold = statistics.median(ahead["cold"])
    for label in ("read 40 s", "typed 8 s"):
        warm = statistics.median(ahead[label])
        share = f"{warm / cold:.0%}, {cold - warm:.1f} s sooner"
        print(f"read ahead, {label}: {warm:.2f} s vs cold {cold:.2f} s ({share})")
    cold_b, branch = statistics.median(branches["cold"]), statistics.median(branches["branch"])
    print(f"branch: first token {branch:.2f} s vs the chat's cold {cold_b:.2f} s ({branch / cold_b:.0%})")


if __name__ == "__main__":
    main()

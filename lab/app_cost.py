"""What the chat app costs the answer it shows: the same prompt decoded by the CLI
(``edgespec generate``, its own process) and streamed in the app with a headless Chromium
attached, side by side, interleaved, per drafter.

    python -m lab.app_cost [--drafters none auto] [--repeats 2] [--max-tokens 160]

The app is loaded as ``app.py`` loads it (one engine thread, the prompt cache) and served
on loopback; the browser drives it the way a user does: Clear, pick the drafter, type the
prompt, Enter, and wait for the answer's stats. The figure compared is the decode-phase
rate (tokens after the first over the time after the first), which both report from the
same engine counters; prefill differs between a fresh CLI process and the app's warm
cache, and is left out. Greedy, so both decode the same tokens. Each answer asks another
private edit (``data/app_edits.toml``), the same on both sides: asked again, the app would
draft the answer from its own earlier one (the ``suffix`` index), which the CLI's fresh
process cannot; with more answers than edits, the app starts afresh before an edit it
was asked before (its sequences and its ``suffix`` index emptied, as a new process's).
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgespec.errors import EdgespecError

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]
EDITS = Path(__file__).parent / "data" / "app_edits.toml"
WARM_UP = "Count from one to ten in words."  # the page's first render and the app's first answer
DECODE = re.compile(r"tokens/s, decode phase \| ([0-9.]+)")
TIMEOUT_S = 600


@dataclass
class Pairing:
    drafter: str
    cli: list[float] = field(default_factory=list)  # decode tokens/s per repeat
    app: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        best_cli, best_app = max(self.cli), max(self.app)
        ratios = [a / c for a, c in zip(self.app, self.cli, strict=True)]
        return {
            **asdict(self),
            "best_cli": best_cli,
            "best_app": best_app,
            "ratio_of_bests": round(best_app / best_cli, 3),
            "ratios": [round(r, 3) for r in ratios],
            "spread": round(max(ratios) - min(ratios), 3) if len(ratios) > 1 else 0.0,
        }


def edit_prompts(path: Path = EDITS) -> list[str]:
    """The private edits, as a user would ask for them: the answer copies most of its input."""
    return [
        f"Rename the variable `{edit['old']}` to `{edit['new']}` everywhere in this function "
        f"and return the whole function:\n\n```python\n{edit['code'].strip()}\n```"
        for edit in tomllib.loads(path.read_text())["edit"]
    ]


def cli_rate(prompt: str, drafter: str, max_tokens: int, ctx: int) -> float:
    """``edgespec generate`` in its own process, as a user runs it."""
    command = [sys.executable, "-m", "edgespec", "generate", "--chat", "--prompt", prompt, "--drafter",
               drafter, "--max-tokens", str(max_tokens), "--ctx", str(ctx), "--json"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise EdgespecError(f"edgespec generate failed: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["stats"]["decode_tokens_per_second"]


def app_rate(page, prompt: str, drafter: str) -> float:
    """One answer streamed in the app, from a new chat to its final stats."""
    page.click("#new-chat")
    page.wait_for_function("() => !document.querySelector('#stats')?.innerText.includes('decode phase')")
    page.click(f"#drafter label:has-text('{drafter}')")
    page.fill("#message textarea", prompt)
    page.keyboard.press("Enter")
    # Polled once a second, by textContent: polling at every animation frame (the default)
    # and reading innerText (a forced layout) would make the page redraw 60 times a second,
    # a cost no user's browser pays.
    page.wait_for_function(
        "() => document.querySelector('#stats')?.textContent.includes('decode phase')",
        timeout=TIMEOUT_S * 1000,
        polling=1000,
    )
    text = page.inner_text("#stats").replace("\t", " | ")
    found = DECODE.search(re.sub(r"\s*\|\s*", " | ", text))
    if found is None:
        raise EdgespecError(f"the app's stats have no decode rate: {text[:300]!r}")
    return float(found.group(1))


def open_app(browser, url: str, max_tokens: int):
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.set_default_timeout(TIMEOUT_S * 1000)
    page.goto(url)
    page.wait_for_selector("#message textarea")
    open_panels(page)
    page.fill("#max-tokens input[type=number]", str(max_tokens))
    page.keyboard.press("Tab")
    return page


def open_panels(page) -> None:
    """Unfold the settings and the stats (folded by default; the page draws a folded
    panel's contents only once it is opened)."""
    unfold(page, "#settings-panel", "#drafter")
    unfold(page, "#stats-panel", "#steps-plot")


def unfold(page, panel: str, inside: str) -> None:
    """Open a folded panel until what it holds shows (the page may still be applying the
    panels' remembered state as it opens: a click then could fold it again)."""
    for _ in range(20):
        if page.locator(inside).first.is_visible():
            return
        if page.locator(f"{panel} > button").get_attribute("aria-expanded") != "true":
            page.click(f"{panel} > button")
        time.sleep(0.5)
    raise EdgespecError(f"the app's {panel} does not open")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(args: argparse.Namespace) -> list[Pairing]:
    from playwright.sync_api import sync_playwright

    from edgespec.api import EdgeSpec, RuntimeOptions
    from edgespec.ui.layout import build_app, launch_app

    if not CHROMIUM.exists():
        raise EdgespecError(f"{CHROMIUM} is not installed (make setup-test installs it)")
    lm = EdgeSpec(options=RuntimeOptions(n_ctx=args.ctx, engine_thread=True), quiet=True)
    lm.controller_state()
    demo = build_app(lm)
    port = free_port()
    launch_app(demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    pairings = [Pairing(d) for d in args.drafters]
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = open_app(browser, f"http://127.0.0.1:{port}/", args.max_tokens)
            app_rate(page, WARM_UP, "none")
            asked: set[str] = set()
            for repeat in range(args.repeats):
                for number, pairing in enumerate(pairings):
                    # Another edit for every answer the app gives: it has seen none of them.
                    prompt = args.prompts[(repeat * len(pairings) + number) % len(args.prompts)]
                    if prompt in asked:
                        # More answers than edits: the app's suffix index would draft this
                        # one from its earlier answer, which a new CLI process cannot.
                        lm.start_afresh()
                    asked.add(prompt)
                    # Interleaved, and in turn first: neither side always runs after the other.
                    sides = [("cli", pairing.cli), ("app", pairing.app)]
                    for side, rates in sides if repeat % 2 == 0 else reversed(sides):
                        rate = (
                            cli_rate(prompt, pairing.drafter, args.max_tokens, args.ctx)
                            if side == "cli"
                            else app_rate(page, prompt, pairing.drafter)
                        )
                        rates.append(rate)
                        print(f"{pairing.drafter:6} {side}: {rate:.1f} tokens/s", file=sys.stderr, flush=True)
            browser.close()
    finally:
        demo.close()
        lm.close()
    return pairings


def report(args: argparse.Namespace) -> int:
    """Measure and print; ``args``: drafters, repeats, max_tokens, ctx, prompt, json."""
    pairings = measure(args)
    started = time.strftime("%Y-%m-%d %H:%M")
    rows = [p.summary() for p in pairings]
    print(f"app streaming vs CLI, decode tokens/s, greedy, {args.max_tokens} tokens ({started})")
    for row in rows:
        print(f"  {row['drafter']:6} CLI {row['best_cli']:.1f}  app {row['best_app']:.1f}  "
              f"app/CLI {row['ratio_of_bests']:.2f} (per repeat {row['ratios']}, median "
              f"{statistics.median(row['ratios']):.2f})")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"started": started, "rows": rows}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.app_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafters", nargs="+", default=["none", "auto"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument(
        "--prompt", action="append", dest="prompts", help="ask this instead (repeatable: in turn)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    args.prompts = args.prompts or edit_prompts()
    try:
        return report(args)
    except EdgespecError as exc:
        print(f"edgespec: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

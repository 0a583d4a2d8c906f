"""How warm a chat comes back after the chat app restarts, measured as a person meets it.

Three chats are made in ``app.py`` (its own process, fresh folders) from prompts of the
corpus's test half; the app is stopped with Ctrl-C and started again; the follow-up asked
in one of the chats waits for its first token (the answer's own "time to first token",
its prefill) — beside the same follow-up in the same chat asked of an app started with
its prompt cache emptied. Repeated, the two ways alternating, on the same folders.

    .venv/bin/python tools/app_restart.py [--repeats 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from edgespec.bench.corpus import select  # noqa: E402
from edgespec.ui.chat_store import ChatStore  # noqa: E402
from edgespec.ui.views import View  # noqa: E402
from tests.app_process import AppProcess  # noqa: E402

OUT = {name: index for index, name in enumerate(View.names())}
LISTED = len(OUT)  # the chat list, after the panels, in what opening a chat returns

CHATS = ("sum-", "rag-", "edit-")  # one chat from each: summary, RAG answer, code edit
FOLLOW_UP = "Now say the same in one sentence."
SETTINGS = {"system": "", "drafter": "auto", "gamma": "auto", "verify": "token", "temperature": 0.0,
            "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": "", "max_tokens": 64, "lenience": 1.0,
            "colour": False}  # fmt: skip
TTFT = re.compile(r"time to first token \| ([0-9.]+) s")
REUSED = re.compile(r"(\d+) tokens, (\d+) reused")


def prompts() -> list[str]:
    chosen = []
    test_half = select()  # the test half
    for prefix in CHATS:
        chosen.append(next(p.text for p in test_half if p.id.startswith(prefix)))
    return chosen


def client_for(app: AppProcess):
    from gradio_client import Client

    client = Client(app.url, verbose=False)
    client.predict("", api_name="/new_chat")  # lists the chats, as the page does
    return client


def follow_up(app: AppProcess, chat_id: str) -> tuple[float, int, int]:
    """Time to first token of the follow-up in ``chat_id``, its prompt and reused tokens."""
    client = client_for(app)
    client.predict(chat_id, api_name="/open_chat")
    done = client.predict(FOLLOW_UP, **SETTINGS, api_name="/chat")
    stats = re.sub(r"\s*\|\s*", " | ", done[OUT["stats"]])
    client.close()
    prompt, reused = (int(x) for x in REUSED.search(stats).groups())
    return float(TTFT.search(stats).group(1)), prompt, reused


def take_back(data: Path, chat_id: str) -> None:
    """The chat as it was before the follow-up: the next measurement asks it again."""
    store = ChatStore.open(data)
    store.truncate(chat_id, len(store.load(chat_id).messages) - 2)
    store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="edgespec-restart-"))
    data, cache = root / "data", root / "cache"
    app = AppProcess(data, cache).start()
    client = client_for(app)
    ids = []
    for prompt in prompts():
        client.predict("", api_name="/new_chat")
        client.predict(prompt, **SETTINGS, api_name="/chat")
        ids.append(client.predict("", api_name="/new_chat")[LISTED]["choices"][0][1])
    client.close()
    app.stop()
    rows = []
    for repeat in range(args.repeats):
        for way in ("restarted", "emptied") if repeat % 2 == 0 else ("emptied", "restarted"):
            used = cache if way == "restarted" else root / f"empty-{repeat}"
            shutil.rmtree(root / f"empty-{repeat}", ignore_errors=True)
            app = AppProcess(data, used).start()
            time.sleep(5)  # the restarted pair reads its newest states back in meanwhile
            ttft, prompt, reused = follow_up(app, ids[1])
            app.stop()
            take_back(data, ids[1])
            rows.append({"way": way, "repeat": repeat, "ttft_s": ttft, "prompt": prompt, "reused": reused})
            print(f"{way:9} ttft {ttft:.2f} s, prompt {prompt} tokens, {reused} reused", flush=True)
    warm = [r["ttft_s"] for r in rows if r["way"] == "restarted"]
    cold = [r["ttft_s"] for r in rows if r["way"] == "emptied"]
    share = statistics.median(warm) / statistics.median(cold)
    print(f"restarted / emptied, median time to first token: {share:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "share": share}, indent=2))
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Conversations taking turns on a real ``edgespec serve``, over loopback with the openai
client: a returning conversation reads only its new tokens (``cached_tokens``), its answer
is the one it would have had anyway, and after a restart with ``--cache-dir`` it is still
warm."""

from __future__ import annotations

import pytest

from tests.server_fixtures import Server, serve

pytestmark = [pytest.mark.slow, pytest.mark.needs_models]

OPENINGS = {
    "code": "\n".join(f"def handler_{i}(event):\n    return event.get('k{i}', {i})\n" for i in range(5)),
    "notes": "\n".join(f"- meeting {i}: decided to move item {i * 7} to sprint {i % 5}" for i in range(5)),
}


# What a returning turn reads anew: its question and the template around it, and the last
# answer where its text tokenizes otherwise than it was generated.
NEW_TOKENS = 64


def turn(server: Server, history: list[dict], question: str) -> tuple[str, int, int]:
    """One turn: the answer, the prompt's tokens and how many of them were cached."""
    history.append({"role": "user", "content": question})
    answer = server.client().chat.completions.create(
        model="default", messages=history, max_tokens=6, temperature=0, extra_body={"drafter": "none"}
    )
    text = answer.choices[0].message.content
    history.append({"role": "assistant", "content": text})
    usage = answer.usage
    return text, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


def test_returning_conversations_are_read_from_the_cache_and_survive_a_restart(tmp_path):
    chats = {name: [] for name in OPENINGS}
    with serve("--cache-dir", str(tmp_path)) as server:
        for name, text in OPENINGS.items():
            _, prompt, cached = turn(server, chats[name], f"{text}\n\nSummarise this in one line.")
            assert cached < prompt / 2  # cold: at most the template's header is shared
        for name in OPENINGS:  # each comes back after the other one ran
            _, prompt, cached = turn(server, chats[name], "And the first item?")
            assert cached >= prompt - NEW_TOKENS, (name, prompt, cached)
    with serve("--cache-dir", str(tmp_path)) as restarted:
        for name in OPENINGS:
            _, prompt, cached = turn(restarted, chats[name], "And the last item?")
            assert cached >= prompt - NEW_TOKENS, (name, prompt, cached)

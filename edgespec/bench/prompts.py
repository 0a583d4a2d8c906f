"""One representative prompt per category, all from the corpus's dev half.

For quick checks (tests, examples) that want a realistic request of each kind without
running the whole corpus; the benchmark itself runs ``bench.corpus``. Only dev prompts are
used, so that tuning against these never touches the test half the figures come from. (An
agent prompt is a conversation with tools, not a text: that category has none here.)
"""

from __future__ import annotations

from edgespec.bench.corpus import BY_ID

REPRESENTATIVE: dict[str, str] = {
    "code writing": "write-py-runlength-1",
    "code editing": "edit-rename-py-1",
    "code completion": "complete-py-duration-1",
    "summarization": "sum-release-tidewater-3",
    "rag": "rag-lighthouse-1",
    "open chat": "chat-advice-trip-1",
    "translation": "translate-en-fr-museum-1",
    "math reasoning": "math-bakery-1",
    "structured": "json-extract-jobpost-1",
    "short": "short-git-undo-1",
}

PROMPTS: dict[str, str] = {category: BY_ID[pid].text for category, pid in REPRESENTATIVE.items()}

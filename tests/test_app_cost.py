"""The app-cost benchmark's bookkeeping, model-free: the decode rate is read from the
app's own stats table as the browser shows it, and the figures compare like with like."""

from __future__ import annotations

import re
import tomllib

import pytest

from edgespec.decoding.events import Stats
from edgespec.ui.text import final_stats_markdown
from lab.app_cost import DECODE, EDITS, Pairing, edit_prompts


def test_the_decode_rate_is_read_from_the_stats_the_app_shows() -> None:
    stats = Stats(tokens=161, target_passes=160, wall_s=8.0, ttft_s=1.5, prompt_tokens=90)
    shown = final_stats_markdown(stats, "max_tokens")
    found = DECODE.search(shown)
    assert found is not None and float(found.group(1)) == pytest.approx(
        stats.decode_tokens_per_second, abs=0.05
    )


def test_ratios_are_per_repeat_and_of_the_bests() -> None:
    row = Pairing("none", cli=[25.0, 20.0], app=[20.0, 19.0]).summary()
    assert row["best_cli"] == 25.0 and row["best_app"] == 20.0
    assert row["ratio_of_bests"] == 0.8
    assert row["ratios"] == [0.8, 0.95] and row["spread"] == 0.15
    assert Pairing("auto", cli=[10.0], app=[12.0]).summary()["spread"] == 0.0


def test_the_private_edits_are_distinct_renames_enough_for_twelve_repeats() -> None:
    """Each answer asks another edit, so that the app cannot draft one from its own earlier
    answer: 12 repeats of two drafters ask none twice."""
    edits = tomllib.loads(EDITS.read_text())["edit"]
    prompts = edit_prompts()
    assert len(set(prompts)) == len(prompts) >= 24
    for edit in edits:
        assert re.search(rf"\b{re.escape(edit['old'])}\b", edit["code"]), edit["old"]
        assert not re.search(rf"\b{re.escape(edit['new'])}\b", edit["code"]), edit["new"]
